"""Broker registration, heartbeats, session fencing, controlled shutdown, unregistration."""

import uuid

from controller_testing import Cluster
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.errors import ErrorCode
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest

from quorum.controller import ControllerConfig
from quorum.metadata import BrokerRegistrationChangeRecord, RegisterBrokerRecord


def test_registration_epoch_is_the_offset_of_the_record():
    c = Cluster()
    r1 = c.register(1)
    r2 = c.register(2)
    assert r1.error_code == r2.error_code == ErrorCode.none
    assert isinstance(c.log[r1.broker_epoch], RegisterBrokerRecord) and c.log[r1.broker_epoch].broker_id == 1
    assert c.image.brokers[2].epoch == r2.broker_epoch
    assert c.image.brokers[1].fenced  # a new registration starts fenced


def test_same_incarnation_reregistering_is_idempotent():
    c = Cluster()
    first = c.register(1)
    log_length = len(c.log)
    again = c.register(1, incarnation=c.incarnations[1])
    assert again.broker_epoch == first.broker_epoch
    assert len(c.log) == log_length  # no new record


def test_other_incarnation_of_a_live_broker_is_a_duplicate():
    c = Cluster()
    c.start_brokers(1)
    c.now_ms = 5000
    r = c.register(1)  # a second process with the same node.id
    assert r.error_code == ErrorCode.duplicate_broker_registration
    assert c.image.brokers[1].usable


def test_new_incarnation_after_session_expiry_gets_a_new_epoch_and_leaves_isrs():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", partitions=1, rf=2)
    old_epoch = c.image.brokers[1].epoch
    p = c.partition("t")
    c.now_ms = 20_000  # broker 1 crashed and came back after its session ran out
    c.heartbeat(p.replicas[1])
    r = c.register(1)
    assert r.error_code == ErrorCode.none and r.broker_epoch > old_epoch
    assert c.image.brokers[1].fenced
    p = c.partition("t")
    assert 1 not in p.isr and p.leader == 2


def test_registration_for_another_cluster_is_refused():
    c = Cluster(ControllerConfig(cluster_id="prod"))
    r = c.send(BrokerRegistrationRequest(broker_id=1, cluster_id="test", incarnation_id=uuid.uuid4(),
                                         listeners=(), features=(), rack=None))
    assert r.error_code == ErrorCode.inconsistent_cluster_id
    assert not c.log


def test_heartbeat_with_stale_epoch_is_refused():
    c = Cluster()
    epoch = c.register(1).broker_epoch
    r = c.heartbeat(1, epoch=epoch - 1)
    assert r.error_code == ErrorCode.stale_broker_epoch
    assert c.heartbeat(7).error_code == ErrorCode.broker_id_not_registered


def test_broker_is_unfenced_only_once_caught_up_and_not_wanting_fence():
    c = Cluster()
    epoch = c.register(1).broker_epoch
    behind = c.heartbeat(1, offset=epoch - 1)
    assert behind.is_fenced and not behind.is_caught_up and c.image.brokers[1].fenced
    wants = c.heartbeat(1, want_fence=True)
    assert wants.is_fenced and c.image.brokers[1].fenced
    caught_up = c.heartbeat(1, offset=epoch)
    assert caught_up.is_caught_up and not caught_up.is_fenced
    assert isinstance(c.log[-1], BrokerRegistrationChangeRecord) and c.log[-1].fenced is False
    assert c.image.brokers[1].usable


def test_tick_fences_a_broker_whose_session_expired_and_moves_its_leadership():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", partitions=3, rf=3)
    for now in (3000, 6000, 9000):
        c.now_ms = now
        c.heartbeat(2)
        c.heartbeat(3)
    assert c.tick(9000) == []  # exactly the timeout: not yet
    assert c.controller.next_deadline_ms(c.image) == 9001
    fenced = c.tick(9001)
    assert fenced and c.image.brokers[1].fenced and c.image.brokers[2].usable
    for index in range(3):
        p = c.partition("t", index)
        assert p.leader in (2, 3) and 1 not in p.isr
    assert c.tick(9500) == []  # nothing more to do, and no double fencing


