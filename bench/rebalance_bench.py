"""`raftka bench rebalance`: how long a consumer joining a group stops the others.

N librdkafka consumers (threads of this process) share a topic of P
partitions; once they have split it, one more joins. Measured, per
protocol:

- `join_to_split_s`: from the new consumer's start until every partition
  is owned again and the newcomer owns some;
- `kept_pause_s`: the longest pause of any member: its longest wait
  between two records from the partitions it owned both before and after
  the join, while a producer writes a record every 2 ms round robin over
  the partitions in a shuffled order (with many partitions a single
  partition's records are far apart, so a member's kept partitions are
  taken together). With
  `classic` (librdkafka's eager `range` assignor) every member gives up
  everything for the rebalance; with `consumer` (KIP-848, the broker
  assigns) kept partitions stay;
- `steady_pause_s`: the longest pause of any member over the 2.5 s
  before the join: what the machine gives a member without a rebalance,
  the floor of `kept_pause_s`.

Both heartbeat every 300 ms (the classic consumers' `heartbeat.interval.ms`,
the broker's `group.consumer.heartbeat.interval.ms`, set unless `--set`
gives it): a member learns of a rebalance at its next heartbeat.
`--protocol both` (the default) runs classic then consumer on the same
cluster (a group each) and prints the classic/consumer ratio of both
figures.
"""

from __future__ import annotations

import argparse
import itertools
import random
import threading
import time
import uuid

from bench.kafka_bench import (
    add_cluster_options,
    bench_cluster,
    emit,
    resolve_brokers,
    row,
)

TOPIC = "bench-rebalance"
SAMPLE_S = 0.005
#: One record every 2 ms, round robin over the partitions.
FEED_INTERVAL_S = 0.002
TIMEOUT_S = 120.0
#: The window before the join whose longest pause is the baseline.
STEADY_S = 2.5


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser("rebalance", help="pause of a group's consumers when one more joins, classic vs consumer",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", choices=("classic", "consumer", "both"), default="both",
                   help="group.protocol of the consumers (default both: classic, then consumer)")
    p.add_argument("--members", type=int, default=3, help="consumers before one more joins (default 3)")
    add_cluster_options(p)
    p.set_defaults(func=run, partitions=12)


def _member(bootstrap: str, group: str, protocol: str, stop: threading.Event, owned: dict, name: str,
            delivered: dict) -> None:
    from confluent_kafka import Consumer

    config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "auto.offset.reset": "latest"}  # not the records of a run before this one
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config.update({"session.timeout.ms": 10_000, "heartbeat.interval.ms": 300})
    consumer = Consumer(config)
    consumer.subscribe([TOPIC])
    mine = delivered.setdefault(name, [])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.02)
            if msg is not None and msg.error() is None:
                mine.append((time.monotonic(), msg.partition()))
            owned[name] = frozenset(tp.partition for tp in consumer.assignment())
    finally:
        consumer.close()


