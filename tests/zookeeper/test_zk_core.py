"""The pure ZooKeeper-mode controller core: elections, ISR shrink, topics, deletion, lost races.

Runs without ZooKeeper: `CoreHarness` answers the core's writes and feeds
its requests to per-broker metadata caches, so each test checks what the
brokers end up believing.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.zookeeper import messages as m
from quorum.zookeeper import znodes as z
from quorum.zookeeper.context import BrokersChanged, IsrChangesNotified, TopicDeletionRequested, TopicsChanged
from quorum.zookeeper.znodes import NamedPartition as TP
from quorum.zookeeper.znodes import PartitionState as S

from zk_core_testing import CoreHarness, broker, topic

THREE = {b: broker(b) for b in (1, 2, 3)}


def test_failover_tells_every_broker_everything():
    h = CoreHarness(epoch=5)
    h.failover(THREE, {"t": topic({0: (1, 2, 3), 1: (2, 3, 1)})},
               {TP("t", 0): S(1, 3, (1, 2, 3), 4), TP("t", 1): S(2, 0, (2, 3, 1), 4)})
    for b in THREE:
        (lai,) = h.requests_to(b, m.LeaderAndIsrRequest)
        assert lai.type == m.LEADER_AND_ISR_FULL and lai.controller_epoch == 5 and lai.broker_epoch == 100 + b
        assert {ps.partition_index for t in lai.topic_states for ps in t.partition_states} == {0, 1}
        assert h.leader_seen_by(b, "t", 0) == 1 and h.leader_seen_by(b, "t", 1) == 2
        reg = h.caches[b].image.topic("t").partitions[0]
        assert (reg.leader_epoch, reg.partition_epoch, reg.isr) == (3, 0, (1, 2, 3))
    # Nothing needed electing: ZooKeeper is untouched.
    assert h.state("t", 0).zk_version == 0


def test_failover_elects_for_partitions_whose_leader_is_gone_and_drops_dead_isr_members():
    h = CoreHarness()
    live = {b: broker(b) for b in (2, 3)}
    h.failover(live, {"t": topic({0: (1, 3, 2)})}, {TP("t", 0): S(1, 7, (1, 2, 3), 4)})
    # First live ISR member in replica order (3 before 2), one leader epoch more, ISR without 1.
    assert h.state("t", 0) == S(3, 8, (2, 3), 5, zk_version=1)
    assert h.leader_seen_by(2, "t", 0) == 3


def test_broker_failure_moves_leaders_and_shrinks_isrs():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2, 3), 1: (2, 1, 3), 2: (3, 2)})},
               {TP("t", 0): S(1, 0, (1, 2, 3), 5), TP("t", 1): S(2, 0, (2, 1, 3), 5), TP("t", 2): S(3, 0, (3, 2), 5)})
    h.sent.clear()
    h.brokers_changed({2: THREE[2], 3: THREE[3]})
    assert h.state("t", 0) == S(2, 1, (2, 3), 5, zk_version=1)
    # Kafka's ZooKeeper-mode controller bumps the leader epoch on an ISR shrink too.
    assert h.state("t", 1) == S(2, 1, (2, 3), 5, zk_version=1)
    assert h.state("t", 2).zk_version == 0  # broker 1 hosts nothing of partition 2
    for b in (2, 3):
        assert h.leader_seen_by(b, "t", 0) == 2
        assert h.caches[b].image.brokers[1].fenced
    assert not h.requests_to(1, m.UpdateMetadataRequest)


def test_no_live_isr_member_goes_offline_unless_the_topic_allows_unclean_election():
    for configs, expected in [({}, S(-1, 1, (1,), 5, zk_version=1)),
                              ({"t": {"unclean.leader.election.enable": "true"}}, S(2, 1, (2,), 5, zk_version=1))]:
        h = CoreHarness(configs=configs)
        h.failover(THREE, {"t": topic({0: (1, 2)})}, {TP("t", 0): S(1, 0, (1,), 5)})
        h.brokers_changed({2: THREE[2], 3: THREE[3]})
        assert h.state("t", 0) == expected
        assert h.leader_seen_by(2, "t", 0) == expected.leader


def test_offline_partition_comes_back_with_its_last_isr_member():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2)})}, {TP("t", 0): S(1, 0, (1,), 5)})
    h.brokers_changed({3: THREE[3]})
    assert h.state("t", 0).leader == -1
    h.brokers_changed({1: broker(1, epoch=500), 3: THREE[3]})
    assert h.state("t", 0) == S(1, 2, (1,), 5, zk_version=2)
    (lai, *_) = h.requests_to(1, m.LeaderAndIsrRequest)[-1:]
    assert lai.broker_epoch == 500
    assert h.leader_seen_by(1, "t", 0) == 1


def test_bounced_broker_loses_leadership_to_a_live_isr_member():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2)})}, {TP("t", 0): S(1, 0, (1, 2), 5)})
    h.brokers_changed({1: broker(1, epoch=999), 2: THREE[2], 3: THREE[3]})
    assert h.state("t", 0).leader == 2 and h.state("t", 0).isr == (2,)
    # The restarted broker hears about everything again.
    assert h.requests_to(1, m.LeaderAndIsrRequest)[-1].type == m.LEADER_AND_ISR_FULL


def test_new_topic_gets_states_and_is_new_leader_and_isr():
    h = CoreHarness()
    h.failover({1: THREE[1], 2: THREE[2]}, {})
    h.run(TopicsChanged(frozenset({"new"}), {"new": topic({0: (3, 1), 1: (2, 1), 2: (3,)}, n=9)}))
    assert h.state("new", 0) == S(1, 0, (1,), 5, zk_version=0)
    assert h.state("new", 1) == S(2, 0, (2, 1), 5, zk_version=0)
    assert z.partition_state_path("new", 2) not in h.znodes  # no live replica: stays uninitialized
    lai = h.requests_to(1, m.LeaderAndIsrRequest)[-1]
    assert all(ps.is_new for t in lai.topic_states for ps in t.partition_states)
    # Broker 3 arrives: the waiting partition is initialized with it.
    h.brokers_changed(THREE)
    assert h.state("new", 2) == S(3, 0, (3,), 5, zk_version=0)
    assert h.leader_seen_by(3, "new", 2) == 3


def test_topic_deletion_waits_for_dead_replicas_then_removes_everything():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2)}), "u": topic({0: (3,)}, n=2)},
               {TP("t", 0): S(1, 0, (1, 2), 5), TP("u", 0): S(3, 0, (3,), 5)})
    h.znodes[z.topic_path("t")] = (b"{}", 0)
    h.znodes[z.delete_topic_path("t")] = (b"", 0)
    h.brokers_changed({1: THREE[1], 3: THREE[3]})
    h.run(TopicDeletionRequested(frozenset({"t"})))
    assert z.topic_path("t") in h.znodes and h.caches[1].image.topic("t") is not None
    h.brokers_changed(THREE)
    assert z.topic_path("t") not in h.znodes and z.partition_state_path("t", 0) not in h.znodes
    assert z.delete_topic_path("t") not in h.znodes
    for b in THREE:
        assert h.caches[b].image.topic("t") is None and h.caches[b].image.topic("u") is not None
    (stop,) = h.requests_to(2, m.StopReplicaRequest)
    assert stop.topic_states[0].partition_states[0].delete_partition
    assert "t" not in h.core.ctx.topics


def test_isr_change_notification_reaches_every_broker():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2, 3)})}, {TP("t", 0): S(1, 0, (1,), 5)})
    expanded = h.plant_state(TP("t", 0), S(1, 0, (1, 2, 3), 5))
    h.znodes["/isr_change_notification/isr_change_0000000001"] = (b"", 0)
    h.run(IsrChangesNotified(("isr_change_0000000001",), {TP("t", 0): expanded}))
    for b in THREE:
        assert h.caches[b].image.topic("t").partitions[0].isr == (1, 2, 3)
    assert "/isr_change_notification/isr_change_0000000001" not in h.znodes


def test_write_lost_to_a_leaders_isr_change_is_retried_from_the_fresh_state():
    h = CoreHarness()
    h.failover(THREE, {"t": topic({0: (1, 2, 3)})}, {TP("t", 0): S(1, 0, (1, 2), 5)})
    # While the controller handles broker 1's death, leader 1's last ISR expansion lands.
    h.run(BrokersChanged({2: THREE[2], 3: THREE[3]}), conflicts={TP("t", 0): S(1, 0, (1, 2, 3), 5)})
    assert h.state("t", 0) == S(2, 1, (2, 3), 5, zk_version=2)
    assert not h.resigned


def test_state_written_by_a_newer_controller_makes_this_one_resign():
    h = CoreHarness(epoch=5)
    h.failover(THREE, {"t": topic({0: (1, 2, 3)})}, {TP("t", 0): S(1, 0, (1, 2, 3), 5)})
    h.sent.clear()
    h.run(BrokersChanged({2: THREE[2], 3: THREE[3]}), conflicts={TP("t", 0): S(3, 1, (3, 2), 6)})
    assert h.resigned and not h.core.active
    assert h.sent == []  # nothing decided after losing reaches a broker


def test_brokers_refuse_a_deposed_controllers_requests():
    old = CoreHarness(epoch=5)
    old.failover(THREE, {"t": topic({0: (1, 2)})}, {TP("t", 0): S(1, 0, (1, 2), 5)})
    cache = old.caches[2]
    new_umr = m.UpdateMetadataRequest(controller_id=3, controller_epoch=6, topic_states=(), live_brokers=())
    assert cache.handle(new_umr).error_code == 0
    stale = old.requests_to(2, m.LeaderAndIsrRequest)[0]
    assert cache.handle(stale).error_code == m.ErrorCode.stale_controller_epoch


@settings(deadline=None)
@given(st.lists(st.frozensets(st.sampled_from([1, 2, 3, 4])), min_size=1, max_size=12))
def test_random_broker_churn_keeps_states_valid(lives):
    brokers = {b: broker(b) for b in (1, 2, 3, 4)}
    h = CoreHarness(configs={"u": {"unclean.leader.election.enable": "true"}})
    assignment = {0: (1, 2, 3), 1: (2, 3, 4), 2: (4, 1), 3: (3,)}
    h.failover(brokers, {"t": topic(assignment), "u": topic({0: (1, 4)}, n=2)})
    generation = {b: 0 for b in brokers}
    epochs = {}
    for live in lives:
        for b in live:
            generation[b] += 1
        h.brokers_changed({b: broker(b, epoch=1000 * generation[b] + b) for b in sorted(live)})
        for (name, parts) in (("t", assignment), ("u", {0: (1, 4)})):
            for p, replicas in parts.items():
                path = z.partition_state_path(name, p)
                if path not in h.znodes:
                    continue
                s = h.state(name, p)
                assert s.isr and set(s.isr) <= set(replicas)
                assert s.leader == -1 or (s.leader in s.isr and s.leader in live)
                if any(r in live for r in s.isr):
                    assert s.leader != -1, f"{name}-{p} offline with live ISR member: {s}"
                assert s.leader_epoch >= epochs.get((name, p), 0)
                epochs[(name, p)] = s.leader_epoch
                for b in live:
                    if b in replicas:
                        assert h.leader_seen_by(b, name, p) == s.leader


def test_brokers_image_matches_the_image_built_straight_from_zookeeper():
    from quorum.zookeeper.broker_metadata import zk_state_to_image

    h = CoreHarness()
    topics = {"t": topic({0: (1, 2, 3), 1: (2, 3, 1)}), "u": topic({0: (3, 1)}, n=2)}
    h.failover(THREE, topics, {TP("t", 0): S(1, 3, (1, 2, 3), 4), TP("t", 1): S(2, 0, (2, 3), 4),
                               TP("u", 0): S(3, 1, (3, 1), 4)})
    states = {TP(t, p): h.state(t, p) for t, a in topics.items() for p in a.partitions}
    direct = zk_state_to_image(THREE, topics, states, {"u": {"retention.ms": "1000"}})
    for b in THREE:
        seen = h.caches[b].image
        assert dict(seen.topic_ids_by_name.items()) == dict(direct.topic_ids_by_name.items())
        for name in topics:
            assert dict(seen.topic(name).partitions.items()) == dict(direct.topic(name).partitions.items())
        assert {i: r.endpoints for i, r in seen.brokers.items()} == {i: r.endpoints for i, r in direct.brokers.items()}
    assert direct.topic_config("u")["retention.ms"] == "1000"
