"""A ZooKeeper-mode cluster's znodes, written the way its brokers and controller write them."""

from kazoo.client import KazooClient

from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.metadata.records import Endpoint
from quorum.zookeeper import admin
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_side import ensure_cluster_paths, get_or_create_cluster_id, register_broker
from quorum.zookeeper.znodes import BrokerInfo, PartitionState

ZK_CONTROLLER_EPOCH = 4


def broker_info(broker_id: int) -> BrokerInfo:
    return BrokerInfo(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", 19500 + broker_id, 0),), rack=f"r{broker_id % 2}")


def write_state(zk: KazooClient, topic: str, partition: int, state: PartitionState, rewrites: int = 0) -> int:
    """Create a partition's state znode, then rewrite it `rewrites` times (each bumps its zkVersion)."""
    path = z.partition_state_path(topic, partition)
    zk.create(path, z.encode_partition_state(state), makepath=True)
    for _ in range(rewrites):
        zk.set(path, z.encode_partition_state(state))
    return zk.exists(path).version


def zk_cluster(zk: KazooClient, brokers=(1, 2, 3)) -> dict:
    """A small ZooKeeper-mode cluster: brokers, two topics with states, topic and broker configs."""
    ensure_cluster_paths(zk)
    cluster_id = get_or_create_cluster_id(zk)
    zk.set(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(ZK_CONTROLLER_EPOCH)) if zk.exists(
        z.CONTROLLER_EPOCH_PATH) else zk.create(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(ZK_CONTROLLER_EPOCH))
    for b in brokers:
        register_broker(zk, broker_info(b))
    orders = admin.create_topic(zk, "orders", {0: (1, 2), 1: (2, 3), 2: (3, 1)},
                                {"retention.ms": "3600000", "cleanup.policy": "compact"})
    logs = admin.create_topic(zk, "logs", {0: (2,)}, {})
    versions = {
        ("orders", 0): write_state(zk, "orders", 0, PartitionState(1, 7, (1, 2), 3), rewrites=5),
        ("orders", 1): write_state(zk, "orders", 1, PartitionState(3, 2, (3,), 4), rewrites=1),
        ("orders", 2): write_state(zk, "orders", 2, PartitionState(3, 0, (3, 1), 4)),
        # logs-0 never got a state znode: an offline partition
    }
    zk.create("/config/brokers/<default>", z.encode_entity_config({"log.retention.hours": "12"}), makepath=True)
    zk.create("/config/brokers/2", z.encode_entity_config({"log.cleaner.threads": "2"}), makepath=True)
    zk.set(z.PRODUCER_ID_BLOCK_PATH, z.encode_producer_id_block(z.ProducerIdBlock(2, 0, 999)))
    return {"cluster_id": cluster_id, "orders": orders, "logs": logs, "versions": versions}


def image_of(records, start: int = 0, epoch: int = 1) -> MetadataImage:
    return MetadataImage().apply(LoggedRecord(start + i, epoch, r) for i, r in enumerate(records))
