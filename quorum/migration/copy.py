"""ZooKeeper's metadata as one batch of KRaft records (KIP-866's "metadata migration").

Theory of operation
-------------------
`ZkClusterState` is everything a ZooKeeper-mode cluster keeps that the
metadata log must hold after the migration, read in one pass
(`zk_io.read_zk_state`): broker registrations, topics with their ids and
assignments, every partition state (leader, ISR, leader epoch, zkVersion),
topic configs and broker configs (`/config/brokers/<id>`, and
`/config/brokers/<default>` as the cluster default, which KRaft names "").

`migration_records(state)` turns it into the records of one atomic batch
(KIP-868 metadata transactions are not needed: one batch is atomic):

* RegisterBroker per live broker, unfenced, with the stand-in incarnation
  id `broker_metadata.incarnation_id(b)`: a broker later restarted in
  KRaft mode registers again with a fresh incarnation, which the image
  tells apart;
* Topic + Partition per partition: the leader epoch is ZooKeeper's, the
  partition epoch is the state znode's zkVersion (what Kafka sends brokers
  as the partition epoch), so no broker sees an epoch go backwards;
* Config per topic and broker config key;
* ProducerIds with the end of `/latest_producer_id_block`: without it the
  quorum would hand out producer ids from 0 again, and an idempotent
  producer given a ZooKeeper-era id would be refused by the partitions that
  remember that id's sequence numbers (OUT_OF_ORDER_SEQUENCE_NUMBER);
* last, ZkMigrationStateRecord(MIGRATION): the batch commits whole or not
  at all, and a controller that finds MIGRATION in its image knows the copy
  is done and only dual-writes from then on.

`brokers_ready` is the gate before the copy: every expected broker is
registered in `/brokers/ids` (the migrate command passes the ids it knows;
KIP-866 gates on the brokers' own "migration ready" registration with the
quorum, which raftka's ZooKeeper-mode broker does not send).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quorum.metadata.image import MetadataImage
from quorum.metadata.records import (
    NO_LEADER,
    ConfigRecord,
    ConfigResourceType,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RemoveTopicRecord,
    TopicRecord,
    ZkMigrationState,
    ZkMigrationStateRecord,
)
from quorum.zookeeper.broker_metadata import zk_state_to_records
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment

#: `/config/brokers/<default>` holds the cluster-wide broker defaults; KRaft names that resource "".
DEFAULT_BROKER_ENTITY = "<default>"


@dataclass(frozen=True, slots=True)
class ZkClusterState:
    """What a ZooKeeper-mode cluster holds, as read at one moment."""

    cluster_id: str | None
    controller_epoch: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicAssignment]
    states: Mapping[NamedPartition, PartitionState]
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: entity name ("<default>" or a broker id) -> config overrides
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the first producer id not handed out yet (`/latest_producer_id_block`'s end + 1; 0: none handed out)
    next_producer_id: int = 0


def broker_config_resource_name(entity: str) -> str:
    return "" if entity == DEFAULT_BROKER_ENTITY else entity


def broker_config_entity(resource_name: str) -> str:
    return DEFAULT_BROKER_ENTITY if resource_name == "" else resource_name


def migration_records(state: ZkClusterState) -> list[Record]:
    """The one batch that moves `state` into the metadata log, ending in ZkMigrationState(MIGRATION)."""
    out = zk_state_to_records(state.brokers, state.topics, state.states, state.topic_configs)
    for entity, config in sorted(state.broker_configs.items()):
        name = broker_config_resource_name(entity)
        out += [ConfigRecord(ConfigResourceType.BROKER, name, k, v) for k, v in sorted(config.items())]
    if state.next_producer_id > 0:
        out.append(ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=state.next_producer_id))
    out.append(ZkMigrationStateRecord(ZkMigrationState.MIGRATION))
    return out


def brokers_ready(state: ZkClusterState, expected_broker_ids: Iterable[int]) -> tuple[bool, list[int]]:
    """(ready, missing): every expected broker registered in `/brokers/ids`, and at least one broker."""
    missing = sorted(set(expected_broker_ids) - set(state.brokers))
    return bool(state.brokers) and not missing, missing


# --- admin done through znodes while migrating ------------------------------------------------


def zk_admin_records(working: MetadataImage, created: Mapping[str, TopicAssignment],
                     configs: Mapping[str, Mapping[str, str]], deleted: Iterable[str]) -> list[Record]:
    """Records for topics a ZooKeeper-mode broker created or marked for deletion in ZooKeeper.

    During the migration the KRaft controller holds `/controller`, so it does
    a ZooKeeper controller's part for them (KIP-866 forwards such requests to
    the quorum instead; raftka's ZooKeeper-mode broker writes znodes): a new
    topic's partitions get the first usable replica as leader and the usable
    replicas as ISR (none usable: offline), leader and partition epoch 0, as
    a ZooKeeper controller initializes them; a deletion removes the topic.
    """
    out: list[Record] = []
    for name, a in sorted(created.items()):
        if a.topic_id is None or name in working.topic_ids_by_name or a.topic_id in working.topics_by_id:
            continue
        out.append(TopicRecord(name=name, topic_id=a.topic_id))
        for p, replicas in sorted(a.partitions.items()):
            usable = tuple(r for r in replicas if working.is_usable(r))
            out.append(PartitionRecord(topic_id=a.topic_id, partition=p, replicas=tuple(replicas),
                                       isr=usable or tuple(replicas), leader=usable[0] if usable else NO_LEADER))
        out += [ConfigRecord(ConfigResourceType.TOPIC, name, k, v) for k, v in sorted(configs.get(name, {}).items())]
    for name in sorted(set(deleted)):
        topic_id = working.topic_ids_by_name.get(name)
        if topic_id is not None:
            out.append(RemoveTopicRecord(topic_id))
    return out


def zk_config_records(written: MetadataImage, zk_configs: Mapping[str, Mapping[str, str]]) -> list[Record]:
    """ConfigRecords for topic config changes a ZooKeeper-mode broker wrote to `/config/topics/<t>`.

    `written` is the image ZooKeeper was last brought up to, so a difference
    between it and ZooKeeper is ZooKeeper's own change (not a change of the
    log that dual write has yet to carry over)."""
    out: list[Record] = []
    for name, config in sorted(zk_configs.items()):
        if name not in written.topic_ids_by_name:
            continue
        current = dict(written.topic_config(name))
        out += [ConfigRecord(ConfigResourceType.TOPIC, name, k, v) for k, v in sorted(config.items())
                if current.get(k) != v]
        out += [ConfigRecord(ConfigResourceType.TOPIC, name, k, None) for k in sorted(current.keys() - config.keys())]
    return out
