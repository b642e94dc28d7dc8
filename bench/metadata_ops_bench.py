"""`raftka bench topic-create` and `raftka bench cold-start`: metadata work at scale, in either mode.

Both run on a fresh cluster (default 1 controller, 3 brokers) in `--mode
kraft` (a Raft quorum of `--controllers`) or `--mode zk` (a ZooKeeper
ensemble of `--controllers` servers, a broker elected controller), with
everything else the same, so `raftka report` can put the modes side by side.

**topic-create**: `--topics` topics of `--partitions-per-topic` partitions
(replication factor `--replication-factor`), each in its own CreateTopics
request, `--concurrency` requests at a time, sent to the brokers in turn.
A topic counts as created once the broker it was sent to lists it with a
leader for every partition (a ZooKeeper-mode broker answers CreateTopics
as soon as the znodes are written; a KRaft broker once its image has the
topic): `topic_create_ms_p50`/`_p99` per topic, `topic_create_rate` (topics
per second over the whole batch), and `topic_create_all_brokers_ms`, until
every broker lists every topic.

**cold-start**: `--partitions` partitions (in `--topics` topics) are
created and each takes one record; then the whole cluster is stopped
cleanly and started again (ZooKeeper or the quorum first, then the
brokers). Clocks from the start: `cold_start_ready_ms` (every node READY,
every broker registered and unfenced: `LocalCluster.wait_ready`),
`cold_start_leaders_ms` (every broker's Metadata lists every partition
with a live leader) and `cold_start_writable_ms` (a one-record Produce,
acks=1, accepted by every partition's leader); `cluster_stop_ms` is how
long the clean stop took.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from bench.runner import (
    BenchError,
    Runner,
    add_engine_option,
    add_run_options,
    engine_overrides,
    parse_sets,
)

POLL_S = 0.02
#: Partitions in one CreateTopics at most (the controller's limit).
MAX_PARTITIONS_PER_REQUEST = 10_000
PRODUCE_CHUNK = 500


def register(scenarios: argparse._SubParsersAction) -> None:
    doc = __doc__.split("\n\n")
    p = scenarios.add_parser("topic-create", help="topic creation rate, in either mode",
                             description=doc[0], epilog="\n\n".join([doc[1], doc[2]]),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=100, help="topics created (default 100)")
    p.add_argument("--partitions-per-topic", type=int, default=1, help="default 1")
    p.add_argument("--replication-factor", "--rf", type=int, default=3, dest="replication_factor",
                   help="default 3")
    p.add_argument("--concurrency", type=int, default=4, help="CreateTopics requests in flight (default 4)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S s (default 300)")
    add_engine_option(p)
    add_run_options(p, controllers=1, brokers=3)
    p.set_defaults(func=run_topic_create)

    p = scenarios.add_parser("cold-start", help="restart a whole cluster holding N partitions, in either mode",
                             description=doc[0], epilog="\n\n".join([doc[1], doc[3]]),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=1000, help="partitions, in all (default 1000)")
    p.add_argument("--topics", type=int, default=10, help="topics they are spread over (default 10)")
    p.add_argument("--replication-factor", "--rf", type=int, default=3, dest="replication_factor",
                   help="default 3")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="give up after S s (default 600)")
    add_run_options(p, controllers=1, brokers=3)
    p.set_defaults(func=run_cold_start)


# --- topic-create ---------------------------------------------------------------------


def run_topic_create(args: argparse.Namespace) -> int:
    if min(args.topics, args.partitions_per_topic, args.concurrency) < 1 or args.replication_factor > args.brokers:
        raise SystemExit("raftka bench topic-create: --topics, --partitions-per-topic and --concurrency must be "
                         "positive, and --replication-factor at most --brokers")
    overrides = parse_sets(args.set)
    params = {"topics": args.topics, "partitions_per_topic": args.partitions_per_topic,
              "replication_factor": args.replication_factor, "concurrency": args.concurrency,
              "brokers": args.brokers, "controllers": args.controllers,
              # the metadata backend, for the three-way report
              "engine": engine_overrides(args, overrides)}
    with Runner("topic-create", args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=overrides)
        prefix = f"tc-{runner.run_id[-8:]}"
        runner.phase("warm-up", "one topic through every broker")
        warm = [f"{prefix}-warm-{b.node_id}" for b in cluster.brokers]
        runner.trio_run(_create_all, cluster, warm, 1, args.replication_factor, 1, args.timeout)
        names = [f"{prefix}-{i}" for i in range(args.topics)]
        runner.phase("measure", f"create {args.topics} topics of {args.partitions_per_topic} partition(s), "
                                f"{args.concurrency} at a time")
        out = runner.trio_run(_create_all, cluster, names, args.partitions_per_topic, args.replication_factor,
                              args.concurrency, args.timeout)
        took = sorted(out["took"].values())
        if len(took) < len(names) or "all_brokers" not in out:
            raise BenchError(f"only {len(took)} of {len(names)} topics were created and listed with leaders "
                             f"within {args.timeout:.0f} s")
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))]
        runner.row("topic_create_rate", len(names) / out["last"], "topics/s")
        runner.row("topic_create_ms_p50", statistics.median(took) * 1000, "ms")
        runner.row("topic_create_ms_p99", p99 * 1000, "ms")
        runner.row("topic_create_all_brokers_ms", out["all_brokers"] * 1000, "ms")
        runner.samples("topic_create", "ms", [t * 1000 for t in took])
        runner.table(f"topic-create: {len(names)} topics, mode {args.mode}", [
            ("topics/s", f"{len(names) / out['last']:,.1f}", f"{len(names)} topics in {out['last']:.2f} s"),
            ("per topic p50 / p99", f"{statistics.median(took) * 1000:,.0f} / {p99 * 1000:,.0f} ms",
             "CreateTopics sent until that broker lists it led"),
            ("every broker lists them all", f"{out['all_brokers'] * 1000:,.0f} ms", "from the first send")])
        runner.finish()
    return 0


async def _create_all(cluster: Any, names: list[str], partitions: int, replication_factor: int, concurrency: int,
                      timeout_s: float) -> dict[str, Any]:
    """Create `names` (concurrency at a time, brokers in turn); seconds per topic, to the last, to all brokers."""
    from bench.cluster_probes import PROBE_ERRORS, create_topics, topic_partitions

    out: dict[str, Any] = {"took": {}}
    brokers = cluster.brokers
    t0 = time.monotonic()
    queue = list(enumerate(names))

    async def led(broker: Any, topics: list[str], expected: int) -> bool:
        try:
            leaders = await topic_partitions(broker.host, broker.port, topics, 10_000)
        except PROBE_ERRORS:
            return False
        return len(leaders) == expected and all(v >= 0 for v in leaders.values())

    async def worker() -> None:
        while queue:
            i, name = queue.pop(0)
            broker = brokers[i % len(brokers)]
            sent = time.monotonic()
            codes = await create_topics(broker.host, broker.port, {name: partitions},
                                        replication_factor=replication_factor, timeout_ms=30_000)
            if codes.get(name) not in (0, 7):  # 7: made, but not yet in that broker's image
                raise BenchError(f"CreateTopics of {name} failed with error code {codes.get(name)}")
            while not await led(broker, [name], partitions):
                await trio.sleep(POLL_S / 4)
            now = time.monotonic()
            out["took"][name] = now - sent
            out["last"] = now - t0

    with trio.move_on_after(timeout_s):
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        for broker in brokers:
            while not await led(broker, names, partitions * len(names)):
                await trio.sleep(POLL_S)
        out["all_brokers"] = time.monotonic() - t0
    return out


# --- cold-start -------------------------------------------------------------------------


def run_cold_start(args: argparse.Namespace) -> int:
    if args.topics < 1 or args.partitions < args.topics or args.replication_factor > args.brokers:
        raise SystemExit("raftka bench cold-start: need --topics >= 1, --partitions >= --topics and "
                         "--replication-factor at most --brokers")
    params = {"partitions": args.partitions, "topics": args.topics, "replication_factor": args.replication_factor,
              "brokers": args.brokers, "controllers": args.controllers}
    per_topic = [args.partitions // args.topics + (i < args.partitions % args.topics) for i in range(args.topics)]
    if max(per_topic) > MAX_PARTITIONS_PER_REQUEST:
        raise SystemExit(f"raftka bench cold-start: at most {MAX_PARTITIONS_PER_REQUEST:,} partitions per topic; "
                         "raise --topics")
    with Runner("cold-start", args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=parse_sets(args.set))
        topics = {f"cold-{runner.run_id[-8:]}-{i}": n for i, n in enumerate(per_topic)}
        runner.phase("fill", f"create {args.partitions:,} partitions in {args.topics} topic(s), one record each")
        t = time.monotonic()
        runner.trio_run(_fill, cluster, topics, args.replication_factor, args.timeout)
        runner.say(f"created and written in {time.monotonic() - t:.1f} s")
        runner.phase("stop", "every node, cleanly")
        t = time.monotonic()
        cluster.stop_all(60.0)
        runner.row("cluster_stop_ms", (time.monotonic() - t) * 1000, "ms")
        runner.phase("measure", "start the whole cluster again")
        t0 = time.monotonic()
        cluster.start_all()
        from cluster import ClusterError

        try:
            cluster.wait_ready(args.timeout)
        except ClusterError as exc:
            raise BenchError(f"the restarted cluster did not become ready: {exc}") from None
        ready = time.monotonic() - t0
        clocks = runner.trio_run(_after_start, cluster, topics, t0, args.timeout)
        runner.row("cold_start_ready_ms", ready * 1000, "ms")
        lines = [("every node READY, brokers unfenced", f"{ready * 1000:,.0f} ms", "")]
        for metric, key, what in (("cold_start_leaders_ms", "leaders", "every broker lists every partition led"),
                                  ("cold_start_writable_ms", "writable", "every partition takes a record")):
            if key not in clocks:
                raise BenchError(f"after the restart, not {what} within {args.timeout:.0f} s")
            runner.row(metric, clocks[key] * 1000, "ms")
            lines.append((what, f"{clocks[key] * 1000:,.0f} ms", "from the start"))
        runner.table(f"cold start: {args.partitions:,} partitions, RF {args.replication_factor}, mode {args.mode}",
                     lines)
        runner.finish()
    return 0


async def _leaders_everywhere(cluster: Any, topics: dict[str, int]) -> dict[tuple[str, int], int] | None:
    """Every partition's leader if every running broker lists every partition with a live leader."""
    from bench.cluster_probes import PROBE_ERRORS, live_brokers, topic_partitions

    expected = sum(topics.values())
    found: dict[tuple[str, int], int] = {}
    for broker in cluster.brokers:
        try:
            leaders = await topic_partitions(broker.host, broker.port, list(topics), 30_000)
            live = await live_brokers(broker.host, broker.port)
        except PROBE_ERRORS:
            return None
        if len(leaders) != expected or not all(v in live for v in leaders.values()):
            return None
        found = leaders
    return found


