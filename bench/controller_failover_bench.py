"""`raftka bench controller-failover`: the active controller dies; how long until metadata writes work again.

What one run measures: a fresh cluster (default 3 controllers, 1 broker).
Warm-up: `--warmup-topics` topics are created through the broker
(CreateTopics, forwarded to the active controller), so every connection
and code path is warm. Then the active controller (the quorum's Raft
leader, from DescribeQuorum) gets `--fault` (kill: SIGKILL; stop: SIGSTOP;
term: SIGTERM, whereupon it resigns: KIP-595's EndQuorumEpoch), and from
the instant before the signal two clocks run:

- **election**: until a surviving controller's DescribeQuorum answer names
  a new leader in a higher epoch (polled every 10 ms);
- **metadata write**: until a CreateTopics sent through the broker is
  answered without error and the broker's Metadata lists the new topic
  with a leader. A new attempt (a new topic) starts every 20 ms,
  each on its own connection, at most 16 in flight; the clock stops at the
  first success's answer. The broker answers once its own metadata image
  shows the topic, so this includes the new leader's commit and the
  broker's catch-up: what an admin client sees.

With kill and stop the followers notice the loss only after
`controller.quorum.fetch.timeout.ms` (default 2000 ms) and then need an
election (`controller.quorum.election.timeout.ms`, default 1000 ms,
randomized): set them with `--set`. With `--rounds N` the victim is brought
back and caught up between rounds.

In ZooKeeper mode (`--mode zk`, `--controllers` ZooKeeper servers) the
active controller is the broker named by the `/controller` znode, so the
fault takes a broker down with it (`--brokers` must be at least 2); the
election clock stops when `/controller` names another broker with a
higher `/controller_epoch`, and the CreateTopics go through a surviving
broker. The others notice only when the dead broker's ZooKeeper session
expires (`zookeeper.session.timeout.ms`, Kafka's default 18000 ms; with
term the controller resigns at once), and the new controller then loads
all state from ZooKeeper before it acts.
"""

from __future__ import annotations

import argparse
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

SCENARIO = "controller-failover"
POLL_S = 0.01
ATTEMPT_EVERY_S = 0.02
MAX_IN_FLIGHT = 16


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(SCENARIO, help="kill the active controller; time until a new one commits a write",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=("kill", "stop", "term"), default="kill",
                   help="what the active controller gets (default kill)")
    p.add_argument("--warmup-topics", type=int, default=5, help="topics created before the fault (default 5)")
    p.add_argument("--rounds", type=int, default=1, help="faults per run (default 1)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S s (default 60)")
    add_engine_option(p)
    add_run_options(p, controllers=3, brokers=1)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.controllers < 3 or args.rounds < 1:
        raise SystemExit("raftka bench controller-failover: a quorum that survives a lost leader needs "
                         "--controllers 3 or 5; --rounds must be >= 1")
    if args.mode == "zk" and args.brokers < 2:
        raise SystemExit("raftka bench controller-failover --mode zk: the controller is a broker, so a surviving "
                         "broker needs --brokers 2 or more")
    overrides = parse_sets(args.set)
    params = {"controllers": args.controllers, "brokers": args.brokers, "fault": args.fault,
              "engine": engine_overrides(args, overrides)}
    failed = 0
    with Runner(SCENARIO, args, params) as runner:
        cluster = runner.cluster(controllers=args.controllers, brokers=args.brokers, overrides=overrides)
        for round_no in range(args.rounds):
            leader = runner.trio_run(_leader, cluster)
            broker = next(b for b in cluster.brokers if b.node_id != leader[0])
            if round_no == 0:
                runner.phase("warm-up", f"create {args.warmup_topics} topics through broker {broker.node_id}")
                warm = runner.trio_run(_warm_up, broker, args.warmup_topics)
            runner.phase("measure", f"round {round_no + 1}/{args.rounds}: {args.fault} controller {leader[0]} "
                                    f"(epoch {leader[1]})")
            t0 = runner.inject(cluster, leader[0], args.fault)
            clocks = runner.trio_run(_watch, cluster, broker, leader, t0, args.timeout,
                                     f"cf-{runner.run_id}-{round_no}")
            for metric, key in (("controller_election_ms", "election"), ("controller_failover_ms", "write")):
                if key in clocks:
                    runner.row(metric, clocks[key] * 1000, "ms")
            failed += "write" not in clocks
            runner.table(f"round {round_no + 1}: {args.fault} controller {leader[0]} (ms after the signal)", [
                ("new leader elected", _ms(clocks.get("election")), f"controller {clocks.get('new_leader', '-')}"),
                ("CreateTopics succeeds again", _ms(clocks.get("write")), f"{clocks['attempts']} attempts"),
                ("CreateTopics before the fault", _ms(warm), "median of the warm-up")])
            if round_no + 1 < args.rounds:
                runner.restart(cluster, leader[0])
        runner.finish()
    return 0 if failed == 0 else 1


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1000:,.0f}"


