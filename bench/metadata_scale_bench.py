"""`raftka bench metadata-scale`: many partitions at once; a broker restart and its catch-up.

What one run measures, on a fresh cluster (default 3 controllers, 3
brokers):

1. **create**: one CreateTopics request, sent to the first broker, for
   `--topics` topics holding `--partitions` partitions in all (replication
   factor `--replication-factor`). Clocks from the send: until its answer
   (`create_topics_ms`: the controller committed them and that broker's
   image shows them), and, per broker, until its Metadata answer lists
   every partition with a leader (each broker polled every 20 ms);
   `metadata_propagation_ms` is the slowest broker: the time until every
   broker sees them.
   Creation goes in CreateTopics requests of at most 10,000 partitions
   (the controller's bound per request), one after the other.
2. **list, produce, consume**: one Metadata request listing every
   partition (`list_ms`); one record produced (acks=1) to each of
   `--sample` partitions picked at random, in Produce requests of 500
   partitions (`produce_ms`); those records read back by a
   confluent-kafka consumer assigned those partitions (`consume_ms`).
3. **restart**: the last broker gets `--restart-fault` (term: a controlled
   shutdown, timed as `broker_shutdown_ms`; kill: SIGKILL; both: term,
   then kill) and is started again at once. Clocks from the start: until
   it prints READY (`broker_restart_ready_ms`: log recovery and
   listeners), until another broker lists it as live
   (`broker_restart_unfenced_ms`: registered with the controller and
   caught up enough to be unfenced), and until its own Metadata answer
   shows every partition with a leader (`broker_catchup_ms`: its metadata
   image has caught up). After a SIGKILL the rows are named
   `broker_kill_restart_ready_ms`, `broker_kill_restart_unfenced_ms` and
   `broker_kill_catchup_ms`, and the sampled records are read back again
   (`kill_consume_ms`): every acknowledged record survived the crash.

`--partitions 10000,30000,100000` runs once per size, each on a fresh
cluster (`--topics` then defaults to one topic per 1,000 partitions), and
ends with a table of every clock at each size and its growth factor from
one size to the next, divided by the growth in partitions: 1.0 is linear,
below 1 is better than linear.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from typing import Any

from bench.runner import (
    BenchError,
    Runner,
    add_engine_option,
    add_run_options,
    engine_overrides,
    parse_sets,
)

SCENARIO = "metadata-scale"
POLL_S = 0.02
MAX_PER_REQUEST = 10_000
PRODUCE_CHUNK = 500


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="create N partitions, time until every broker sees them; "
                                            "broker restart and catch-up",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=_sizes, default=[1000], metavar="N[,N...]",
                   help="partitions created, in all (default 1000); a comma list runs once per size and "
                        "reports growth factors")
    p.add_argument("--topics", type=int, default=None,
                   help="topics they are spread over (default 10; with a list of sizes, one per 1,000 partitions)")
    p.add_argument("--replication-factor", type=int, default=1, help="default 1")
    p.add_argument("--restart-fault", choices=("term", "kill", "both", "none"), default="term",
                   help="how the restarted broker stops (default term; both: term, then kill; none skips the restart)")
    p.add_argument("--sample", type=int, default=2000,
                   help="partitions produced to and consumed from, at random (default 2000)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S s (default 300)")
    add_engine_option(p)
    add_run_options(p, controllers=3, brokers=3)
    p.set_defaults(func=run)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of partitions or a comma list, e.g. 10000,30000")
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: partitions must be at least 1")
    return sizes


def run(args: argparse.Namespace) -> int:
    sizes = args.partitions
    figures: dict[int, dict[str, float]] = {}
    for partitions in sizes:
        topics = args.topics if args.topics is not None else (10 if len(sizes) == 1 else max(1, partitions // 1000))
        if topics < 1 or partitions < topics:
            raise SystemExit("raftka bench metadata-scale: need --topics >= 1 and --partitions >= --topics")
        figures[partitions] = _run_one(args, partitions, topics)
    if len(sizes) > 1:
        _growth_table(args, figures)
    return 0


def _growth_table(args: argparse.Namespace, figures: dict[int, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    sizes = list(figures)
    metrics = [m for m in figures[sizes[0]] if all(m in figures[n] for n in sizes)]
    table = Table(title="metadata scale: each clock at each size, and its growth divided by the partitions' growth")
    table.add_column("clock")
    for n in sizes:
        table.add_column(f"{n:,}", justify="right")
    for a, b in itertools.pairwise(sizes):
        table.add_column(f"{a:,} -> {b:,} ({b / a:.3g}x)", justify="right")
    for metric in metrics:
        values = [figures[n][metric] for n in sizes]
        cells = [f"{v:,.0f} ms" for v in values]
        for (a, va), (b, vb) in itertools.pairwise(zip(sizes, values)):
            cells.append(f"{(vb / va) / (b / a):.2f}" if va > 0 else "-")
        table.add_row(metric, *cells)
    Console(stderr=True, width=200).print(table)


def _run_one(args: argparse.Namespace, partitions: int, topics: int) -> dict[str, float]:
    overrides = parse_sets(args.set)
    params = {"partitions": partitions, "topics": topics, "replication_factor": args.replication_factor,
              "brokers": args.brokers, "controllers": args.controllers, "restart_fault": args.restart_fault,
              "engine": engine_overrides(args, overrides)}
    per_topic = [partitions // topics + (i < partitions % topics) for i in range(topics)]
    faults = {"none": (), "both": ("term", "kill")}.get(args.restart_fault, (args.restart_fault,))
    with Runner(SCENARIO, args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=overrides)
        names = [f"scale-{runner.run_id[-8:]}-{i}" for i in range(topics)]
        runner.phase("warm-up", "one small topic through every broker's path")
        runner.trio_run(_create, cluster, [f"warm-up-{runner.run_id[-8:]}"], [1], 1, args.timeout, None)
        runner.phase("measure", f"create {partitions:,} partitions in {topics} topic(s)")
        with runner.progress("brokers see them all") as progress:
            task = progress.add_task("create", total=len(cluster.brokers))
            created = runner.trio_run(_create, cluster, names, per_topic, args.replication_factor, args.timeout,
                                      lambda n: progress.update(task, completed=n))
        seen = created["seen"]
        if len(seen) < len(cluster.brokers):
            raise BenchError(f"after {args.timeout:.0f} s only brokers {sorted(seen)} list every partition")
        runner.row("create_topics_ms", created["answered"] * 1000, "ms")
        runner.row("metadata_propagation_ms", max(seen.values()) * 1000, "ms")
        runner.samples("metadata_visible", "ms", [v * 1000 for v in seen.values()])
        lines = [("CreateTopics answered", f"{created['answered'] * 1000:,.0f} ms", f"by broker {cluster.brokers[0].node_id}")]
        lines += [(f"broker {b} lists them all", f"{seen[b] * 1000:,.0f} ms", "") for b in sorted(seen)]
        runner.phase("list, produce, consume", f"{min(args.sample, partitions):,} partitions at random")
        sample = random.Random(partitions).sample(
            [(name, p) for name, n in zip(names, per_topic) for p in range(n)], min(args.sample, partitions))
        used = runner.trio_run(_list_and_produce, cluster, names, partitions, sample, args.timeout)
        used["consume"] = _consume(cluster, sample, args.timeout)
        for metric, key, what in (("list_ms", "list", "Metadata lists every partition"),
                                  ("produce_ms", "produce", f"produce to {len(sample):,} partitions"),
                                  ("consume_ms", "consume", f"consume from {len(sample):,} partitions")):
            runner.row(metric, used[key] * 1000, "ms")
            lines.append((what, f"{used[key] * 1000:,.0f} ms", ""))
        victim = cluster.brokers[-1]
        for fault in faults:
            runner.phase("restart", f"{fault} broker {victim.node_id}, start it again")
            t_fault = runner.inject(cluster, victim.node_id, fault)
            if fault == "term":
                assert victim.process is not None
                victim.process.wait()
                runner.row("broker_shutdown_ms", (time.monotonic() - t_fault) * 1000, "ms")
                lines.append(("controlled shutdown", f"{(time.monotonic() - t_fault) * 1000:,.0f} ms", ""))
            t0 = time.monotonic()
            cluster.start(victim.node_id)
            restart = runner.trio_run(_restart, cluster, victim, names, partitions, t0, args.timeout, fault == "kill")
            prefix = "broker_kill_" if fault == "kill" and len(faults) > 1 else "broker_"
            after = "after SIGKILL " if fault == "kill" else ""
            for metric, key, what in ((f"{prefix}restart_ready_ms", "ready", "prints READY"),
                                      (f"{prefix}restart_unfenced_ms", "unfenced", "is listed live (unfenced)"),
                                      (f"{prefix}catchup_ms", "caught_up", "lists every partition")):
                if key not in restart:
                    raise BenchError(f"the restarted broker {victim.node_id} never {what} within {args.timeout:.0f} s")
                runner.row(metric, restart[key] * 1000, "ms")
                lines.append((f"restarted {after}broker {what}", f"{restart[key] * 1000:,.0f} ms", "from its start"))
            if fault == "kill":
                # Every record acknowledged before the crash is read back from the recovered logs.
                again = _consume(cluster, sample, args.timeout)
                runner.row("kill_consume_ms", again * 1000, "ms")
                lines.append((f"after SIGKILL: consume the {len(sample):,} records again", f"{again * 1000:,.0f} ms",
                              "every one read back"))
        runner.table(f"metadata scale: {partitions:,} partitions in {topics} topic(s), "
                     f"{len(cluster.brokers)} brokers", lines)
        figures = {r["metric"]: r["value"] for r in runner.rows}
        runner.finish()
    return figures


async def _create(cluster: Any, names: list[str], per_topic: list[int], replication_factor: int, timeout_s: float,
                  on_seen: Any) -> dict[str, Any]:
    """Create the topics through the first broker; seconds until its answer and until each broker lists them."""
    import trio

    from bench.cluster_probes import PROBE_ERRORS, create_topics, topic_partitions

    out: dict[str, Any] = {"seen": {}}
    expected = sum(per_topic)
    first = cluster.brokers[0]
    t0 = time.monotonic()
    # Requests of at most MAX_PER_REQUEST partitions (the controller's bound).
    batches: list[dict[str, int]] = [{}]
    for name, n in zip(names, per_topic):
        if batches[-1] and sum(batches[-1].values()) + n > MAX_PER_REQUEST:
            batches.append({})
        batches[-1][name] = n

    async def create() -> None:
        for batch in batches:
            codes = await create_topics(first.host, first.port, batch,
                                        replication_factor=replication_factor, timeout_ms=int(timeout_s * 1000))
            bad = {name: code for name, code in codes.items() if code != 0}
            if bad:
                raise BenchError(f"CreateTopics failed: error codes {bad}")
        out["answered"] = time.monotonic() - t0

    async def watch(broker: Any) -> None:
        while True:
            try:
                leaders = await topic_partitions(broker.host, broker.port, names, 10_000)
            except PROBE_ERRORS:
                leaders = {}
            if len(leaders) == expected and all(leader >= 0 for leader in leaders.values()):
                out["seen"][broker.node_id] = time.monotonic() - t0
                if on_seen is not None:
                    on_seen(len(out["seen"]))
                return
            await trio.sleep(POLL_S)

    with trio.move_on_after(timeout_s):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            for b in cluster.brokers:
                nursery.start_soon(watch, b)
    return out


async def _list_and_produce(cluster: Any, names: list[str], expected: int, sample: list[tuple[str, int]],
                            timeout_s: float) -> dict[str, float]:
    """Seconds for one Metadata request listing every partition, and for
    producing one record to each partition of `sample`."""
    from bench.cluster_probes import produce_many, topic_partitions

    first = cluster.brokers[0]
    t0 = time.monotonic()
    leaders = await topic_partitions(first.host, first.port, names, int(timeout_s * 1000))
    listed = time.monotonic() - t0
    if len(leaders) != expected:
        raise BenchError(f"Metadata listed {len(leaders)} of {expected} partitions")
    t0 = time.monotonic()
    for i in range(0, len(sample), PRODUCE_CHUNK):
        chunk = sample[i:i + PRODUCE_CHUNK]
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in chunk:
            by_leader.setdefault(leaders[tp], []).append(tp)
        for leader, tps in by_leader.items():
            broker = next(b for b in cluster.brokers if b.node_id == leader)
            codes = await produce_many(broker.host, broker.port, tps, timeout_ms=int(timeout_s * 1000))
            bad = {tp: code for tp, code in codes.items() if code != 0}
            if bad:
                raise BenchError(f"Produce failed on {len(bad)} partitions, e.g. {next(iter(bad.items()))}")
    return {"list": listed, "produce": time.monotonic() - t0}


def _consume(cluster: Any, sample: list[tuple[str, int]], timeout_s: float) -> float:
    """Seconds until a consumer assigned `sample` read the one record of each."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    bootstrap = ",".join(f"{b.host}:{b.port}" for b in cluster.brokers)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "metadata-scale", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    t0 = time.monotonic()
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in sample])
        seen: set[tuple[str, int]] = set()
        while len(seen) < len(sample):
            if time.monotonic() - t0 > timeout_s:
                raise BenchError(f"consumed from {len(seen)} of {len(sample)} partitions in {timeout_s:.0f} s")
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    seen.add((msg.topic(), msg.partition()))
        return time.monotonic() - t0
    finally:
        consumer.close()