def test_fencing_bumps_epochs_of_every_changed_partition():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", partitions=2, rf=2)
    before = {i: c.partition("t", i) for i in range(2)}
    c.now_ms = 5000
    c.heartbeat(2)
    c.tick(10_000)
    for i in range(2):
        after = c.partition("t", i)
        assert after.partition_epoch == before[i].partition_epoch + 1
        assert after.leader_epoch == before[i].leader_epoch + (before[i].leader == 1)


def test_new_active_controller_grants_every_broker_a_fresh_session():
    c = Cluster()
    c.start_brokers(1)
    c.now_ms = 8000
    c.failover()
    assert c.tick(12_000) == []  # 12 s since the last heartbeat, but only 4 s since failover
    assert c.tick(17_001)
    assert c.image.brokers[1].fenced


def test_controlled_shutdown_moves_leaders_first_then_lets_the_broker_go():
    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", partitions=6, rf=3)
    c.create_topic("solo", assignments={0: [1]})
    led_by_1 = [i for i in range(6) if c.partition("t", i).leader == 1]
    assert led_by_1
    first = c.heartbeat(1, want_shut_down=True)
    assert not first.should_shut_down and not first.is_fenced
    assert c.image.brokers[1].in_controlled_shutdown
    for i in range(6):
        p = c.partition("t", i)
        assert p.leader in (2, 3) and 1 not in p.isr
    solo = c.partition("solo")
    assert solo.leader == -1 and solo.isr == (1,)  # no one else can lead; the ISR keeps its last member
    second = c.heartbeat(1, want_shut_down=True)
    assert second.should_shut_down and second.is_fenced and c.image.brokers[1].fenced
    assert c.image.leader_count(1) == 0
    # A broker shutting down never receives new replicas.
    c.create_topic("later", partitions=4, rf=2)
    assert all(1 not in c.partition("later", i).replicas for i in range(4))


def test_fenced_broker_asking_to_shut_down_may_go_at_once():
    c = Cluster()
    c.register(1)
    r = c.heartbeat(1, want_shut_down=True)
    assert r.should_shut_down and r.is_fenced


def test_unregister_removes_the_broker_and_its_isr_memberships():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", partitions=2, rf=2)
    r = c.send(UnregisterBrokerRequest(broker_id=1))
    assert r.error_code == ErrorCode.none
    assert 1 not in c.image.brokers
    assert all(c.partition("t", i).leader == 2 and c.partition("t", i).isr == (2,) for i in range(2))
    again = c.send(UnregisterBrokerRequest(broker_id=1))
    assert again.error_code == ErrorCode.broker_id_not_registered


def test_controller_config_reads_kafka_keys_from_the_node_config():
    from common.config import NodeConfig
    node = NodeConfig.from_properties({
        "node.id": "1", "process.roles": "controller", "log.dirs": "/tmp/x",
        "controller.quorum.voters": "1@127.0.0.1:9093", "broker.session.timeout.ms": "3000",
        "num.partitions": "3", "default.replication.factor": "2", "unclean.leader.election.enable": "true"})
    config = ControllerConfig.from_node_config(node, cluster_id="c")
    assert config == ControllerConfig(broker_session_timeout_ms=3000, num_partitions=3, default_replication_factor=2,
                                      unclean_leader_election_enable=True, cluster_id="c")
    c = Cluster(config)
    c.start_brokers(1)
    assert c.tick(3001) and c.image.brokers[1].fenced


def _fenced_leader_of(c: Cluster, broker_id: int, topics: dict[str, int]) -> None:
    """`topics` (name -> partitions) with `broker_id` the leader of every partition, RF=3 on 1, 2, 3."""
    others = [b for b in (1, 2, 3) if b != broker_id]
    for name, n in topics.items():
        c.create_topic(name, assignments={i: [broker_id, *others] for i in range(n)})


