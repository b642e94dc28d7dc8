"""Deterministic simulation of data-partition replication under faults.

Hypothesis draws whole scenarios (see `replication_sim.schedule`): one or
two partitions replicated on three brokers, min.insync.replicas 2 or 3,
network delay and loss, crashes that lose unflushed writes (Kafka's default:
no fsync per append) -- some tearing the last write --, brokers isolated
from everyone, from the controller only or from the other brokers only, and
flaky links. acks=all producers and a consumer run throughout. After every
event the invariants of `replication_sim.invariants` are checked; after the
faults heal, every partition must get back to a full ISR with identical
logs. A failure prints the last events and a `run_scenario(...)` line that
replays it exactly.

Default profile: 2x max_examples (100) safe-mode scenarios and 30 with
unclean leader election; thorough (RAFTKA_HYPOTHESIS_PROFILE=thorough):
4,000 and 1,000.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import example, given, settings

from replication_sim.cluster import Fault, Scenario, SimCluster, run_scenario
from replication_sim.invariants import SafetyViolation
from replication_sim.network import NetworkConditions
from replication_sim.schedule import scenarios

SCENARIOS = settings(settings(), max_examples=settings().max_examples * 2)
UNCLEAN_SCENARIOS = settings(settings(), max_examples=max(settings().max_examples // 2, 10))


@pytest.fixture(autouse=True)
def _quiet_storage_logs():
    # Crash recovery logs every torn tail it repairs; thousands of them here.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@SCENARIOS
@given(scenarios())
@example(
    # The leader shrank the ISR to itself (its follower lagged after a cut),
    # then crashed and lost its unflushed log; the controller re-elected it
    # as the only ISR member, without the records acked by two replicas.
    Scenario(seed=0, partitions=1, min_insync_replicas=2,
             conditions=NetworkConditions(min_delay_ms=1, max_delay_ms=2),
             faults=(Fault(at_ms=236, kind="crash", broker=0, duration_ms=20, arg=0),
                     Fault(at_ms=4, kind="cut_brokers", broker=0, duration_ms=181, arg=0))),
)
def test_acknowledged_records_survive_faults_within_min_insync_replicas(scenario: Scenario) -> None:
    result = run_scenario(scenario)
    assert result.acked > 0


@UNCLEAN_SCENARIOS
@given(scenarios(unclean=True))
def test_with_unclean_election_replicas_still_converge_and_hws_hold(scenario: Scenario) -> None:
    """Records may be lost (that is what the option means), but the HW of a
    leader never goes back in its epoch, consumers never read past it, and
    after healing every replica holds exactly the leader's log."""
    run_scenario(scenario)


def test_a_quiet_cluster_acknowledges_and_replicates_everything() -> None:
    result = run_scenario(Scenario(seed=11, partitions=2))
    assert result.errors == {}
    assert result.acked == result.consumed > 100
    assert result.checked >= result.acked and result.exempt == 0 and result.danger_windows == 0


def test_a_crashed_leader_is_replaced_and_no_acknowledged_record_is_lost() -> None:
    # Broker 1 leads partition 0: crash it mid-stream, keep it down 400 ms.
    result = run_scenario(Scenario(seed=5, partitions=1, faults=(Fault(300, "crash", 0, 400, 1),)))
    assert result.checked > 0 and result.exempt == 0 and result.danger_windows == 0


def test_a_leader_cut_off_from_the_controller_is_fenced_and_replaced() -> None:
    cluster = SimCluster(Scenario(seed=8, partitions=1))
    cluster.start()
    cluster.produce_until(200, 1200)
    cluster.loop.run_until(300)
    assert cluster.controller.image.topic("t").partitions[0].leader == 1
    cluster.network.cut(cluster.brokers[1].name, cluster.controller.name)
    cluster.loop.run_until(900)
    registration = cluster.controller.image.topic("t").partitions[0]
    assert registration.leader != 1 and 1 not in registration.isr
    new_leader = cluster.brokers[registration.leader]
    assert new_leader.partitions[0].is_leader
    # The old leader still thinks it leads (it missed the metadata), but with
    # its followers gone to the new leader its HW is stuck: it acknowledges nothing.
    old = cluster.brokers[1].partitions[0]
    stuck_at = old.high_watermark
    cluster.loop.run_until(1100)
    assert old.high_watermark == stuck_at
    cluster.network.heal()
    cluster.loop.run_until(1800)
    assert not cluster.brokers[1].partitions[0].is_leader
    cluster.invariants.check()


def test_the_same_scenario_replays_the_same_run() -> None:
    scenario = Scenario(seed=21, partitions=2, conditions=NetworkConditions(max_delay_ms=20, drop_rate=0.05),
                        faults=(Fault(100, "crash", 0, 300, 1), Fault(500, "cut_brokers", 1, 300, 0)))
    traces = []
    for _ in range(2):
        cluster = SimCluster(scenario)
        cluster.start()
        for fault in scenario.faults:
            cluster.schedule(fault)
        cluster.produce_until(200, 1500)
        cluster.loop.run_until(1500)
        traces.append((cluster.trace, cluster.loop.events, cluster.producer.acked))
    assert traces[0] == traces[1] and len(traces[0][0]) > 10


def test_a_broker_acting_on_metadata_from_before_its_registration_is_caught() -> None:
    """Why the shell applies partition metadata only from an image that holds
    its own new registration (KIP-631): broker 1 led at epoch 0, crashed
    (losing its unflushed log) and restarted cut off from the controller.
    Acting on its replayed metadata, it leads epoch 0 again with an empty log;
    its followers would truncate to it. The invariants see the lost records."""
    scenario = Scenario(seed=0, partitions=1, publish_before_registration=True,
                        faults=(Fault(100, "crash", 0, 20, 0), Fault(100, "cut_controller", 0, 100, 0)))
    with pytest.raises(SafetyViolation, match="is lost: leader 1 \\(epoch 0\\)"):
        run_scenario(scenario)
    run_scenario(dataclasses.replace(scenario, publish_before_registration=False))
