"""`raftka bench mirror`: what `raftka mirror` copies per second, and its lag, beside plain clients.

One run: two fresh local clusters (`--mode`, one controller and one broker
each by default), a source topic of `--partitions` with
`message.timestamp.type=LogAppendTime` (so a record's timestamp is its
source append time), then four phases, each with one client process
(this one), so that the figures compare like with like:

1. produce: `--count` records of `--record-size` bytes to the source
   (acks=all, idempotent), records/s;
2. consume: the same records read back from the source (assign, no group),
   records/s;
3. produce to the target: `--count` records to a plain target topic,
   records/s;
4. mirror backlog: a mirror flow (the code `raftka mirror` runs, in a
   thread) copies the filled topic; records/s and MB/s from its first
   acknowledged record to its last;
5. mirror lag: a producer writes `--rate` records/s to the source for
   `--seconds` while the mirror runs; the lag of each record from its
   source append to the target's acknowledgement, p50/p99, and the rate
   the paced producer kept (`lag_phase_produce_records_per_s`). The lag
   starts at the source append (LogAppendTime), not at the producer, so a
   producer that falls behind its schedule lowers the offered rate (seen in
   that row) rather than hiding latency: no coordinated omission to correct.

Rows: produce/consume/target_produce/mirror `*_records_per_s`,
`mirror_mb_per_s`, `mirror_over_plain` (mirror records/s over the slower of
the plain consume and target produce), `mirror_lag_p50_ms`,
`mirror_lag_p99_ms`; the lag samples go beside them for `raftka report`.
"""

from __future__ import annotations

import argparse
import threading
import time

from bench.kafka_bench import MB, emit, row

SCENARIO = "mirror"
TOPIC = "bench-mirror"


def register(scenarios: argparse._SubParsersAction) -> None:
    from bench.cli import add_common_options

    p = scenarios.add_parser("mirror", help="raftka mirror's throughput and lag beside plain produce/consume",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200_000, metavar="N", help="records per phase (default 200,000)")
    p.add_argument("--record-size", type=int, default=100, metavar="BYTES", help="value bytes (default 100)")
    p.add_argument("--partitions", type=int, default=3, help="partitions of the topics (default 3)")
    p.add_argument("--rate", type=int, default=2000, help="records/s written during the lag phase (default 2000)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the lag phase (default 10)")
    p.add_argument("--mode", choices=("kraft", "zk"), default="kraft", help="metadata mode of both clusters")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a broker config key")
    p.add_argument("--dir", default=None, help="where the clusters' temp dir goes")
    add_common_options(p)
    p.set_defaults(func=run)


def _produce(bootstrap: str, topic: str, count: int, size: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    value = b"x" * size
    t0 = time.monotonic()
    for i in range(count):
        while True:
            try:
                p.produce(topic, value=value, key=str(i % 1000).encode())
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120):
        raise RuntimeError(f"records to {topic} not acknowledged within 120 s")
    return count / (time.monotonic() - t0)