def _voters(cluster: Any, exclude: int | None = None) -> list[tuple[str, int]]:
    return [(n.host, n.port) for n in cluster.controllers if n.node_id != exclude and n.is_running()]


async def _leader(cluster: Any) -> tuple[int, int]:
    import trio

    from bench.cluster_probes import active_controller

    with trio.move_on_after(30):
        while (found := await active_controller(cluster)) is None:
            await trio.sleep(0.1)
        return found
    raise BenchError("no active controller (quorum leader, or /controller znode) after 30 s")


async def _warm_up(broker: Any, topics: int) -> float | None:
    """Create `topics` topics one by one through `broker`; the median seconds each took."""
    import statistics

    from bench.cluster_probes import create_topics

    took = []
    for i in range(topics):
        t = time.monotonic()
        name = f"warm-up-{i}"
        codes = await create_topics(broker.host, broker.port, {name: 1}, timeout_ms=30_000)
        if codes.get(name) not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS, on a re-used cluster
            raise BenchError(f"warm-up CreateTopics of {name} failed with error code {codes.get(name)}")
        took.append(time.monotonic() - t)
    return statistics.median(took) if took else None


async def _watch(cluster: Any, broker: Any, old: tuple[int, int], t0: float, timeout_s: float,
                 prefix: str) -> dict[str, Any]:
    import trio

    from bench.cluster_probes import (
        PROBE_ERRORS,
        active_controller,
        create_topics,
        quorum_leader,
        topic_partitions,
    )

    clocks: dict[str, Any] = {"attempts": 0}
    survivors = _voters(cluster, exclude=old[0])

    async def ask(voter: tuple[str, int] | None) -> tuple[int, int] | None:
        return await (active_controller(cluster) if voter is None else quorum_leader([voter]))

    async def election() -> None:
        while True:
            for voter in (survivors if cluster.mode != "zk" else [None]):
                found = await ask(voter)
                if found is not None and found[0] != old[0] and found[1] > old[1]:
                    clocks["election"] = time.monotonic() - t0
                    clocks["new_leader"] = found[0]
                    return
            await trio.sleep(POLL_S)

    async def attempt(name: str, limiter: trio.CapacityLimiter, done: trio.Event) -> None:
        async with limiter:
            try:
                codes = await create_topics(broker.host, broker.port, {name: 1}, timeout_ms=5000)
            except PROBE_ERRORS:
                return
        if codes.get(name) != 0:
            return
        # Made, and usable: the broker lists it with a leader (a ZooKeeper-mode broker answers once
        # the znodes are written, before any controller has elected a leader).
        while "write" not in clocks:
            try:
                leaders = await topic_partitions(broker.host, broker.port, [name], 1000)
            except PROBE_ERRORS:
                leaders = {}
            if leaders.get((name, 0), -1) >= 0:
                clocks.setdefault("write", time.monotonic() - t0)
                done.set()
                return
            await trio.sleep(POLL_S)

    async def writes() -> None:
        limiter, done = trio.CapacityLimiter(MAX_IN_FLIGHT), trio.Event()
        async with trio.open_nursery() as attempts:
            while not done.is_set():
                if limiter.available_tokens:
                    clocks["attempts"] += 1
                    attempts.start_soon(attempt, f"{prefix}-{clocks['attempts']}", limiter, done)
                with trio.move_on_after(ATTEMPT_EVERY_S):
                    await done.wait()
            attempts.cancel_scope.cancel()

    # trio's clock is not time.monotonic: the deadline is relative.
    with trio.move_on_after(max(0.0, t0 + timeout_s - time.monotonic())):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(election)
            nursery.start_soon(writes)
    return clocks
