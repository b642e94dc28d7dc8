"""Leader election from the ISR, unclean election, AlterPartition validation, ElectLeaders."""

from controller_testing import Cluster
from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig


def expire(c: Cluster, *dead: int, now_ms: int = 20_000) -> None:
    """Let `dead` miss their heartbeats while every other broker keeps its session."""
    c.now_ms = now_ms - 1000
    for b in c.image.brokers:
        if b not in dead and c.image.brokers[b].usable:
            c.heartbeat(b)
    c.tick(now_ms)


def test_new_leader_is_the_first_live_isr_member_in_assignment_order():
    c = Cluster()
    c.start_brokers(1, 2, 3, 4)
    c.create_topic("t", assignments={0: [1, 4, 2, 3]})
    c.alter_isr("t", 0, [1, 2, 3])  # 4 fell behind
    expire(c, 1)
    p = c.partition("t")
    assert p.leader == 2  # 4 comes first in the assignment but is not in the ISR
    assert p.isr == (2, 3)


def test_last_isr_member_stays_and_the_partition_goes_offline_without_unclean_election():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.alter_isr("t", 0, [1])
    expire(c, 1)
    p = c.partition("t")
    assert (p.leader, p.isr) == (-1, (1,))
    # When broker 1 comes back it is the only one with all the data: it leads again.
    c.register(1, incarnation=c.incarnations[1])
    c.heartbeat(1)
    p = c.partition("t")
    assert (p.leader, p.isr) == (1, (1,))


def test_unclean_election_enabled_on_the_topic_elects_a_live_out_of_sync_replica():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]}, configs={"unclean.leader.election.enable": "true"})
    c.alter_isr("t", 0, [1])
    epoch = c.partition("t").leader_epoch
    expire(c, 1)
    p = c.partition("t")
    assert (p.leader, p.isr) == (2, (2,))
    assert p.leader_epoch == epoch + 1


def test_cluster_default_for_unclean_election_applies_to_topics_without_the_key():
    c = Cluster(ControllerConfig(unclean_leader_election_enable=True))
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.alter_isr("t", 0, [1])
    expire(c, 1)
    assert c.partition("t").leader == 2


def test_alter_partition_shrinks_and_expands_the_isr_and_bumps_the_partition_epoch():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2, 3]})
    r = c.alter_isr("t", 0, [1, 2])
    part = r.topics[0].partitions[0]
    assert r.error_code == part.error_code == ErrorCode.none
    assert (part.isr, part.partition_epoch, part.leader_id, part.leader_epoch) == ((1, 2), 1, 1, 0)
    assert c.partition("t").isr == (1, 2)
    r = c.alter_isr("t", 0, [1, 2, 3])
    assert r.topics[0].partitions[0].partition_epoch == 2 and c.partition("t").isr == (1, 2, 3)


def test_stale_alter_partition_is_rejected_and_changes_nothing():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2, 3]})
    c.alter_isr("t", 0, [1, 2])  # partition epoch is now 1
    before = c.partition("t")
    cases = {
        ErrorCode.invalid_update_version: dict(partition_epoch=0),
        ErrorCode.fenced_leader_epoch: dict(leader_epoch=-1),
        ErrorCode.not_controller: dict(leader_epoch=5),
        ErrorCode.invalid_request: dict(sender=2),
    }
    for expected, kwargs in cases.items():
        r = c.alter_isr("t", 0, [1], **kwargs)
        assert r.topics[0].partitions[0].error_code == expected, (expected, kwargs)
    assert c.partition("t") == before


def test_alter_partition_after_a_leader_change_is_fenced():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2, 3]})
    old = c.partition("t")
    expire(c, 1)
    # Broker 1 still thinks it leads at the old epoch (it has not seen the change).
    r = c.alter_isr("t", 0, [1, 2], sender=2, leader_epoch=old.leader_epoch, partition_epoch=old.partition_epoch)
    assert r.topics[0].partitions[0].error_code == ErrorCode.fenced_leader_epoch


def test_isr_must_contain_the_leader_and_only_replicas():
    c = Cluster()
    c.start_brokers(1, 2, 3, 4)
    c.create_topic("t", assignments={0: [1, 2, 3]})
    assert c.alter_isr("t", 0, [2, 3]).topics[0].partitions[0].error_code == ErrorCode.invalid_request
    assert c.alter_isr("t", 0, [1, 4]).topics[0].partitions[0].error_code == ErrorCode.invalid_request
    assert c.alter_isr("t", 0, [1, 1]).topics[0].partitions[0].error_code == ErrorCode.invalid_request


