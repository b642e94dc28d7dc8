"""ZooKeeper mode: the baseline raftka's KRaft quorum is measured against and migrated from.

Real ZooKeeper (the Debian `zookeeper` package) holds the metadata in
Kafka's znode layout (`znodes`); a controller inside one broker, elected
through the ephemeral `/controller` znode and fenced by `/controller_epoch`,
pushes state to brokers with LeaderAndIsr / UpdateMetadata / StopReplica
(`messages`).

Pure cores: `znodes`, `messages`, `context`, `batch`, `decisions`
(`ZkControllerCore`) and `broker_metadata` (`ZkMetadataCache`: controller
requests -> `MetadataImage`). I/O shells: `ensemble` (start ZooKeeper),
`store` (the controller's kazoo calls), `controller` (`ZkController`, trio),
`channel` (requests to brokers), `broker_side` (registration, leader ISR
writes), `admin` (topic znodes) and `broker_channel` (`ZkBrokerChannel`: a
broker's admin requests and AlterPartition as znode writes).

`broker.shell.zk_link.run_zk_broker` assembles a ZooKeeper-mode broker process
from these (`raftka broker` with `zookeeper.connect` and no
`process.roles`); `cluster.LocalCluster(mode="zk")` starts an
ensemble and such brokers.
"""

from quorum.zookeeper.admin import (
    TopicAdminError,
    add_partitions,
    assign_replicas,
    create_topic,
    delete_topic,
    set_topic_config,
)
from quorum.zookeeper.broker_channel import ZkBrokerChannel
from quorum.zookeeper.broker_metadata import ZkMetadataCache, zk_state_to_image, zk_state_to_records
from quorum.zookeeper.broker_side import (
    BrokerIdInUseError,
    ZkBrokerRegistration,
    ensure_cluster_paths,
    get_or_create_cluster_id,
    notify_isr_changes,
    register_broker,
    write_isr_change,
)
from quorum.zookeeper.channel import ControllerChannelManager, LocalBrokerSender
from quorum.zookeeper.controller import BrokerRequestSender, ZkController
from quorum.zookeeper.decisions import ZkControllerConfig, ZkControllerCore
from quorum.zookeeper.ensemble import ZooKeeperEnsemble, zookeeper_missing_reason
from quorum.zookeeper.errors import (
    ControllerMovedError,
    EnsembleError,
    MalformedZNodeError,
    StaleZNodeVersionError,
    ZooKeeperModeError,
)
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment

__all__ = [
    "BrokerIdInUseError",
    "BrokerInfo",
    "BrokerRequestSender",
    "ControllerChannelManager",
    "ControllerMovedError",
    "EnsembleError",
    "LocalBrokerSender",
    "MalformedZNodeError",
    "NamedPartition",
    "PartitionState",
    "StaleZNodeVersionError",
    "TopicAdminError",
    "TopicAssignment",
    "ZkBrokerChannel",
    "ZkBrokerRegistration",
    "ZkController",
    "ZkControllerConfig",
    "ZkControllerCore",
    "ZkMetadataCache",
    "ZooKeeperEnsemble",
    "ZooKeeperModeError",
    "add_partitions",
    "assign_replicas",
    "create_topic",
    "delete_topic",
    "ensure_cluster_paths",
    "get_or_create_cluster_id",
    "notify_isr_changes",
    "register_broker",
    "set_topic_config",
    "write_isr_change",
    "zk_state_to_image",
    "zk_state_to_records",
    "zookeeper_missing_reason",
]
