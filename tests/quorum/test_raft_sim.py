"""Deterministic simulation of the metadata quorum under faults.

Hypothesis draws whole scenarios: 3 or 5 voters plus 1-2 observers, network
delay/drop/duplication (hence reordering), partitions, crashes that lose
unflushed writes, crashes in the middle of handling an event, paused
processes, graceful resignations; a second property draws voter additions
and removals among those faults (KIP-853), a third lost disks: the node
comes back formatted again with a new directory id, and the operator
removes its old identity and adds the new one. After every event the invariants of
`sim/invariants.py` are checked; after the faults heal, a new record must
commit everywhere within bounded simulated time. A failure names the seed
and the scenario; replay it with `run_scenario(scenario)`.

The default (fast) profile runs 4x its max_examples (200); the thorough
profile (RAFTKA_HYPOTHESIS_PROFILE=thorough) runs 8,000.
"""

from __future__ import annotations

import dataclasses

from hypothesis import example, given, settings

from quorum.raft import RaftUsageError

from sim.cluster import Fault, Scenario, SimCluster, run_scenario
from sim.network import NetworkConditions
from sim.schedule import reconfiguring_scenarios, scenarios, wiping_scenarios

SCENARIOS = settings(settings(), max_examples=settings().max_examples * 4)


@SCENARIOS
@given(scenarios())
@example(
    # A restarted voter learned a new leader's stale follower-time HW, lower
    # than the HW it had reported before its crash.
    Scenario(
        seed=2490,
        voters=3,
        observers=1,
        conditions=NetworkConditions(min_delay_ms=1, max_delay_ms=40, duplicate_rate=0.05),
        faults=(Fault(0, "crash", 2, 765, 5), Fault(1438, "crash", 0, 37, 5)),
        snapshot_every_bytes=10**9,
    )
)
def test_quorum_stays_safe_and_live_under_faults(scenario: Scenario) -> None:
    result = run_scenario(scenario)
    assert result.committed > 0


@SCENARIOS
@given(reconfiguring_scenarios())
def test_quorum_stays_safe_and_live_while_voters_are_added_and_removed(scenario: Scenario) -> None:
    """KIP-853: voters join and leave (one change at a time, each committed
    by the old majority first) among crashes, partitions and lost messages;
    still one leader per epoch and no committed record lost."""
    result = run_scenario(scenario)
    assert result.committed > 0


@settings(settings(), max_examples=settings().max_examples * 2)
@given(wiping_scenarios())
def test_quorum_stays_safe_and_live_when_disks_are_wiped_and_replaced(scenario: Scenario) -> None:
    """KIP-853: a controller whose disk is lost comes back with its node id
    and a new directory id. Until the operator removed its old identity and
    added the new one it never stands, votes or counts toward the high
    watermark as the voter it was (checked on every message), and no
    committed record is lost."""
    result = run_scenario(scenario)
    assert result.committed > 0
    assert result.replacements <= result.wipes


def test_a_wiped_voter_serves_as_an_observer_until_it_is_replaced() -> None:
    cluster = SimCluster(_quiet(seed=13))
    for node in cluster.nodes.values():
        cluster.at(0, lambda node=node: node.start(cluster.now_ms))
    cluster.at(1, cluster.propose)
    cluster.run_until(800)
    (leader,) = [n for n in cluster.nodes.values() if n.is_leader()]
    wiped = next(n for n in cluster.nodes.values() if n.node_id in cluster.voters and n is not leader)
    old_directory = wiped.directory_id
    wiped.crash(cluster.rng)
    wiped.wipe(*cluster.discover_voters())
    wiped.start(cluster.now_ms)
    assert wiped.directory_id != old_directory
    cluster.run_until(cluster.now_ms + 1000)
    # On its empty disk it is an observer: the leader still records the old
    # identity, and does not count the node's fetches as that voter's.
    assert wiped.core is not None and not wiped.core.is_voter and wiped.core.role == "Follower"
    assert leader.core.recorded_directory_id(wiped.node_id) == old_directory
    assert leader.core.state.voter_states[wiped.node_id].last_fetch_ms < 800
    assert wiped.core.high_watermark == leader.core.high_watermark > 0
    # The operator removes the old identity, then adds the new one.
    cluster.replacing = (wiped, True)
    cluster.replace_step()
    cluster.run_until(cluster.now_ms + 2000)
    assert cluster.replacing is None and cluster.replacements == 1
    assert [sorted(v) for _, v in cluster.voter_changes] == [
        sorted(cluster.voters - {wiped.node_id}), sorted(cluster.voters)]
    assert leader.is_leader() and leader.core.recorded_directory_id(wiped.node_id) == wiped.directory_id
    assert wiped.core.is_voter and wiped.core.high_watermark == leader.core.high_watermark
    assert len(cluster.invariants.leaders) == 1


