"""Dual write: committed metadata changes during the migration reach the znodes,
fenced by the controller epoch the KRaft controller claimed; brokers still in
ZooKeeper mode get the same state through LeaderAndIsr/UpdateMetadata."""

import uuid

import pytest
from kazoo.client import KazooClient

from quorum.metadata.image import LoggedRecord
from quorum.metadata.records import (
    ConfigRecord,
    ConfigResourceType,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from quorum.migration.copy import migration_records
from quorum.migration.dual_write import zk_broker_requests, zk_writes
from quorum.migration.zk_io import apply_dual_writes, claim_controller, read_zk_state, release
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_metadata import ZkMetadataCache
from quorum.zookeeper.broker_side import write_isr_change
from quorum.zookeeper.errors import ControllerMovedError
from quorum.zookeeper.znodes import NamedPartition

from migration_testing import ZK_CONTROLLER_EPOCH, image_of, zk_cluster

KRAFT_ID = 3000


def migrated(zk):
    zk_cluster(zk)
    zk_epoch, epoch_version = claim_controller(zk, KRAFT_ID, 9, 0)
    state = read_zk_state(zk)
    image = image_of(migration_records(state))
    versions = {tp: s.zk_version for tp, s in state.states.items()}
    return image, zk_epoch, epoch_version, versions


def apply(image, records):
    start = image.offset + 1
    return image.apply(LoggedRecord(start + i, 2, r) for i, r in enumerate(records))


def assert_zk_describes(zk, image):
    """ZooKeeper holds exactly the image's topics, partitions (leader, epoch, ISR) and topic configs."""
    state = read_zk_state(zk)
    assert {n: a.topic_id for n, a in state.topics.items()} == dict(image.topic_ids_by_name)
    for name, topic_id in image.topic_ids_by_name.items():
        topic = image.topics_by_id[topic_id]
        assert {p: r.replicas for p, r in topic.partitions.items()} == dict(state.topics[name].partitions)
        for p, reg in topic.partitions.items():
            s = state.states.get(NamedPartition(name, p))
            if reg.leader == -1 and s is None:
                continue  # offline before and after: no state znode, as in ZooKeeper mode
            assert (s.leader, s.leader_epoch, s.isr) == (reg.leader, reg.leader_epoch, reg.isr), (name, p)
        assert state.topic_configs[name] == dict(image.topic_config(name)), name


def test_claim_fences_the_zookeeper_controller(zk):
    zk_cluster(zk)
    zk_epoch, epoch_version = claim_controller(zk, KRAFT_ID, 9, 0)
    assert zk_epoch == ZK_CONTROLLER_EPOCH + 1
    data, stat = zk.get(z.CONTROLLER_PATH)
    held = z.decode_controller(data)
    assert (held.broker_id, held.kraft_controller_epoch) == (KRAFT_ID, 9)
    assert stat.ephemeralOwner == 0, "persistent: ZooKeeper-mode brokers never win it during the migration"
    # A ZooKeeper-mode controller's write, fenced by the epoch zkVersion it had, fails.
    t = zk.transaction()
    t.check(z.CONTROLLER_EPOCH_PATH, epoch_version - 1)
    t.set_data(z.partition_state_path("orders", 0), b"{}")
    assert isinstance(t.commit()[0], Exception)
    # Rollback hands /controller back to ZooKeeper mode.
    release(zk)
    assert zk.exists(z.CONTROLLER_PATH) is None


def test_topic_creation_isr_change_config_and_deletion_reach_the_znodes(zk):
    image, zk_epoch, epoch_version, versions = migrated(zk)
    orders = image.topic_ids_by_name["orders"]
    new_id = uuid.UUID(int=77)
    after = apply(image, [
        TopicRecord("payments", new_id),
        PartitionRecord(new_id, 0, (1, 2, 3), (1, 2, 3), 1),
        PartitionRecord(new_id, 1, (2, 3, 1), (2, 3, 1), 2),
        ConfigRecord(ConfigResourceType.TOPIC, "payments", "min.insync.replicas", "2"),
        PartitionChangeRecord(orders, 0, isr=(1,)),                   # ISR shrink
        PartitionChangeRecord(orders, 1, leader=2, isr=(2, 3)),       # leader change
        ConfigRecord(ConfigResourceType.TOPIC, "orders", "retention.ms", "60000"),
        RemoveTopicRecord(image.topic_ids_by_name["logs"]),
        ConfigRecord(ConfigResourceType.BROKER, "", "log.retention.hours", "24"),
        ProducerIdsRecord(broker_id=1, broker_epoch=0, next_producer_id=2000),
    ])
    writes = zk_writes(image, after, versions, zk_epoch)
    versions.update(apply_dual_writes(zk, epoch_version, writes, versions))
    assert_zk_describes(zk, after)
    assert zk.exists(z.topic_path("logs")) is None and zk.exists(z.topic_config_path("logs")) is None
    assert z.decode_entity_config("/config/brokers/<default>", zk.get("/config/brokers/<default>")[0]) == {
        "log.retention.hours": "24"}
    changes = [z.decode_config_change(zk.get(f"{z.CONFIG_CHANGES_PATH}/{c}")[0])
               for c in zk.get_children(z.CONFIG_CHANGES_PATH)]
    assert "topics/orders" in changes and "brokers/<default>" in changes, "ZooKeeper-mode brokers are told"
    assert z.decode_producer_id_block(zk.get(z.PRODUCER_ID_BLOCK_PATH)[0]).block_end == 1999, \
        "after a rollback, ZooKeeper mode hands out producer ids after the quorum's"
    state = z.decode_partition_state("orders", 1, *zk.get(z.partition_state_path("orders", 1))[:1],
                                     zk.exists(z.partition_state_path("orders", 1)).version)
    assert state.controller_epoch == zk_epoch and state.leader_epoch == 3

    # A later change writes on top, conditional on the zkVersion the first one left.
    later = apply(after, [PartitionChangeRecord(orders, 0, isr=(1, 2))])
    apply_dual_writes(zk, epoch_version, zk_writes(after, later, versions, zk_epoch), versions)
    assert_zk_describes(zk, later)


def test_log_wins_over_a_zookeeper_mode_leaders_concurrent_isr_write(zk):
    image, zk_epoch, epoch_version, versions = migrated(zk)
    orders = image.topic_ids_by_name["orders"]
    tp = NamedPartition("orders", 2)
    current = read_zk_state(zk).states[tp]
    write_isr_change(zk, tp, current, (3,))  # a ZooKeeper-mode leader shrinks the ISR meanwhile
    after = apply(image, [PartitionChangeRecord(orders, 2, leader=1, isr=(1,))])
    versions.update(apply_dual_writes(zk, epoch_version, zk_writes(image, after, versions, zk_epoch), versions))
    assert_zk_describes(zk, after)
    assert versions[tp] == read_zk_state(zk).states[tp].zk_version


def test_a_newer_controller_fences_dual_writes(zk, zk_connect):
    image, zk_epoch, epoch_version, versions = migrated(zk)
    other = KazooClient(zk_connect)
    other.start(10)
    try:
        claim_controller(other, KRAFT_ID + 1, 10, 0)  # the next active KRaft controller
    finally:
        other.stop()
        other.close()
    after = apply(image, [PartitionChangeRecord(image.topic_ids_by_name["orders"], 0, isr=(1,))])
    with pytest.raises(ControllerMovedError):
        apply_dual_writes(zk, epoch_version, zk_writes(image, after, versions, zk_epoch), versions)
    assert read_zk_state(zk).states[NamedPartition("orders", 0)].isr == (1, 2), "nothing written"


def test_zookeeper_mode_brokers_get_the_logs_state(zk):
    image, zk_epoch, _, versions = migrated(zk)
    state = read_zk_state(zk)
    caches = {b: ZkMetadataCache(b) for b in state.brokers}
    for b, cache in caches.items():
        cache.broker_epoch = state.brokers[b].broker_epoch

    def deliver(requests):
        for r in requests:
            caches[r.broker_id].handle(r.request)

    deliver(zk_broker_requests(None, image, state.brokers, KRAFT_ID, zk_epoch, zk_versions=versions))
    orders = image.topic_ids_by_name["orders"]
    after = apply(image, [PartitionChangeRecord(orders, 1, leader=2, isr=(2, 3))])
    deliver(zk_broker_requests(image, after, state.brokers, KRAFT_ID, zk_epoch, zk_versions=versions))
    for b, cache in caches.items():
        for name in ("orders",):
            mine, theirs = cache.image.topic(name), after.topic(name)
            assert mine.topic_id == theirs.topic_id
            for p, reg in theirs.partitions.items():
                got = mine.partitions[p]
                assert (got.leader, got.leader_epoch, got.isr, got.replicas) == (
                    reg.leader, reg.leader_epoch, reg.isr, reg.replicas), (b, p)
        assert sorted(cache.image.brokers) == [1, 2, 3]