def measure(bootstrap: str, protocol: str, members: int, partitions: int) -> dict[str, float]:
    group = f"rebalance-{protocol}-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    owned: dict[str, frozenset] = {}
    delivered: dict[str, list] = {}
    names = [f"m{i}" for i in range(members)]
    threads = []

    def start(name: str) -> None:
        t = threading.Thread(target=_member, args=(bootstrap, group, protocol, stop, owned, name, delivered), daemon=True)
        t.start()
        threads.append(t)

    def split(ns: list[str]) -> bool:
        parts = sorted(p for n in ns for p in owned.get(n, ()))
        return all(owned.get(n) for n in ns) and parts == list(range(partitions))

    def until(cond) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {protocol} group did not split {partitions} partitions in {TIMEOUT_S:.0f} s: "
                                   f"{ {n: sorted(p) for n, p in owned.items()} }")
            time.sleep(SAMPLE_S)

    def feed() -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        # Partitions in a shuffled order: an assignor gives a member a block of
        # neighbours, and in plain order the block would get records only in
        # its own slice of each round.
        order = random.Random(partitions).sample(range(partitions), partitions)
        i = 0
        while not stop.is_set():
            producer.produce(TOPIC, value=b"x", partition=order[i % partitions])
            producer.poll(0)
            i += 1
            time.sleep(FEED_INTERVAL_S)
        producer.flush(10)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    threads.append(feeder)
    try:
        for n in names:
            start(n)
        until(lambda: split(names))
        time.sleep(STEADY_S + 0.5)  # settled; the last STEADY_S seconds are the baseline
        before = {n: owned[n] for n in names}
        joined = time.monotonic()
        start("new")
        while not split(names + ["new"]):
            if time.monotonic() - joined > TIMEOUT_S:
                raise RuntimeError(f"the {protocol} group did not take in a new member in {TIMEOUT_S:.0f} s")
            time.sleep(SAMPLE_S)
        done = time.monotonic()
        after = {n: owned[n] for n in names}
        time.sleep(1.0)  # deliveries after the split close the last gaps
        # Each member's longest wait between two records of the partitions it kept,
        # across the join (they arrive every few ms while nothing stops it).
        pause = steady = 0.0
        end = time.monotonic()
        for n in names:
            kept = before[n] & after[n]
            got = [when for when, partition in list(delivered.get(n, ())) if partition in kept]
            times = [when for when in got if when >= joined - 0.5]
            # A member that got nothing since the join waited until now.
            pause = max([pause] + [b - a for a, b in itertools.pairwise([*times, end])])
            # The same member's longest wait before anyone joined: what the machine gives without a rebalance.
            quiet = [when for when in got if joined - STEADY_S <= when < joined]
            steady = max([steady] + [b - a for a, b in itertools.pairwise([joined - STEADY_S, *quiet, joined])])
        return {"join_to_split_s": done - joined, "kept_pause_s": pause, "steady_pause_s": steady}
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=args.json)
    if args.members < 1 or args.partitions <= args.members:
        console.print("raftka bench rebalance: --members must be at least 1 and below --partitions")
        return 2
    resolve_brokers(args)
    # The groups need __consumer_offsets, which by default wants 3 replicas.
    if not any(s.startswith("offsets.topic.replication.factor=") for s in args.set):
        args.set.append(f"offsets.topic.replication.factor={min(3, args.brokers)}")
    # Both protocols heartbeat every 300 ms (the classic consumers are set
    # so): a member learns of a rebalance at its next heartbeat.
    if not any(s.startswith("group.consumer.heartbeat.interval.ms=") for s in args.set):
        args.set.append("group.consumer.heartbeat.interval.ms=300")
    protocols = ["classic", "consumer"] if args.protocol == "both" else [args.protocol]
    params = {"members": args.members, "partitions": args.partitions, "brokers": args.brokers}
    rows = []
    figures: dict[str, dict[str, float]] = {}
    with bench_cluster(args, console, TOPIC) as bc:
        for protocol in protocols:
            figures[protocol] = got = measure(bc.bootstrap, protocol, args.members, args.partitions)
            console.print(f"{protocol}: one more member with {args.members} over {args.partitions} partitions: "
                          f"split again after {got['join_to_split_s']:.2f} s; kept partitions paused "
                          f"{got['kept_pause_s']:.2f} s at most (without a join: {got['steady_pause_s']:.2f} s)")
            for metric, value in got.items():
                rows.append(row("rebalance", {**params, "protocol": protocol}, metric, value, "s"))
    if len(figures) == 2:
        c, k = figures["classic"], figures["consumer"]
        console.print(f"classic/consumer: join-to-split {c['join_to_split_s'] / max(k['join_to_split_s'], 1e-3):.1f}x, "
                      f"kept-partition pause {c['kept_pause_s']:.2f} s vs {k['kept_pause_s']:.2f} s")
    emit(args, console, rows, {}, "rebalance", params)
    return 0