def _fenced(batch: int, topics: dict[str, int]) -> Cluster:
    """Brokers 1, 2, 3; broker 1 leads every partition of `topics` and is
    fenced at 9001 ms, moving `batch` partitions per tick."""
    c = Cluster(ControllerConfig(fence_moves_per_batch=batch))
    c.start_brokers(1, 2, 3)
    _fenced_leader_of(c, 1, topics)
    c.now_ms = 8000
    c.heartbeat(2)
    c.heartbeat(3)
    c.tick(9001)
    return c


def test_fencing_a_broker_that_leads_many_partitions_moves_them_a_batch_per_tick():
    c = _fenced(4, {"a": 6, "b": 4})
    # The fence record first, with the first batch of moves, in (topic, partition) order.
    assert isinstance(c.log[-5], BrokerRegistrationChangeRecord) and c.log[-5].fenced
    assert c.image.brokers[1].fenced
    assert [c.partition("a", i).leader for i in range(6)] == [2, 2, 2, 2, 1, 1]
    assert c.controller.next_deadline_ms(c.image) == 0  # more moves owed: tick again at once
    assert c.controller.cluster.moves_owed == 6  # what the controller's log line counts
    assert len(c.tick(9002)) == 4
    assert [c.partition("a", i).leader for i in range(6)] == [2] * 6
    assert [c.partition("b", i).leader for i in range(4)] == [2, 2, 1, 1]
    assert c.controller.cluster.moves_owed == 2
    assert len(c.tick(9003)) == 2
    assert all(1 not in c.partition(t, i).isr for t, n in (("a", 6), ("b", 4)) for i in range(n))
    assert c.tick(9004) == [] and c.controller.next_deadline_ms(c.image) != 0
    assert c.controller.cluster.moves_owed == 0


def test_moves_owed_to_a_fenced_broker_pass_over_a_topic_deleted_meanwhile():
    c = _fenced(2, {"a": 2, "b": 2, "c": 2})
    assert c.partition("a", 1).leader == 2 and c.partition("b", 0).leader == 1
    c.send(dt_req.DeleteTopicsRequest(topics=(dt_req.DeleteTopicState(name="b", topic_id=None),), timeout=0))
    # b's partitions are gone: the next batch is c's (a record for b would not replay).
    moves = c.tick(9002)
    assert {r.topic_id for r in moves} == {c.image.topic("c").topic_id}
    assert [c.partition("c", i).leader for i in range(2)] == [2, 2]
    assert c.tick(9003) == []


def test_a_fenced_broker_back_before_its_moves_are_done_is_not_moved_off():
    c = _fenced(2, {"a": 4})
    c.heartbeat(1)  # caught up and unfenced again before the next tick
    assert not c.image.brokers[1].fenced
    assert c.tick(9002) == []
    assert [c.partition("a", i).leader for i in range(4)] == [2, 2, 1, 1]
    assert c.controller.next_deadline_ms(c.image) != 0


def test_a_new_active_controller_finishes_the_moves_the_last_one_owed():
    c = _fenced(3, {"a": 7})
    assert [c.partition("a", i).leader for i in range(7)] == [2, 2, 2, 1, 1, 1, 1]
    c.failover()  # the soft state is lost; the image says broker 1 is fenced
    assert c.controller.next_deadline_ms(c.image) == 0
    c.tick(9100)
    c.tick(9101)
    assert [c.partition("a", i).leader for i in range(7)] == [2] * 7
    assert c.tick(9102) == []


def test_a_controlled_shutdown_moves_a_bounded_batch_per_heartbeat(monkeypatch):
    from quorum.controller import cluster_control

    monkeypatch.setattr(cluster_control, "MAX_CHANGES_PER_BATCH", 4)
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("a", assignments={i: [1, 2] for i in range(10)})
    before = len(c.log)
    first = c.heartbeat(1, want_shut_down=True)
    assert not first.should_shut_down
    assert len(c.log) - before == 1 + 4  # the shutdown mark and one batch of moves
    rounds = 1
    while not c.heartbeat(1, want_shut_down=True).should_shut_down:
        rounds += 1
        assert rounds < 10
    assert rounds == 3  # 4 + 4 + 2 moves, then let go
    assert all(c.partition("a", i).leader == 2 and c.partition("a", i).isr == (2,) for i in range(10))


