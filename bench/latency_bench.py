"""`raftka bench latency`: end-to-end latency, producer to consumer, through a local cluster.

What one run measures: one producer process sends `--rate` records/s of
`--record-size` bytes to a fresh topic, for `--warmup` seconds and then
`--duration` seconds; one consumer process, assigned every partition from
offset 0 before the producer starts, receives them. Each record carries
the time it was due to be sent (CLOCK_MONOTONIC, which every process on
the host shares) and its phase; the consumer records, for every
measured-phase record, receive time minus that stamp into a
`LatencyHistogram`.

The stamp is the *intended* send time (record i is due at start + i/rate),
not the time produce() ran: if the producer falls behind, the delay counts
against the system, as HdrHistogram's coordinated-omission correction does
(Gil Tene, "How NOT to Measure Latency").

Reported: e2e latency p50, p95, p99, p99.9, max and mean (ms), every
measured record's latency kept as raw samples, the rate achieved, and the
records lost (produced but never received).
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from typing import Any

from bench.runner import Runner, add_run_options, parse_sets

SCENARIO = "latency"
TOPIC = "bench-latency"
STAMP = struct.Struct(">qB")  # intended send time (monotonic ns), phase
WARMUP, MEASURE = 0, 1
GRACE_S = 30.0


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="end-to-end latency (producer -> consumer) p50..p99.9 and max",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=1000, help="records/s the producer sends (default 1000)")
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="measured seconds (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, metavar="S", help="warm-up seconds, not measured (default 2)")
    p.add_argument("--record-size", type=int, default=100, metavar="BYTES", help="value bytes (default 100, min 9)")
    p.add_argument("--partitions", type=int, default=1, help="partitions of the topic (default 1)")
    p.add_argument("--replication-factor", type=int, default=1, help="default 1")
    p.add_argument("--acks", default="1", choices=("0", "1", "all"), help="default 1")
    p.add_argument("--linger-ms", type=int, default=0, help="producer linger.ms (default 0: send at once)")
    add_run_options(p, controllers=1, brokers=1)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.histogram import LatencyHistogram
    from bench.kafka_bench import create_topic
    from bench.load_generator import interval_percentiles, run_workers
    from bench.proc_stats import CpuSampler

    if args.rate < 1 or args.duration <= 0 or args.warmup < 0 or args.record_size < STAMP.size:
        raise SystemExit(f"raftka bench latency: --rate and --duration must be positive, --warmup >= 0, "
                         f"--record-size >= {STAMP.size}")
    params = {"rate": args.rate, "duration_s": args.duration, "warmup_s": args.warmup,
              "record_size": args.record_size, "partitions": args.partitions,
              "replication_factor": args.replication_factor, "acks": args.acks, "linger_ms": args.linger_ms,
              "brokers": args.brokers, "controllers": args.controllers}
    warm, measured = round(args.rate * args.warmup), round(args.rate * args.duration)
    with Runner(SCENARIO, args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=parse_sets(args.set))
        create_topic(cluster.bootstrap, TOPIC, args.partitions, args.replication_factor)
        common = {"topic": TOPIC, "bootstrap": cluster.bootstrap, "partitions": args.partitions,
                  "warmup": warm, "measured": measured}
        specs = [
            {**common, "role": "consumer", "timeout_s": args.warmup + args.duration + GRACE_S},
            {**common, "role": "producer", "rate": args.rate, "record_size": args.record_size,
             "config": {"acks": args.acks, "linger.ms": args.linger_ms}},
        ]
        runner.phase("warm-up", f"{warm:,} records at {args.rate:,}/s, then measure {measured:,} records")
        with runner.progress("records received") as progress:
            task = progress.add_task("warm-up", total=warm + measured)

            def on_progress(n: int) -> None:
                progress.update(task, completed=n, description="warm-up" if n < warm else "measure")

            # Broker CPU every second while the records flow, for the report's series.
            sampler = CpuSampler(cluster)
            try:
                results = {r["role"]: r for r in run_workers(latency_worker, specs, on_start=sampler.start,
                                                             on_progress=on_progress)}
            finally:
                sampler.stop()
        consumer, producer = results["consumer"], results["producer"]
        histogram = LatencyHistogram()
        histogram.record_many(consumer["latencies_ms"])
        lost = warm + measured - consumer["records"]
        runner.row("records_lost", lost, "records")
        runner.row("delivery_failures", producer["failed"], "records")
        runner.row("produce_rate_achieved", producer["sent"] / max(producer["elapsed_s"], 1e-9), "records/s")
        if histogram.count:
            summary = histogram.summary()
            for key in ("p50", "p95", "p99", "p99_9", "max", "mean"):
                runner.row(f"e2e_latency_{key}", summary[key], "ms")
            runner.samples("e2e_latency", "ms", consumer["latencies_ms"])
            # Per second of the measured phase (from the first measured record's due time, on the
            # machine-wide monotonic clock every process shares): the latency of the records due in
            # that second, and the brokers' CPU.
            measured_start = min(consumer["due_s"])
            by_second = interval_percentiles(measured_start, consumer["due_s"], consumer["latencies_ms"])
            runner.series("e2e_latency_p50", "ms", by_second[50.0])
            runner.series("e2e_latency_p99", "ms", by_second[99.0])
            runner.series("broker_cpu_cores", "cores", sampler.series("brokers", since=measured_start))
            runner.table(f"end-to-end latency: {args.rate:,} records/s of {args.record_size} B, acks={args.acks}, "
                         f"{args.partitions} partition(s), RF {args.replication_factor}",
                         [(k, f"{summary[k]:.2f} ms", "") for k in ("p50", "p95", "p99", "p99_9", "max", "mean")]
                         + [("measured records", f"{histogram.count:,}", f"{lost:,} lost"),
                            ("errors", str(producer["errors"] + consumer["errors"]), "")])
        runner.finish()
    return 0 if lost == 0 and producer["failed"] == 0 and histogram.count else 1


def latency_worker(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    """One load-generator process (see `bench.load_generator.run_workers`): the producer or the consumer."""
    if spec["role"] == "producer":
        _produce(spec, ready, start, results)
    else:
        _consume(spec, ready, start, counter, results)


def _produce(spec: dict[str, Any], ready: Any, start: Any, results: Any) -> None:
    from confluent_kafka import Producer

    failed, errors = [0], []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed[0] += 1
            if len(errors) < 5:
                errors.append(str(err))

    producer = Producer({"bootstrap.servers": spec["bootstrap"], "on_delivery": on_delivery, **spec["config"]})
    producer.list_topics(spec["topic"], timeout=30)
    padding = os.urandom(spec["record_size"] - STAMP.size)
    total = spec["warmup"] + spec["measured"]
    interval_ns = 1_000_000_000 // spec["rate"]
    ready.put(os.getpid())
    start.wait()
    t0 = time.monotonic_ns()
    for i in range(total):
        due = t0 + i * interval_ns
        while (wait_ns := due - time.monotonic_ns()) > 0:
            producer.poll(wait_ns / 1e9)
        value = STAMP.pack(due, WARMUP if i < spec["warmup"] else MEASURE) + padding
        while True:
            try:
                producer.produce(spec["topic"], value, partition=i % spec["partitions"])
                break
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    unsent = producer.flush(60)
    elapsed_s = (time.monotonic_ns() - t0) / 1e9
    results.put({"role": "producer", "sent": total, "failed": failed[0] + unsent, "errors": errors,
                 "elapsed_s": elapsed_s, "records": 0, "start": t0 / 1e9, "end": t0 / 1e9 + elapsed_s,
                 "cpu_s": 0.0, "latencies_ms": []})


def _consume(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": "bench-latency",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    # Explicit offset 0 of a fresh topic: no ListOffsets to resolve, every record is read.
    consumer.assign([TopicPartition(spec["topic"], p, 0) for p in range(spec["partitions"])])
    consumer.consume(num_messages=1, timeout=0.5)  # connect before the producer starts
    total = spec["warmup"] + spec["measured"]
    ready.put(os.getpid())
    start.wait()
    deadline = time.monotonic() + spec["timeout_s"]
    latencies_ms: list[float] = []
    due_s: list[float] = []  # when each measured record was due (monotonic s): the series' clock
    got = 0
    errors: list[str] = []
    unpack, now_ns = STAMP.unpack_from, time.monotonic_ns
    while got < total and time.monotonic() < deadline:
        # poll() returns as soon as a record is there (consume() waits to fill its batch
        # or its timeout); then take what else has arrived without waiting.
        first = consumer.poll(0.05)
        received_ns = now_ns()
        if first is None:
            continue
        for m in [first, *consumer.consume(num_messages=1000, timeout=0)]:
            if m.error() is not None:
                if len(errors) < 5:
                    errors.append(str(m.error()))
                continue
            got += 1
            due_ns, phase = unpack(m.value())
            if phase == MEASURE:
                latencies_ms.append(max(0, received_ns - due_ns) / 1e6)
                due_s.append(due_ns / 1e9)
        counter.value = got
    consumer.close()
    results.put({"role": "consumer", "records": got, "failed": len(errors), "errors": errors,
                 "latencies_ms": latencies_ms, "due_s": due_s, "start": 0.0, "end": 0.0, "cpu_s": 0.0})