def test_a_leader_grows_the_quorum_from_one_to_three_and_removes_itself() -> None:
    cluster = SimCluster(dataclasses.replace(_quiet(seed=5, voters=1), observers=2))
    for node in cluster.nodes.values():
        cluster.at(0, lambda node=node: node.start(cluster.now_ms))
    cluster.at(1, cluster.propose)
    cluster.run_until(500)
    (leader,) = [n for n in cluster.nodes.values() if n.is_leader()]
    assert leader.core is not None and leader.node_id == 1
    observer = 100
    for voters in ({1, observer}, {1, observer, 101}, {observer, 101}):
        _, out = leader.core.change_voters(voters, cluster.now_ms)
        cluster.note_voters(leader)
        leader.obey(out, cluster.now_ms)
        # a second change waits until this one is committed
        try:
            leader.core.change_voters(voters ^ {99}, cluster.now_ms)
        except RaftUsageError:
            pass
        else:
            raise AssertionError("a second voter change started before the first committed")
        cluster.run_until(cluster.now_ms + 600)
    # the leader removed itself: once that committed it resigned, and a voter of the new set leads
    cluster.run_until(cluster.now_ms + 2000)
    leaders = [n for n in cluster.nodes.values() if n.is_leader()]
    assert len(leaders) == 1 and leaders[0].node_id != 1
    new_voters = leaders[0].core.voters
    assert new_voters == {observer, 101}
    assert all(n.core.voters == new_voters for n in cluster.nodes.values() if n.core is not None)
    assert not cluster.nodes[1].core.is_voter


def _quiet(seed: int, voters: int = 3, faults: tuple[Fault, ...] = ()) -> Scenario:
    return Scenario(
        seed=seed,
        voters=voters,
        observers=1,
        conditions=NetworkConditions(),
        faults=faults,
        snapshot_every_bytes=10**9,
    )


def test_a_healthy_quorum_elects_once_and_commits_every_proposal() -> None:
    result = run_scenario(_quiet(seed=7, voters=5))
    assert len(result.leaders) == 1
    # the LeaderChange record plus every proposal made before the last check
    assert result.committed >= result.proposals


def test_an_isolated_voter_rejoining_does_not_disrupt_the_leader() -> None:
    """KIP-996: the cut-off voter pre-votes in its old epoch and is refused,
    so when the partition heals the leader keeps its epoch."""
    cluster = SimCluster(_quiet(seed=11))
    for node in cluster.nodes.values():
        cluster.at(0, lambda node=node: node.start(cluster.now_ms))
    cluster.at(1, cluster.propose)
    cluster.run_until(1000)
    (leader,) = [n for n in cluster.nodes.values() if n.is_leader()]
    assert leader.core is not None
    epoch = leader.core.epoch
    follower = next(n for n in cluster.nodes.values() if n.is_voter and n is not leader)
    cluster.network.partition([{follower.node_id}, set(cluster.nodes) - {follower.node_id}])
    cluster.run_until(4000)
    assert follower.core is not None and follower.core.role in ("Prospective", "Unattached", "Follower")
    assert follower.core.epoch == epoch, "a partitioned voter must not bump the epoch by itself"
    cluster.network.heal()
    cluster.run_until(6000)
    assert leader.is_leader() and leader.core.epoch == epoch
    assert list(cluster.invariants.leaders) == [epoch]
    assert follower.core.high_watermark == leader.core.high_watermark or follower.core.role == "Follower"


def test_a_crashed_leader_is_replaced_and_committed_records_survive() -> None:
    cluster = SimCluster(_quiet(seed=3))
    for node in cluster.nodes.values():
        cluster.at(0, lambda node=node: node.start(cluster.now_ms))
    cluster.at(1, cluster.propose)
    cluster.run_until(800)
    (leader,) = [n for n in cluster.nodes.values() if n.is_leader()]
    committed_before = dict(cluster.invariants.committed)
    assert len(committed_before) > 10
    leader.crash(cluster.rng)
    cluster.run_until(2500)
    new_leaders = [n for n in cluster.nodes.values() if n.is_leader()]
    assert len(new_leaders) == 1 and new_leaders[0] is not leader
    new_leader = new_leaders[0]
    assert new_leader.core is not None
    for offset, value in committed_before.items():
        (batch,) = new_leader.disk.batches(offset, offset + 1)
        assert (batch.epoch, batch.control, batch.records[offset - batch.base_offset]) == value
    leader.start(cluster.now_ms)
    assert leader.core is not None and leader.core.role == "Resigned"
    cluster.run_until(4000)
    assert leader.core.role == "Follower"
    assert leader.core.high_watermark is not None and leader.core.high_watermark > max(committed_before)