def test_fenced_shutting_down_or_stale_epoch_brokers_are_ineligible_for_the_isr():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", assignments={0: [1, 2, 3]})
    c.alter_isr("t", 0, [1])
    c.heartbeat(2, want_fence=True)
    assert c.alter_isr("t", 0, [1, 2]).topics[0].partitions[0].error_code == ErrorCode.ineligible_replica
    c.heartbeat(3, want_shut_down=True)
    assert c.alter_isr("t", 0, [1, 3]).topics[0].partitions[0].error_code == ErrorCode.ineligible_replica
    c.heartbeat(2)  # unfenced again
    stale = c.image.brokers[2].epoch - 1
    r = c.alter_isr("t", 0, [1, 2], isr_epochs={2: stale})
    assert r.topics[0].partitions[0].error_code == ErrorCode.ineligible_replica
    assert c.alter_isr("t", 0, [1, 2]).topics[0].partitions[0].error_code == ErrorCode.none


def test_alter_partition_from_a_stale_broker_epoch_is_refused_as_a_whole():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    old_epoch = c.image.brokers[1].epoch
    c.heartbeat(1, want_fence=True)
    c.register(1)  # broker 1 restarted: new incarnation, new epoch
    c.heartbeat(1)
    topic = c.image.topic("t")
    p = c.partition("t")
    r = c.send(ap_req.AlterPartitionRequest(broker_id=1, broker_epoch=old_epoch, topics=(ap_req.TopicData(
        topic_id=topic.topic_id, partitions=(ap_req.PartitionData(
            partition_index=0, leader_epoch=p.leader_epoch, new_isr_with_epochs=(ap_req.BrokerState(broker_id=1),),
            partition_epoch=p.partition_epoch),)),)))
    assert r.error_code == ErrorCode.stale_broker_epoch and r.topics == ()
    assert c.partition("t") == p


def elect(c: Cluster, election_type: int, partitions: dict[str, list[int]] | None):
    tps = None if partitions is None else tuple(
        el_req.TopicPartitions(topic=name, partitions=tuple(ps)) for name, ps in partitions.items())
    return c.send(el_req.ElectLeadersRequest(election_type=election_type, topic_partitions=tps))


def test_preferred_election_moves_leadership_back_to_the_first_replica():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2], 1: [2, 1]})
    expire(c, 1)
    assert c.partition("t", 0).leader == 2
    c.register(1)
    c.heartbeat(1)
    not_in_isr = elect(c, 0, {"t": [0]})
    assert not_in_isr.replica_election_results[0].partition_result[0].error_code == \
        ErrorCode.preferred_leader_not_available
    c.alter_isr("t", 0, [2, 1])
    r = elect(c, 0, {"t": [0, 1], "missing": [0]})
    codes = {(res.topic, p.partition_id): p.error_code for res in r.replica_election_results
             for p in res.partition_result}
    assert codes == {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.election_not_needed,
                     ("missing", 0): ErrorCode.unknown_topic_or_partition}
    assert c.partition("t", 0).leader == 1


def test_electing_all_partitions_reports_only_what_was_attempted():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("a", assignments={0: [1, 2], 1: [2, 1]})
    r = elect(c, 0, None)
    assert all(not res.partition_result for res in r.replica_election_results)


def test_admin_unclean_election_elects_an_out_of_sync_replica_even_when_the_topic_forbids_it():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.alter_isr("t", 0, [1])
    expire(c, 1)
    assert c.partition("t").leader == -1
    r = elect(c, 1, {"t": [0]})
    assert r.replica_election_results[0].partition_result[0].error_code == ErrorCode.none
    assert (c.partition("t").leader, c.partition("t").isr) == (2, (2,))
    again = elect(c, 1, {"t": [0]})
    assert again.replica_election_results[0].partition_result[0].error_code == ErrorCode.election_not_needed


def test_unclean_election_with_no_live_replica_reports_no_eligible_leader():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1]})
    expire(c, 1)
    r = elect(c, 1, {"t": [0]})
    assert r.replica_election_results[0].partition_result[0].error_code == ErrorCode.eligible_leaders_not_available