async def _write_everywhere(cluster: Any, leaders: dict[tuple[str, int], int], deadline: float) -> bool:
    """One record (acks=1) into every partition, through its leader; whether all were taken by `deadline`."""
    from bench.cluster_probes import PROBE_ERRORS, produce_many

    pending = dict(leaders)
    while pending and time.monotonic() < deadline:
        for broker in cluster.brokers:
            mine = [k for k, leader in pending.items() if leader == broker.node_id]
            for i in range(0, len(mine), PRODUCE_CHUNK):
                try:
                    codes = await produce_many(broker.host, broker.port, mine[i:i + PRODUCE_CHUNK], acks=1,
                                               timeout_ms=10_000)
                except PROBE_ERRORS:
                    continue
                for k, code in codes.items():
                    if code == 0:
                        pending.pop(k, None)
        if pending:
            await trio.sleep(POLL_S)
    return not pending


async def _fill(cluster: Any, topics: dict[str, int], replication_factor: int, timeout_s: float) -> None:
    from bench.cluster_probes import create_topics

    deadline = time.monotonic() + timeout_s
    broker = cluster.brokers[0]
    for name, n in topics.items():
        codes = await create_topics(broker.host, broker.port, {name: n}, replication_factor=replication_factor,
                                    timeout_ms=int(timeout_s * 1000))
        if codes.get(name) not in (0, 7):
            raise BenchError(f"CreateTopics of {name} ({n:,} partitions) failed with error code {codes.get(name)}")
    while (leaders := await _leaders_everywhere(cluster, topics)) is None:
        if time.monotonic() > deadline:
            raise BenchError(f"the partitions had no leader everywhere {timeout_s:.0f} s after CreateTopics")
        await trio.sleep(0.2)
    if not await _write_everywhere(cluster, leaders, deadline):
        raise BenchError(f"not every partition took its record within {timeout_s:.0f} s")


async def _after_start(cluster: Any, topics: dict[str, int], t0: float, timeout_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    deadline = t0 + timeout_s
    while (leaders := await _leaders_everywhere(cluster, topics)) is None:
        if time.monotonic() > deadline:
            return out
        await trio.sleep(POLL_S)
    out["leaders"] = time.monotonic() - t0
    if await _write_everywhere(cluster, leaders, deadline):
        out["writable"] = time.monotonic() - t0
    return out
