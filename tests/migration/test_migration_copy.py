"""The copy of a ZooKeeper-mode cluster's metadata into the log is complete and identical.

The znodes are written as a ZooKeeper-mode cluster writes them (broker
registrations, `admin.create_topic`, state znodes rewritten by a controller)
into a real ZooKeeper; the copy is read back through `read_zk_state` and
replayed into a `MetadataImage`, which is what every KRaft broker serves.
"""

from quorum.metadata.image import ConfigResource
from quorum.metadata.records import (
    NO_LEADER,
    ConfigResourceType,
    ZkMigrationState,
    ZkMigrationStateRecord,
    decode_record,
    encode_record,
)
from quorum.migration.copy import brokers_ready, migration_records
from quorum.migration.zk_io import read_zk_state

from migration_testing import broker_info, image_of, zk_cluster


def test_copy_holds_every_topic_partition_epoch_and_config(zk):
    written = zk_cluster(zk)
    state = read_zk_state(zk)
    records = migration_records(state)
    assert records[-1] == ZkMigrationStateRecord(ZkMigrationState.MIGRATION), "the batch ends in MIGRATION"
    assert [decode_record(encode_record(r)) for r in records] == records
    image = image_of(records)
    assert image.zk_migration_state == ZkMigrationState.MIGRATION

    assert state.cluster_id == written["cluster_id"]
    # topics keep their ids, so clients and log dirs (partition.metadata) agree
    assert dict(image.topic_ids_by_name) == {"orders": written["orders"].topic_id, "logs": written["logs"].topic_id}
    orders = image.topic("orders")
    expected = {  # partition: (replicas, leader, leader_epoch, isr, partition epoch = zkVersion)
        0: ((1, 2), 1, 7, (1, 2), written["versions"][("orders", 0)]),
        1: ((2, 3), 3, 2, (3,), written["versions"][("orders", 1)]),
        2: ((3, 1), 3, 0, (3, 1), written["versions"][("orders", 2)]),
    }
    assert written["versions"][("orders", 0)] == 5
    for p, (replicas, leader, leader_epoch, isr, partition_epoch) in expected.items():
        reg = orders.partitions[p]
        assert (reg.replicas, reg.leader, reg.leader_epoch, reg.isr, reg.partition_epoch) == (
            replicas, leader, leader_epoch, isr, partition_epoch), p
    offline = image.topic("logs").partitions[0]
    assert offline.leader == NO_LEADER and offline.replicas == (2,)

    assert dict(image.topic_config("orders")) == {"retention.ms": "3600000", "cleanup.policy": "compact"}
    assert dict(image.configs[ConfigResource(ConfigResourceType.BROKER, "")]) == {"log.retention.hours": "12"}
    assert dict(image.configs[ConfigResource(ConfigResourceType.BROKER, "2")]) == {"log.cleaner.threads": "2"}

    assert image.next_producer_id == 1000, "producer ids handed out in ZooKeeper mode are never handed out again"

    assert sorted(image.brokers) == [1, 2, 3]
    for b, reg in image.brokers.items():
        assert not reg.fenced, "ZooKeeper-mode brokers keep serving through the copy"
        assert (reg.endpoints, reg.rack) == (broker_info(b).endpoints, broker_info(b).rack)


def test_copy_waits_for_every_expected_broker(zk):
    zk_cluster(zk, brokers=(1, 2))
    state = read_zk_state(zk)
    assert brokers_ready(state, {1, 2, 3}) == (False, [3])
    assert brokers_ready(state, {1, 2}) == (True, [])
    assert brokers_ready(state, ()) == (True, [])