def _consume(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-mirror-plain", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got, t0 = 0, time.monotonic()
    deadline = t0 + 300
    while got < count and time.monotonic() < deadline:
        got += sum(1 for m in c.consume(1000, 0.5) if m.error() is None)
    elapsed = time.monotonic() - t0
    c.close()
    return got / elapsed


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer
    from rich.console import Console
    from rich.table import Table

    from bench.histogram import percentiles
    from bench.kafka_bench import create_topic
    from bench.runner import Runner
    from common.config import parse_overrides
    from mirror import config as mirror_config
    from mirror.worker import Flow

    console = Console(stderr=args.json)
    params = {"count": args.count, "record_size": args.record_size, "partitions": args.partitions,
              "rate": args.rate, "seconds": args.seconds}
    overrides = {"offsets.topic.replication.factor": "1", **parse_overrides(args.set)}
    with Runner(SCENARIO, args, params, console) as runner:
        src = runner.cluster(controllers=1, brokers=1, overrides=overrides).bootstrap
        tgt = runner.cluster(controllers=1, brokers=1, overrides=overrides).bootstrap
        args.environment = runner.env
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": src})
        admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config={
            "message.timestamp.type": "LogAppendTime"})])[TOPIC].result(60)
        create_topic(tgt, "bench-plain", args.partitions, 1)
        with console.status("produce to the source"):
            produce_rps = _produce(src, TOPIC, args.count, args.record_size)
        with console.status("consume from the source"):
            consume_rps = _consume(src, TOPIC, args.partitions, args.count)
        with console.status("produce to the target"):
            target_rps = _produce(tgt, "bench-plain", args.count, args.record_size)

        (flow,) = mirror_config.simple(src, tgt, TOPIC, **{"emit.heartbeats.enabled": "false",
                                                            "emit.checkpoints.interval.seconds": "5"})
        stop = threading.Event()
        worker = Flow(flow, stop, say=lambda line: console.print(line, markup=False, highlight=False))
        worker.ack_lag_ms = []
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            with console.status("mirror the backlog"):
                deadline = time.monotonic() + 600
                while worker.stats.mirrored == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                t0 = time.monotonic()
                while worker.stats.mirrored < args.count and time.monotonic() < deadline:
                    time.sleep(0.01)
                mirror_elapsed = time.monotonic() - t0
                mirrored = worker.stats.mirrored
            mirror_rps = mirrored / mirror_elapsed
            worker.ack_lag_ms = []
            with console.status(f"mirror lag at {args.rate} records/s for {args.seconds:.0f} s"):
                p = Producer({"bootstrap.servers": src, "acks": "all", "linger.ms": 1})
                n = int(args.rate * args.seconds)
                start = time.monotonic()
                for i in range(n):
                    delay = start + i / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    p.produce(TOPIC, value=b"x" * args.record_size, key=str(i % 1000).encode())
                    p.poll(0)
                p.flush(60)
                # The lag is timed from each record's source append, not from when the paced
                # producer meant to send it: the rate it kept says whether it fell behind.
                lag_rate = n / max(time.monotonic() - start, 1e-9)
                wait_until = time.monotonic() + 60
                while worker.stats.mirrored < args.count + n and time.monotonic() < wait_until:
                    time.sleep(0.05)
            lags = list(worker.ack_lag_ms)
        finally:
            stop.set()
            thread.join(60)
    lag = percentiles(lags, (50, 99)) if lags else {"p50": float("nan"), "p99": float("nan")}
    plain = min(consume_rps, target_rps)
    rows = [
        row(SCENARIO, params, "produce_records_per_s", produce_rps, "records/s"),
        row(SCENARIO, params, "consume_records_per_s", consume_rps, "records/s"),
        row(SCENARIO, params, "target_produce_records_per_s", target_rps, "records/s"),
        row(SCENARIO, params, "mirror_records_per_s", mirror_rps, "records/s"),
        row(SCENARIO, params, "mirror_mb_per_s", mirror_rps * args.record_size / MB, "MB/s"),
        row(SCENARIO, params, "mirror_over_plain", mirror_rps / plain, "ratio"),
        row(SCENARIO, params, "mirror_lag_p50_ms", lag["p50"], "ms"),
        row(SCENARIO, params, "mirror_lag_p99_ms", lag["p99"], "ms"),
        row(SCENARIO, params, "lag_phase_produce_records_per_s", lag_rate, "records/s"),
    ]
    table = Table(title=f"mirror: {args.count:,} records of {args.record_size} B, {args.partitions} partitions, "
                        f"mode {args.mode}")
    table.add_column("")
    table.add_column("records/s", justify="right")
    table.add_column("note")
    table.add_row("produce to the source", f"{produce_rps:,.0f}", "one idempotent producer, acks=all")
    table.add_row("consume from the source", f"{consume_rps:,.0f}", "one consumer, assign")
    table.add_row("produce to the target", f"{target_rps:,.0f}", "")
    table.add_row("mirror", f"{mirror_rps:,.0f}", f"{mirror_rps * args.record_size / MB:,.1f} MB/s, "
                  f"{mirror_rps / plain:.2f}× the slower plain side")
    table.add_row("mirror lag p50 / p99", f"{lag['p50']:,.0f} / {lag['p99']:,.0f} ms",
                  f"source append to target ack, at {args.rate} records/s ({len(lags):,} records)")
    console.print(table)
    emit(args, console, rows, {"mirror_lag_ms": lags}, SCENARIO, params)
    return 0 if mirrored >= args.count else 1
