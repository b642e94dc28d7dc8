"""`raftka bench failover`: partition leader failover when a broker dies.

What one run measures: a fresh cluster (default 1 controller, 3 brokers)
and partitions with replication factor `--replication-factor` (default 3:
a leader can only move to another replica), either

- `--partitions N`: one topic of N partitions placed by the controller;
  the victim is the broker that leads the most of them; or
- `--led-partitions N`: N partitions placed by hand (CreateTopics replica
  assignments) so that one broker is the preferred leader of every one of
  them, followers spread over the others; that broker is the victim,
  leader of all N. They are made in topics of at most 500 partitions,
  one topic at a time, each waited for: a broker applies a new
  partition's metadata (opening its log) within one turn of its event
  loop, and thousands at once would hold its heartbeats past the session
  timeout (it would be fenced, and leadership would churn, before the
  fault; the setup is not what is measured).

In ZooKeeper mode (`--mode zk`) the controller is a broker; the victim is
never that one (its loss would be a controller failover as well: that is
`raftka bench controller-failover`).

Warm-up: one record is produced to every partition and acknowledged
with acks=1 (`--warmup` seconds at least; acks=1 so that a slow commit
of thousands of partitions at once does not hold the warm-up up). Then the victim gets `--fault` (kill:
SIGKILL; stop: SIGSTOP, a frozen process with open sockets; term: SIGTERM,
a controlled shutdown), and, from the instant before the signal, clocks
run per former partition:

- **metadata**: until a surviving broker's Metadata answer names a new,
  live leader (one Metadata request for the topics that still have a
  partition with no new leader known, every 10 ms, or 10 µs per
  partition asked for when that is longer, to the surviving brokers in
  turn; once every new leader is known, for the topics with a partition
  not yet written, in case a leader moves again. A probe must not load
  the machine it times: decoding an answer for 10,000 partitions costs
  the probe 20-36 ms of CPU, so at most a third of a core while nothing
  has moved. The controller moves a fenced broker's partitions 500 at a
  time, topic by topic (`quorum.controller.elections.LeaderMoves`), so the
  requests shrink, and come more often, as topics are done. At 100 µs
  per partition the probe learned half the new leaders up to a second
  after the brokers had applied them);
- **produce**: until a Produce of one record (acks `--acks`) sent to the
  leader that metadata names is answered without error: the partition
  takes writes again (with acks=all: committed by the new ISR). Produce
  requests carry up to 500 partitions each, two in flight per broker,
  each on a connection of its own that the probe keeps, as a client keeps
  its connections (the Metadata and fence probes keep one each too);
  whenever one is answered, the next takes the partitions with a known
  new leader and no write yet (a failed one is tried again 50 ms later);
- **client** (up to `--client-partitions`, default 1,000, of them): until
  a record handed to confluent-kafka right after the fault is acknowledged:
  what an application sees. Its settings are ones an application tuned
  for fast failover would use: `retry.backoff.ms` 10 and
  `retry.backoff.max.ms` 100, `reconnect.backoff.ms` 10 and
  `reconnect.backoff.max.ms` 100, `message.timeout.ms` 60000; the rest
  are librdkafka's defaults.
  librdkafka re-queries a leaderless partition's metadata on its 1 s
  topic scan, so this clock moves in ~1 s steps.

One more clock is not per partition:

- **fenced**: until a surviving broker's Metadata no longer lists the
  victim among the live brokers (a Metadata request for no topics, every
  10 ms, to the surviving brokers in turn): the cluster has noticed the
  failure (KRaft: the controller fenced the broker and the survivor
  applied that record; ZooKeeper mode: the controller saw the broker's
  znode go and sent UpdateMetadata). The table also gives each clock's
  median after it ("after fence"): the part of a failover that is the
  cluster's own work, and not the wait for the session timeout, which
  with a heartbeat every `broker.heartbeat.interval.ms` (2 s) ends 7-9 s
  after a kill, depending on when the last heartbeat came.

And the work: the CPU seconds the cluster's processes (brokers,
controllers, ZooKeeper servers) and the bench process itself (the probe
and the client) used from the instant the probe saw the fence (term: from
the signal) to the last partition's write, with the cluster's CPU per
partition moved, and how busy the machine's CPUs were meanwhile
(`bench.proc_stats`). On a shared machine the clocks also measure how
fast it was that minute: a run whose CPUs were all busy from the fence on
was bound by CPU, and the microseconds per partition compare runs made on
slower and faster days.

With kill and stop, the controller learns of the failure only when the
broker's session expires, so it bounds every clock from below: KRaft's
`broker.session.timeout.ms` (Kafka's default 9000 ms) or ZooKeeper mode's
`zookeeper.session.timeout.ms` (Kafka's default 18000 ms).
`--session-timeout-ms` (default 9000) sets whichever the mode has, so both
modes run with the same. The target is a median produce clock within that
timeout + 1 s; with term
(controlled shutdown, leaders moved before the broker exits), 1 s.
Reported: max, p99, median and min of each clock over the partitions,
every partition's time as raw samples, and the partitions that took no
write within `--timeout`. With `--rounds N` (not with --led-partitions:
run it again instead) the victim is brought back after each round and
the next round faults the leader of the most partitions again.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio

from bench.proc_stats import CpuMark, cluster_cpu_mark, cpu_between
from bench.runner import BenchError, Runner, add_run_options, parse_sets, session_overrides

SCENARIO = "failover"
TOPIC = "bench-failover"
POLL_S = 0.01
#: Partitions per probe Produce request, and such requests in flight per broker.
PRODUCE_CHUNK = 500
PRODUCE_IN_FLIGHT = 2
#: Probe pacing per partition probed (see the module docstring).
METADATA_PACE_S_PER_PARTITION = 10e-6
#: A partition whose probe write failed is tried again after this.
PRODUCE_RETRY_S = 0.05
#: Partitions of one led topic at most: see the module docstring.
MAX_PARTITIONS_PER_TOPIC = 500

Key = tuple[str, int]


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="partition leader failover: kill -9 a broker, time until produce works",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=6, help="partitions of the topic (default 6)")
    p.add_argument("--led-partitions", type=int, default=None, metavar="N",
                   help="instead: N partitions all led by the victim (placed by hand); see below")
    p.add_argument("--replication-factor", "--rf", type=int, default=3, dest="replication_factor",
                   help="default 3")
    p.add_argument("--fault", choices=("kill", "stop", "term"), default="kill", help="what the leader gets (default kill)")
    p.add_argument("--acks", choices=("1", "all"), default="1", help="acks of the probe records (default 1)")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S", help="seconds of warm-up produce (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="faults per run (default 1)")
    p.add_argument("--client-partitions", type=int, default=1000, metavar="N",
                   help="partitions timed by the confluent-kafka client clock (default 1000; 0: none)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up on a partition after S s")
    p.add_argument("--session-timeout-ms", type=int, default=9000, metavar="MS",
                   help="broker.session.timeout.ms (kraft) or zookeeper.session.timeout.ms (zk) (default 9000)")
    add_run_options(p, controllers=1, brokers=3)
    p.set_defaults(func=run)


def layout(led_partitions: int | None, partitions: int) -> dict[str, int]:
    """{topic: partitions} of the run: one topic, or the led partitions in topics of at most 500."""
    if led_partitions is None:
        return {TOPIC: partitions}
    topics = -(-led_partitions // MAX_PARTITIONS_PER_TOPIC)
    if topics == 1:
        return {TOPIC: led_partitions}
    return {f"{TOPIC}-{i}": led_partitions // topics + (i < led_partitions % topics) for i in range(topics)}


def led_assignment(victim: int, others: list[int], partitions: int, replication_factor: int) -> list[list[int]]:
    """Replica lists, victim first (the preferred leader), followers rotated over the other brokers."""
    assert len(others) >= replication_factor - 1
    return [[victim] + [others[(p + i) % len(others)] for i in range(replication_factor - 1)]
            for p in range(partitions)]


def run(args: argparse.Namespace) -> int:
    if args.partitions < 1 or args.timeout <= 0 or args.session_timeout_ms < 1 or args.client_partitions < 0:
        raise SystemExit("raftka bench failover: --partitions, --timeout and --session-timeout-ms must be "
                         "positive, --client-partitions at least 0")
    if args.replication_factor < 2 or args.brokers < args.replication_factor or args.rounds < 1:
        raise SystemExit("raftka bench failover: leader failover needs --replication-factor >= 2 and at least "
                         "that many --brokers, and --rounds >= 1")
    if args.led_partitions is not None and (args.led_partitions < 1 or args.rounds != 1):
        raise SystemExit("raftka bench failover: --led-partitions needs N >= 1 and one round (a restarted "
                         "broker leads nothing until a preferred leader election): run the bench again instead")
    overrides, session_timeout_ms = session_overrides(args.mode, args.session_timeout_ms, parse_sets(args.set))
    topics = layout(args.led_partitions, args.partitions)
    params = {"partitions": sum(topics.values()), "replication_factor": args.replication_factor,
              "fault": args.fault, "acks": args.acks, "brokers": args.brokers, "controllers": args.controllers,
              "placement": "led" if args.led_partitions is not None else "controller",
              "session_timeout_ms": session_timeout_ms}
    stuck = 0
    with Runner(SCENARIO, args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=overrides)
        controller = runner.trio_run(_controller_broker, cluster)
        candidates = [b.node_id for b in cluster.brokers if b.node_id != controller]
        t = time.monotonic()
        _create(runner, cluster, topics, args, candidates[0])
        runner.say(f"created {sum(topics.values()):,} partitions in {len(topics)} topic(s) "
                   f"in {time.monotonic() - t:.1f} s")
        keys = [(name, p) for name, n in topics.items() for p in range(n)]
        runner.phase("warm-up", f"produce to all {len(keys):,} partitions")
        _produce_to_all(cluster.bootstrap, keys, "1", args.warmup, max(args.timeout, 120.0))
        for round_no in range(args.rounds):
            leaders = runner.trio_run(_leaders, cluster, None, list(topics))
            if args.led_partitions is not None:
                victim = candidates[0]
            else:
                counts = {b: list(leaders.values()).count(b) for b in candidates}
                victim = max(sorted(counts), key=lambda b: counts[b])
            moved = sorted(k for k, leader in leaders.items() if leader == victim)
            if args.led_partitions is not None and len(moved) < len(keys):
                raise BenchError(f"broker {victim} leads only {len(moved):,} of the {len(keys):,} partitions placed "
                                 "for it: leadership moved before the fault (see the brokers' logs)")
            runner.phase("measure", f"round {round_no + 1}/{args.rounds}: {args.fault} broker {victim}, "
                                    f"leader of {len(moved):,} partition(s)")
            client = _ClientProbe(cluster.bootstrap, args.acks, list(topics)) if args.client_partitions else None
            t0 = runner.inject(cluster, victim, args.fault)
            if client is not None:
                client.send(moved[:args.client_partitions], t0)
            clocks, fenced_s, marks = runner.trio_run(_watch, cluster, victim, moved, args.acks, t0, args.timeout)
            if client is not None:
                clocks["client"] = client.wait(t0 + args.timeout)
            fenced_ms = None if fenced_s is None else fenced_s * 1000
            produce_s = clocks["produce"]
            stuck += len(moved) - len(produce_s)
            lines = []
            if fenced_ms is not None:
                runner.row("leader_failover_fenced_ms", fenced_ms, "ms", led=len(moved))
                lines.append(("fenced", f"{fenced_ms:,.0f}", "a survivor's Metadata no longer lists the victim"))
            else:
                lines.append(("fenced", "-", "the survivors still listed the victim when the probe stopped"))
            for clock, times in clocks.items():
                values = sorted(times[k] * 1000 for k in moved if k in times)
                if values:
                    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
                    runner.row(f"leader_failover_{clock}_ms_max", values[-1], "ms", led=len(moved))
                    runner.row(f"leader_failover_{clock}_ms_p99", p99, "ms", led=len(moved))
                    runner.row(f"leader_failover_{clock}_ms_median", statistics.median(values), "ms", led=len(moved))
                    runner.row(f"leader_failover_{clock}_ms_min", values[0], "ms", led=len(moved))
                    runner.samples(f"leader_failover_{clock}", "ms", values, led=len(moved))
                    expected = min(len(moved), args.client_partitions) if clock == "client" else len(moved)
                    median = statistics.median(values)
                    after = ""
                    if fenced_ms is not None:
                        runner.row(f"leader_failover_{clock}_ms_median_after_fence", median - fenced_ms, "ms",
                                   led=len(moved))
                        after = f"; median {median - fenced_ms:,.0f} after fenced"
                    lines.append((clock, f"{median:,.0f}",
                                  f"p99 {p99:,.0f}, max {values[-1]:,.0f}, min {values[0]:,.0f}; "
                                  f"{len(values):,} of {expected:,} partitions{after}"))
            runner.row("partitions_without_leader", len(moved) - len(produce_s), "partitions", led=len(moved))
            if round_no == 0 and produce_s:
                # Inside the run: partitions writable again over time since the fault, and the
                # fault's window (injection to the last partition written again) for the report.
                times = sorted(produce_s[k] for k in moved if k in produce_s)
                step = max(times[-1] / 200, 0.01)
                points = [(i * step, sum(1 for t in times if t <= i * step))
                          for i in range(int(times[-1] / step) + 2)]
                runner.series("partitions_writable_again", "partitions", points, led=len(moved))
                runner.event(f"{args.fault} broker {victim}", 0.0, times[-1])
            target = 1000 if args.fault == "term" else session_timeout_ms + 1000
            lines.append(("target (median produce)", f"≤ {target:,}", "term: 1 s; kill/stop: session timeout + 1 s"))
            runner.table(f"round {round_no + 1}: {args.fault} broker {victim}, leader of {len(moved):,} partitions "
                         "(ms after the signal)", lines, columns=("clock", "median", "spread"))
            _report_cpu(runner, marks, args.fault, len(moved))
            if round_no + 1 < args.rounds:
                runner.restart(cluster, victim)
        runner.finish()
    return 0 if stuck == 0 else 1


def _report_cpu(runner: Runner, marks: dict[str, CpuMark], fault: str, moved: int) -> None:
    """Rows and a line: the CPU the cluster and the bench used from the fence
    (term: from the signal, the controlled shutdown being the work) to the
    last write, and how busy the machine was meanwhile."""
    since, mark = ("signal", "signal") if fault == "term" else ("fence", "fenced")
    start, end = marks.get(mark), marks["written"]
    if start is None or start.at >= end.at or not moved:
        runner.say(f"CPU after the {since}: not measured (no fence seen before the last write, or nothing moved)")
        return
    used, busy = cpu_between(start, end)
    cluster_s = sum(seconds for group, seconds in used.items() if group != "bench")
    for group, seconds in sorted(used.items()):
        runner.row(f"leader_failover_{group}_cpu_s_after_{since}", seconds, "s", led=moved)
    per_partition_us = cluster_s / moved * 1e6
    runner.row(f"leader_failover_cluster_cpu_us_per_partition_after_{since}", per_partition_us, "us", led=moved)
    runner.row(f"leader_failover_machine_busy_after_{since}", busy, "ratio", led=moved)
    groups = ", ".join(f"{group} {seconds:.2f} s" for group, seconds in sorted(used.items()) if group != "bench")
    runner.say(f"CPU from the {since} to the last write ({end.at - start.at:.2f} s): {groups}: "
               f"{per_partition_us:,.0f} µs per partition moved; the bench's probe and client "
               f"{used.get('bench', 0.0):.2f} s; the machine's CPUs {busy:.0%} busy")


def _create(runner: Runner, cluster: Any, topics: dict[str, int], args: argparse.Namespace, victim: int) -> None:
    from bench.kafka_bench import create_topic

    if args.led_partitions is None:
        create_topic(cluster.bootstrap, TOPIC, args.partitions, args.replication_factor)
        return
    others = [b.node_id for b in cluster.brokers if b.node_id != victim]
    assignments = {name: led_assignment(victim, others, n, args.replication_factor) for name, n in topics.items()}
    runner.trio_run(_create_led, cluster, topics, assignments, max(120.0, args.timeout))


async def _create_led(cluster: Any, topics: dict[str, int], assignments: dict[str, list[list[int]]],
                      timeout_s: float) -> None:
    """One CreateTopics per topic (with its replica lists), then until a broker lists every partition led."""
    from bench.cluster_probes import PROBE_ERRORS, create_topics, topic_partitions

    broker = cluster.brokers[-1]
    with trio.move_on_after(timeout_s) as scope:
        for name, n in topics.items():
            codes = await create_topics(broker.host, broker.port, {name: n}, timeout_ms=int(timeout_s * 1000),
                                        assignments={name: assignments[name]})
            # 7 REQUEST_TIMED_OUT: made, but not yet in the broker's image; the wait below covers it.
            if codes.get(name) not in (0, 7):
                raise BenchError(f"CreateTopics of {name} ({n:,} partitions) failed with error code {codes.get(name)}")
            while True:
                try:
                    leaders = await topic_partitions(broker.host, broker.port, [name], 30_000)
                    if len(leaders) == n and all(v >= 0 for v in leaders.values()):
                        break
                except PROBE_ERRORS:
                    pass
                await trio.sleep(0.1)
        return
    if scope.cancelled_caught:
        raise BenchError(f"the {sum(topics.values()):,} partitions did not all have a leader {timeout_s:.0f} s "
                         "after CreateTopics")


async def _controller_broker(cluster: Any) -> int | None:
    """In ZooKeeper mode, the broker that is the controller; None in KRaft mode."""
    import trio

    from bench.cluster_probes import active_controller

    if cluster.mode != "zk":
        return None
    with trio.move_on_after(30):
        while (found := await active_controller(cluster)) is None:
            await trio.sleep(0.1)
        return found[0]
    raise BenchError("no broker holds ZooKeeper's /controller znode 30 s after the cluster was ready")


async def _leaders(cluster: Any, exclude: int | None, topics: list[str]) -> dict[Key, int]:
    from bench.cluster_probes import PROBE_ERRORS, topic_partitions

    for b in cluster.brokers:
        if b.node_id != exclude and b.is_running():
            try:
                return await topic_partitions(b.host, b.port, topics, 30_000)
            except PROBE_ERRORS:
                continue
    raise BenchError("no broker answered Metadata")


async def _watch(cluster: Any, victim: int, moved: list[Key], acks: str, t0: float,
                 timeout_s: float) -> tuple[dict[str, dict[Key, float]], float | None, dict[str, CpuMark]]:
    """Seconds from t0, per partition: until some surviving broker names a live leader other
    than the victim ("metadata"), and until that leader takes a produced record ("produce");
    until a survivor's Metadata no longer lists the victim ("fenced"; None if not seen); and
    the cluster's CPU marks (`bench.proc_stats`) at the start, when the fence was seen, and
    when the last partition took its write ("written"; when the watch gave up, if never)."""
    import trio

    from contextlib import AsyncExitStack
    from functools import partial

    from bench.cluster_probes import (PROBE_ERRORS, PROBE_TIMEOUT_MS, live_brokers_via, produce_many_via,
                                      topic_partitions_via)
    from common.wire.pool import open_connection_pool

    clocks: dict[str, dict[Key, float]] = {"metadata": {}, "produce": {}}
    fenced_s: float | None = None
    marks = {"signal": cluster_cpu_mark(cluster)}
    survivors = [b for b in cluster.brokers if b.node_id != victim and b.is_running()]
    topics = sorted({t for t, _ in moved})
    wanted = set(moved)
    leader_of: dict[Key, int] = {}
    #: Per broker, the partitions it leads by the metadata and has taken no
    #: write yet, in the order their leader became known: what its
    #: producer picks from. (Scanning all 10,000 moved partitions every
    #: 10 ms, per broker, while nothing had moved, was 0.45 -> 0.26 cores
    #: of probe CPU in the second before the fence.)
    unwritten: dict[int, dict[Key, None]] = {b.node_id: {} for b in survivors}
    moved_of: dict[str, list[Key]] = {}
    for k in moved:
        moved_of.setdefault(k[0], []).append(k)

    async def watch_metadata() -> None:
        seen = clocks["metadata"]
        unresolved = set(topics)
        turn = 0
        while len(clocks["produce"]) < len(moved):
            # Only the topics with a partition whose new leader is not known
            # yet: the controller moves a fenced broker's partitions a batch
            # at a time, topic by topic, so the answers shrink as they come.
            # Once every leader is known, the topics with a partition still
            # unwritten (a leader may move again); not all of them: while
            # the writes go on, an answer of 10,000 partitions cost the probe
            # 36 ms and the broker its encoding, a third of a second apart.
            asked = sorted(unresolved) or sorted({k[0] for w in unwritten.values() for k in w}) or topics
            broker = survivors[turn % len(survivors)]
            turn += 1
            try:
                leaders = await topic_partitions_via(partial(metadata_pool.request, broker.node_id), asked, 10_000)
            except PROBE_ERRORS:
                leaders = {}
            now = time.monotonic()
            for k, leader in leaders.items():
                if k in wanted and leader >= 0 and leader != victim:
                    seen.setdefault(k, now - t0)
                    old = leader_of.get(k)
                    if old != leader and k not in clocks["produce"]:
                        if old is not None:
                            unwritten.get(old, {}).pop(k, None)
                        unwritten.setdefault(leader, {})[k] = None
                    leader_of[k] = leader
            unresolved = {t for t in unresolved if any(k not in seen for k in moved_of[t])}
            await trio.sleep(max(POLL_S, METADATA_PACE_S_PER_PARTITION * sum(len(moved_of[t]) for t in asked)))

    async def watch_fence() -> None:
        """Until a survivor's Metadata leaves the victim out of the live
        brokers: even after the last write, which with a few partitions
        can land between two polls, on a new leader that has applied the
        change before the survivor asked (ZooKeeper mode's UpdateMetadata
        reaches the brokers one by one). The watch's deadline bounds it."""
        nonlocal fenced_s
        turn = 0
        while True:
            broker = survivors[turn % len(survivors)]
            turn += 1
            try:
                live = await live_brokers_via(partial(fence_pool.request, broker.node_id))
            except PROBE_ERRORS:
                live = {victim}
            if victim not in live:
                fenced_s = time.monotonic() - t0
                marks["fenced"] = cluster_cpu_mark(cluster)
                return
            await trio.sleep(POLL_S)

    async def produce_chunk(broker: Any, chunk: list[Key], in_flight: set[Key], retry_at: dict[Key, float],
                            pool: Any, free: trio.MemorySendChannel) -> None:
        try:
            try:
                codes = await produce_many_via(partial(pool.request, broker.node_id), chunk,
                                               acks=-1 if acks == "all" else 1, timeout_ms=5000)
            except PROBE_ERRORS:
                codes = {}
            now = time.monotonic()
            for k in chunk:
                if codes.get(k) == 0:
                    clocks["produce"].setdefault(k, now - t0)
                    for waiting in unwritten.values():
                        waiting.pop(k, None)
                else:
                    retry_at[k] = now + PRODUCE_RETRY_S
            if len(clocks["produce"]) == len(moved) and "written" not in marks:
                marks["written"] = cluster_cpu_mark(cluster)
        finally:
            in_flight.difference_update(chunk)
            free.send_nowait(pool)

    async def watch_produce(broker: Any) -> None:
        """Whenever one of its request slots (a connection of its own) is
        free: the next partitions this broker leads (by the metadata) with
        no write yet, none in flight, and past their retry pause."""
        done = clocks["produce"]
        in_flight: set[Key] = set()
        retry_at: dict[Key, float] = {}
        free, take = trio.open_memory_channel[Any](PRODUCE_IN_FLIGHT)
        for pool in produce_pools:
            free.send_nowait(pool)
        mine = unwritten[broker.node_id]
        async with trio.open_nursery() as requests:
            while len(done) < len(moved):
                pool = await take.receive()
                now = time.monotonic()
                chunk = []
                for k in mine:
                    if k not in in_flight and retry_at.get(k, 0.0) <= now:
                        chunk.append(k)
                        if len(chunk) == PRODUCE_CHUNK:
                            break
                if not chunk:
                    free.send_nowait(pool)
                    await trio.sleep(POLL_S)
                    continue
                in_flight.update(chunk)
                requests.start_soon(produce_chunk, broker, chunk, in_flight, retry_at, pool, free)

    # Connections kept to the survivors, as a client keeps them: one for the
    # fence probe, one for the Metadata probe (answers on a connection come
    # in order, and a Metadata answer of 10,000 partitions from a busy
    # broker must not hold up the fence probe's), and one per Produce
    # request in flight.
    async with AsyncExitStack() as stack:
        addresses = {b.node_id: (b.host, b.port) for b in survivors}
        pools = [await stack.enter_async_context(open_connection_pool(addresses, connect_timeout_ms=PROBE_TIMEOUT_MS))
                 for _ in range(2 + PRODUCE_IN_FLIGHT)]
        fence_pool, metadata_pool, *produce_pools = pools
        # trio's clock is not time.monotonic: the deadline is relative.
        with trio.move_on_after(max(0.0, t0 + timeout_s - time.monotonic())):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_metadata)
                nursery.start_soon(watch_fence)
                for b in survivors:
                    nursery.start_soon(watch_produce, b)
    marks.setdefault("written", cluster_cpu_mark(cluster))
    return clocks, fenced_s, marks