async def _restart(cluster: Any, victim: Any, names: list[str], expected: int, t0: float,
                   timeout_s: float, killed: bool) -> dict[str, float]:
    import trio

    from bench.cluster_probes import PROBE_ERRORS, live_brokers, topic_partitions

    out: dict[str, float] = {}
    others = [b for b in cluster.brokers if b.node_id != victim.node_id]

    async def ready() -> None:
        while not any(line.startswith("READY ") for line in victim.output_since_start().splitlines()):
            if not victim.is_running():
                raise BenchError(f"broker {victim.node_id} exited on restart; see {victim.output_path}")
            await trio.sleep(POLL_S)
        out["ready"] = time.monotonic() - t0

    async def unfenced() -> None:
        # A SIGKILLed broker stays listed until its session times out: only a listing
        # after the new process registered (its READY line) counts.
        while killed and "ready" not in out:
            await trio.sleep(POLL_S)
        while True:
            for b in others or [victim]:
                try:
                    if victim.node_id in await live_brokers(b.host, b.port):
                        out["unfenced"] = time.monotonic() - t0
                        return
                except PROBE_ERRORS:
                    pass
            await trio.sleep(POLL_S)

    async def caught_up() -> None:
        while True:
            try:
                leaders = await topic_partitions(victim.host, victim.port, names, 10_000)
                if len(leaders) == expected and all(leader >= 0 for leader in leaders.values()):
                    out["caught_up"] = time.monotonic() - t0
                    return
            except PROBE_ERRORS:
                pass
            await trio.sleep(POLL_S)

    with trio.move_on_after(max(0.0, t0 + timeout_s - time.monotonic())):
        async with trio.open_nursery() as nursery:
            for task in (ready, unfenced, caught_up):
                nursery.start_soon(task)
    return out
