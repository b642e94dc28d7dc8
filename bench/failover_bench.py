"""`raftka bench failover`: partition leader failover when a broker dies.

What one run measures: a fresh cluster (default 1 controller, 3 brokers),
a topic of `--partitions` partitions with replication factor
`--replication-factor` (default 3: a leader can only move to another
replica). Warm-up: records are produced to every partition until each has
acknowledged one (`--warmup` seconds at least). Then the broker that leads
the most partitions gets `--fault` (kill: SIGKILL; stop: SIGSTOP, a frozen
process with open sockets; term: SIGTERM, a controlled shutdown), and, from
the instant before the signal, two clocks run per former partition:

- **metadata**: until a surviving broker's Metadata answer names a new,
  live leader (every surviving broker polled every 10 ms);
- **produce**: until a Produce request of one record (acks `--acks`) is
  answered without error by some surviving broker (each polled every
  10 ms): the partition takes writes again;
- **client**: until a record handed to confluent-kafka right after the
  fault is acknowledged (short retry backoffs, 60 s message timeout): what
  an application sees. librdkafka re-queries a leaderless partition's
  metadata on its 1 s topic scan, so this clock moves in ~1 s steps.

With kill and stop, the controller learns of the failure only when the
broker's session expires (`broker.session.timeout.ms`, Kafka's default
9000 ms; set it with `--set`), so it bounds both clocks from below.
Reported: max, median and min of each clock over the partitions, every
partition's time as raw samples, and the partitions that got no new leader
within `--timeout`. With `--rounds N` the victim is brought back after each
round and the next round faults the leader of the most partitions again.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.runner import BenchError, Runner, add_run_options, parse_sets

SCENARIO = "failover"
TOPIC = "bench-failover"
POLL_S = 0.01


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="partition leader failover: kill -9 a broker, time until produce works",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=6, help="partitions of the topic (default 6)")
    p.add_argument("--replication-factor", type=int, default=3, help="default 3")
    p.add_argument("--fault", choices=("kill", "stop", "term"), default="kill", help="what the leader gets (default kill)")
    p.add_argument("--acks", choices=("1", "all"), default="1", help="acks of the probe records (default 1)")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S", help="seconds of warm-up produce (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="faults per run (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up on a partition after S s")
    add_run_options(p, controllers=1, brokers=3)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.replication_factor < 2 or args.brokers < args.replication_factor or args.rounds < 1:
        raise SystemExit("raftka bench failover: leader failover needs --replication-factor >= 2 and at least "
                         "that many --brokers, and --rounds >= 1")
    overrides = parse_sets(args.set)
    params = {"partitions": args.partitions, "replication_factor": args.replication_factor, "fault": args.fault,
              "acks": args.acks, "brokers": args.brokers, "controllers": args.controllers,
              "broker_session_timeout_ms": int(overrides.get("broker.session.timeout.ms", 9000))}
    stuck = 0
    with Runner(SCENARIO, args, params) as runner:
        from bench.kafka_bench import create_topic

        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=overrides)
        create_topic(cluster.bootstrap, TOPIC, args.partitions, args.replication_factor)
        runner.phase("warm-up", f"produce to all {args.partitions} partitions")
        _produce_to_all(cluster.bootstrap, list(range(args.partitions)), args.acks, args.warmup, args.timeout)
        for round_no in range(args.rounds):
            leaders = runner.trio_run(_leaders, cluster, None)
            victim = max(sorted(set(leaders.values())), key=lambda b: list(leaders.values()).count(b))
            moved = sorted(p for (_, p), leader in leaders.items() if leader == victim)
            runner.phase("measure", f"round {round_no + 1}/{args.rounds}: {args.fault} broker {victim}, "
                                    f"leader of {len(moved)} partition(s)")
            client = _ClientProbe(cluster.bootstrap, args.acks)
            t0 = runner.inject(cluster, victim, args.fault)
            client.send(moved, t0)
            clocks = runner.trio_run(_watch, cluster, victim, moved, args.acks, t0, args.timeout)
            clocks["client"] = client.wait(t0 + args.timeout)
            produce_s = clocks["produce"]
            stuck += len(moved) - len(produce_s)
            for clock, times in clocks.items():
                values = [times[p] * 1000 for p in moved if p in times]
                if values:
                    runner.row(f"leader_failover_{clock}_ms_max", max(values), "ms")
                    runner.row(f"leader_failover_{clock}_ms_median", statistics.median(values), "ms")
                    runner.row(f"leader_failover_{clock}_ms_min", min(values), "ms")
                    runner.samples(f"leader_failover_{clock}", "ms", values)
            runner.row("partitions_without_leader", len(moved) - len(produce_s), "partitions")
            runner.table(f"round {round_no + 1}: {args.fault} broker {victim} (ms after the signal)", [
                (f"partition {p}", _ms(clocks["metadata"], p), f"produce {_ms(produce_s, p)}, "
                                                               f"client {_ms(clocks['client'], p)}") for p in moved],
                         columns=("", "metadata", "then"))
            if round_no + 1 < args.rounds:
                runner.restart(cluster, victim)
        runner.finish()
    return 0 if stuck == 0 else 1


async def _leaders(cluster: Any, exclude: int | None) -> dict[tuple[str, int], int]:
    from bench.cluster_probes import PROBE_ERRORS, topic_partitions

    for b in cluster.brokers:
        if b.node_id != exclude and b.is_running():
            try:
                return await topic_partitions(b.host, b.port, [TOPIC])
            except PROBE_ERRORS:
                continue
    raise BenchError("no broker answered Metadata")


def _ms(times: dict[int, float], partition: int) -> str:
    return f"{times[partition] * 1000:,.0f}" if partition in times else "none"


async def _watch(cluster: Any, victim: int, moved: list[int], acks: str, t0: float,
                 timeout_s: float) -> dict[str, dict[int, float]]:
    """Seconds from t0, per partition: until some surviving broker names a live leader other
    than the victim ("metadata"), and until one takes a produced record ("produce")."""
    import trio

    from bench.cluster_probes import PROBE_ERRORS, produce_one, topic_partitions

    clocks: dict[str, dict[int, float]] = {"metadata": {}, "produce": {}}
    survivors = [b for b in cluster.brokers if b.node_id != victim and b.is_running()]

    async def watch_metadata(broker: Any) -> None:
        seen = clocks["metadata"]
        while len(seen) < len(moved):
            try:
                leaders = await topic_partitions(broker.host, broker.port, [TOPIC], 1000)
            except PROBE_ERRORS:
                leaders = {}
            now = time.monotonic()
            for p in moved:
                leader = leaders.get((TOPIC, p), -1)
                if p not in seen and leader >= 0 and leader != victim:
                    seen[p] = now - t0
            await trio.sleep(POLL_S)

    async def watch_produce(broker: Any, partition: int) -> None:
        done = clocks["produce"]
        while partition not in done:
            try:
                if await produce_one(broker.host, broker.port, TOPIC, partition, acks=-1 if acks == "all" else 1,
                                     timeout_ms=1000) == 0:
                    done.setdefault(partition, time.monotonic() - t0)
            except PROBE_ERRORS:
                pass
            await trio.sleep(POLL_S)

    # trio's clock is not time.monotonic: the deadline is relative.
    with trio.move_on_after(max(0.0, t0 + timeout_s - time.monotonic())):
        async with trio.open_nursery() as nursery:
            for b in survivors:
                nursery.start_soon(watch_metadata, b)
                for p in moved:
                    nursery.start_soon(watch_produce, b, p)
    return clocks


class _ClientProbe:
    """One confluent-kafka record per partition, produced right after the fault."""

    def __init__(self, bootstrap: str, acks: str) -> None:
        from confluent_kafka import Producer

        self.acked: dict[int, float] = {}
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": acks, "message.timeout.ms": 60_000,
            "retry.backoff.ms": 10, "retry.backoff.max.ms": 100, "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 100, "log_level": 2,  # the dead broker's refused connections are expected
        })
        self.producer.list_topics(TOPIC, timeout=10)

    def send(self, partitions: list[int], t0: float) -> None:
        for p in partitions:
            sent_after_s = time.monotonic() - t0
            self.producer.produce(TOPIC, b"failover-probe", partition=p, on_delivery=self._on_delivery(p, sent_after_s))
        self.producer.poll(0)

    def _on_delivery(self, partition: int, sent_after_s: float) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is None:
                # latency(): produce() to acknowledgement, as librdkafka timed it.
                self.acked[partition] = sent_after_s + msg.latency()
        return done

    def wait(self, deadline: float) -> dict[int, float]:
        self.producer.flush(max(0.0, deadline - time.monotonic()))
        return dict(self.acked)


def _produce_to_all(bootstrap: str, partitions: list[int], acks: str, warmup_s: float, timeout_s: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5})
    acked: set[int] = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < warmup_s or len(acked) < len(partitions):
        for p in partitions:
            producer.produce(TOPIC, b"warm-up", partition=p,
                             on_delivery=lambda err, msg: err is None and acked.add(msg.partition()))
        producer.poll(0.05)
        if time.monotonic() - t0 > timeout_s:
            raise BenchError(f"warm-up: partitions {sorted(set(partitions) - acked)} acknowledged nothing in "
                             f"{timeout_s:.0f} s (acks={acks}); is replication running?")
    producer.flush(timeout_s)