def test_a_returning_broker_gets_its_leaders_a_batch_at_a_time(monkeypatch):
    from quorum.controller import cluster_control

    monkeypatch.setattr(cluster_control, "MAX_CHANGES_PER_BATCH", 4)
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("a", partitions=10)
    assert c.heartbeat(1, want_shut_down=True).should_shut_down is False
    while not c.heartbeat(1, want_shut_down=True).should_shut_down:
        pass
    assert all(c.partition("a", i).leader == -1 for i in range(10))
    c.register(1)
    assert not c.heartbeat(1).is_fenced  # unfenced with the first 4 leaders
    assert sum(c.partition("a", i).leader == 1 for i in range(10)) == 4
    assert c.controller.next_deadline_ms(c.image) == 0  # the rest at the next ticks, at once
    assert len(c.tick(c.now_ms + 1)) == 4
    assert len(c.tick(c.now_ms + 1)) == 2
    assert all(c.partition("a", i).leader == 1 for i in range(10))
    assert c.tick(c.now_ms + 1) == [] and c.controller.next_deadline_ms(c.image) != 0


def test_replicas_assigned_to_an_offline_log_dir_leave_isrs_and_leadership():
    """KIP-858's messages: a broker lists its failed dir in heartbeats and
    assigns the dir's replicas to it; those alone move, its others stay."""
    from kio.schema.assign_replicas_to_dirs.v0 import request as ard_req
    from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest

    c = Cluster()
    c.start_brokers(1, 2, 3)
    c.create_topic("t", partitions=6, rf=3)
    topic_id = c.image.topic("t").topic_id
    led_by_1 = [i for i in range(6) if c.partition("t", i).leader == 1]
    lost, kept = led_by_1[:1], [i for i in range(6) if i not in led_by_1[:1]]
    dead_dir = uuid.uuid4()

    def assign(dir_id):
        return c.send(ard_req.AssignReplicasToDirsRequest(
            broker_id=1, broker_epoch=c.image.brokers[1].epoch, directories=(ard_req.DirectoryData(
                id_=dir_id, topics=(ard_req.TopicData(topic_id=topic_id, partitions=tuple(
                    ard_req.PartitionData(partition_index=i) for i in lost)),)),)))

    live = {1, 2, 3}
    # Not (yet) reported offline: an assignment records the dir, and moves nothing.
    assert assign(dead_dir).error_code == ErrorCode.none
    assert all(c.partition("t", i).leader == 1 for i in lost)
    assert all(c.partition("t", i).directory(1) == dead_dir for i in lost)
    assert all(c.partition("t", i).offline_replicas(live, c.image.offline_log_dirs()) == [] for i in range(6))
    c.send(BrokerHeartbeatRequest(broker_id=1, broker_epoch=c.image.brokers[1].epoch,
                                  current_metadata_offset=c.image.offset, want_fence=False, want_shut_down=False,
                                  offline_log_dirs=(dead_dir,)))
    assert c.image.brokers[1].offline_log_dirs == {dead_dir}
    answer = assign(dead_dir)
    assert answer.error_code == ErrorCode.none
    assert {p.error_code for d in answer.directories for t in d.topics for p in t.partitions} == {ErrorCode.none}
    for i in lost:
        p = c.partition("t", i)
        assert p.leader in (2, 3) and 1 not in p.isr
        # What Metadata lists as the partition's offline replicas.
        assert p.offline_replicas(live, c.image.offline_log_dirs()) == [1]
    for i in kept:
        assert 1 in c.partition("t", i).isr
        assert c.partition("t", i).offline_replicas(live, c.image.offline_log_dirs()) == []
    assert not c.image.brokers[1].fenced