class _ClientProbe:
    """One confluent-kafka record per partition, produced right after the fault."""

    def __init__(self, bootstrap: str, acks: str, topics: list[str]) -> None:
        from confluent_kafka import Producer

        self.acked: dict[Key, float] = {}
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": acks, "message.timeout.ms": 60_000,
            "retry.backoff.ms": 10, "retry.backoff.max.ms": 100, "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 100, "log_level": 2,  # the dead broker's refused connections are expected
            "queue.buffering.max.messages": 1_000_000,
        })
        for topic in topics:
            self.producer.list_topics(topic, timeout=30)

    def send(self, keys: list[Key], t0: float) -> None:
        for topic, p in keys:
            sent_after_s = time.monotonic() - t0
            self.producer.produce(topic, b"failover-probe", partition=p,
                                  on_delivery=self._on_delivery((topic, p), sent_after_s))
        self.producer.poll(0)

    def _on_delivery(self, key: Key, sent_after_s: float) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is None:
                # latency(): produce() to acknowledgement, as librdkafka timed it.
                self.acked[key] = sent_after_s + msg.latency()
        return done

    def wait(self, deadline: float) -> dict[Key, float]:
        self.producer.flush(max(0.0, deadline - time.monotonic()))
        return dict(self.acked)


def _produce_to_all(bootstrap: str, keys: list[Key], acks: str, warmup_s: float, timeout_s: float) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                         "queue.buffering.max.messages": 1_000_000})
    acked: set[Key] = set()
    t0 = time.monotonic()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked.add((msg.topic(), msg.partition()))

    while time.monotonic() - t0 < warmup_s or len(acked) < len(keys):
        for topic, p in keys:
            if (topic, p) not in acked:
                try:
                    producer.produce(topic, b"warm-up", partition=p, on_delivery=on_delivery)
                except KafkaException as exc:
                    # A loaded broker may not have applied a new topic yet
                    # (librdkafka: UNKNOWN_TOPIC): the next round tries again.
                    if exc.args[0].code() != KafkaError._UNKNOWN_TOPIC:
                        raise
        producer.flush(min(5.0, max(0.05, timeout_s - (time.monotonic() - t0))))
        if time.monotonic() - t0 > timeout_s:
            missing = sorted(set(keys) - acked)
            raise BenchError(f"warm-up: {len(missing)} partitions (e.g. {missing[:5]}) acknowledged nothing in "
                             f"{timeout_s:.0f} s (acks={acks}); is replication running?")
    producer.flush(timeout_s)
