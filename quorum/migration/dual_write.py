"""Dual write: each committed metadata change, as ZooKeeper writes and ZooKeeper-mode broker requests.

Theory of operation
-------------------
While the cluster is in MIGRATION (KIP-866 "dual-write mode"), the metadata
log is the source of truth and ZooKeeper is kept as a current copy, so that
a rollback to ZooKeeper mode loses nothing. After every committed image the
driver calls

    zk_writes(before, after, zk_versions, zk_controller_epoch) -> DualWrites

with the image ZooKeeper last received and the new one. It compares them
(unchanged topics and config resources are the same objects in both images,
so the walk is cheap) and returns:

* `transactions` (`ZkTransaction`s, each applied as one multi fenced by the
  `/controller_epoch` zkVersion the KRaft controller claimed):
  - a removed topic: delete `/brokers/topics/<t>` (recursively) and
    `/config/topics/<t>`; removals go first, so a topic re-created under the
    same name is deleted, then created;
  - a new topic: `/config/topics/<t>`, then `/brokers/topics/<t>` with its
    topic id and assignment, then one state znode per partition (Kafka's
    order: the config exists before anyone sees the topic);
  - a changed partition: its state znode, conditional on the zkVersion
    ZooKeeper has (`zk_versions`, kept by the driver: KRaft's partition
    epoch may advance by several records between two writes, the zkVersion
    by one); new partitions also rewrite the topic's assignment;
* `configs`: `(path, config)` to upsert -- topic configs of existing
  topics and broker configs -- each followed by a `/config/changes`
  notification (`entity_path`) so ZooKeeper-mode brokers reload them.

Producer ids the quorum hands out are written to `/latest_producer_id_block`,
so ZooKeeper mode goes on after them after a rollback.

Broker registrations are not written: a ZooKeeper-mode broker registers its
own ephemeral znode, and a KRaft-mode broker has none -- after a rollback it
is restarted in ZooKeeper mode and registers again.

`zk_broker_requests` is the other half of dual-write mode: brokers still
in ZooKeeper mode get their metadata only from a controller's LeaderAndIsr
and UpdateMetadata, and the KRaft controller now holds `/controller`, so it
sends them (as Kafka's `KRaftMigrationDriver` does through its
`LegacyPropagator`). Partition epochs are KRaft's; leader epochs are the
same in both worlds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quorum.metadata.image import MetadataImage, TopicImage
from quorum.metadata.records import ConfigResourceType
from quorum.migration.copy import broker_config_entity
from quorum.zookeeper import znodes as z
from quorum.zookeeper.batch import RequestBatch
from quorum.zookeeper.context import (
    BrokerRequest,
    ControllerContext,
    CreateZNode,
    DeleteZNode,
    SetZNode,
    ZkTransaction,
)
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment

_EMPTY: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class DualWrites:
    transactions: tuple[ZkTransaction, ...] = ()
    #: (znode path, full config, entity path for the /config/changes notification)
    configs: tuple[tuple[str, Mapping[str, str], str], ...] = ()
    #: partitions whose state znode a transaction writes (the driver tracks their zkVersions)
    partitions: frozenset[NamedPartition] = field(default_factory=frozenset)

    @property
    def empty(self) -> bool:
        return not (self.transactions or self.configs)


def partition_state(p, zk_controller_epoch: int) -> PartitionState:
    """A KRaft partition registration as ZooKeeper's state znode content."""
    return PartitionState(p.leader, p.leader_epoch, p.isr, zk_controller_epoch)


def topic_assignment(topic: TopicImage) -> TopicAssignment:
    partitions = dict(topic.partitions.items())
    return TopicAssignment({i: p.replicas for i, p in partitions.items()}, topic.topic_id,
                           {i: p.adding_replicas for i, p in partitions.items() if p.adding_replicas},
                           {i: p.removing_replicas for i, p in partitions.items() if p.removing_replicas})


def _create_topic(after: MetadataImage, topic: TopicImage, epoch: int, in_zookeeper: bool) -> ZkTransaction:
    ops: list = []
    if not in_zookeeper:
        ops += [CreateZNode(z.topic_config_path(topic.name),
                            z.encode_entity_config(dict(after.topic_config(topic.name))), make_parents=True),
                CreateZNode(z.topic_path(topic.name), z.encode_topic_assignment(topic_assignment(topic)),
                            make_parents=True)]
    ops.append(CreateZNode(z.partitions_path(topic.name), b""))
    for i, p in sorted(topic.partitions.items()):
        ops.append(CreateZNode(z.partition_path(topic.name, i), b""))
        ops.append(CreateZNode(z.partition_state_path(topic.name, i),
                               z.encode_partition_state(partition_state(p, epoch))))
    return ZkTransaction(tuple(ops))


def zk_writes(before: MetadataImage, after: MetadataImage, zk_versions: Mapping[NamedPartition, int],
              zk_controller_epoch: int, in_zookeeper: frozenset = frozenset()) -> DualWrites:
    """What ZooKeeper must be told so that it describes `after` instead of `before`.

    `in_zookeeper`: ids of new topics whose config and assignment znodes a
    ZooKeeper-mode broker wrote itself (it took the CreateTopics); only
    their partition states are written."""
    removals: list[ZkTransaction] = []
    creations: list[ZkTransaction] = []
    changes: list[ZkTransaction] = []
    written: set[NamedPartition] = set()
    for topic_id, old in before.topics_by_id.items():
        new = after.topics_by_id.get(topic_id)
        if new is None or new.name != old.name:
            removals.append(ZkTransaction((DeleteZNode(z.topic_path(old.name)),
                                           DeleteZNode(z.topic_config_path(old.name)))))
    for topic_id, new in after.topics_by_id.items():
        old = before.topics_by_id.get(topic_id)
        if old is new:
            continue
        if old is None or old.name != new.name:
            creations.append(_create_topic(after, new, zk_controller_epoch, topic_id in in_zookeeper))
            written.update(NamedPartition(new.name, i) for i in new.partitions)
            continue
        grown = set(new.partitions) - set(old.partitions)
        if grown:
            changes.append(ZkTransaction((SetZNode(z.topic_path(new.name),
                                                   z.encode_topic_assignment(topic_assignment(new)), -1),)))
        for i, p in sorted(new.partitions.items()):
            tp = NamedPartition(new.name, i)
            q = old.partitions.get(i)
            if q is p:
                continue
            data = z.encode_partition_state(partition_state(p, zk_controller_epoch))
            if q is None:
                changes.append(ZkTransaction((CreateZNode(z.partition_state_path(new.name, i), data,
                                                          make_parents=True),), tp))
            elif (q.leader, q.leader_epoch, q.isr) != (p.leader, p.leader_epoch, p.isr):
                changes.append(ZkTransaction((SetZNode(z.partition_state_path(new.name, i), data,
                                                       zk_versions.get(tp, -1)),), tp))
            else:
                continue
            written.add(tp)
    configs: list[tuple[str, Mapping[str, str], str]] = []
    if after.configs is not before.configs:
        for resource, values in after.configs.items():
            if before.configs.get(resource) is values:
                continue
            configs.append(_config_write(resource, dict(values), before, after))
        for resource in before.configs:
            if resource not in after.configs:
                configs.append(_config_write(resource, _EMPTY, before, after))
    if after.next_producer_id > before.next_producer_id:
        block = z.ProducerIdBlock(-1, before.next_producer_id, after.next_producer_id - 1)
        changes.append(ZkTransaction((SetZNode(z.PRODUCER_ID_BLOCK_PATH, z.encode_producer_id_block(block), -1),)))
    return DualWrites(tuple(removals + creations + changes), tuple(c for c in configs if c is not None),
                      frozenset(written))


def _config_write(resource, values, before: MetadataImage, after: MetadataImage):
    if resource.type == ConfigResourceType.TOPIC:
        name = resource.name
        old_id, new_id = before.topic_ids_by_name.get(name), after.topic_ids_by_name.get(name)
        if new_id is None or old_id != new_id:
            return None  # created or removed with its topic
        return z.topic_config_path(name), values, f"topics/{name}"
    entity = broker_config_entity(resource.name)
    return f"/config/brokers/{entity}", values, f"brokers/{entity}"


# --- requests to brokers still in ZooKeeper mode ------------------------------------------------


def _context(image: MetadataImage, zk_brokers: Mapping[int, BrokerInfo], controller_id: int,
             zk_controller_epoch: int, zk_versions: Mapping[NamedPartition, int]) -> ControllerContext:
    ctx = ControllerContext(controller_id, zk_controller_epoch)
    for b, reg in image.brokers.items():
        if not reg.fenced:
            ctx.live_brokers[b] = BrokerInfo(b, reg.endpoints, reg.rack)
    ctx.live_brokers.update(zk_brokers)
    for _, topic in sorted(image.topics_by_id.items(), key=lambda kv: kv[1].name):
        ctx.add_topic(topic.name, topic_assignment(topic))
        for i, p in topic.partitions.items():
            tp = NamedPartition(topic.name, i)
            ctx.states[tp] = PartitionState(p.leader, p.leader_epoch, p.isr, zk_controller_epoch,
                                            zk_versions.get(tp, p.partition_epoch))
    return ctx


def zk_broker_requests(before: MetadataImage | None, after: MetadataImage, zk_brokers: Mapping[int, BrokerInfo],
                       controller_id: int, zk_controller_epoch: int, inter_broker_listener: str = "PLAINTEXT",
                       zk_versions: Mapping[NamedPartition, int] | None = None,
                       force: Iterable[NamedPartition] = ()) -> tuple[BrokerRequest, ...]:
    """LeaderAndIsr/UpdateMetadata/StopReplica for the ZooKeeper-mode brokers `zk_brokers`.

    `before` None: everything (a full LeaderAndIsr and UpdateMetadata each),
    as a new controller sends; otherwise only what changed since `before`.
    The partition epoch sent is the state znode's zkVersion (`zk_versions`)
    where known: a ZooKeeper-mode leader writes its ISR changes conditional
    on it. `force`: partitions to send even if unchanged (their leader wrote
    a state the log refused).
    """
    if not zk_brokers:
        return ()
    zk_versions = zk_versions or {}
    ctx = _context(after, zk_brokers, controller_id, zk_controller_epoch, zk_versions)
    batch = RequestBatch(ctx, inter_broker_listener)
    targets = sorted(zk_brokers)
    if before is None:
        for b in targets:
            batch.full_leader_and_isr(b)
        batch.update_metadata(targets, ctx.all_partitions())
        return batch.build()
    changed: list[NamedPartition] = []
    for topic_id, new in after.topics_by_id.items():
        old = before.topics_by_id.get(topic_id)
        if old is new:
            continue
        for i, p in new.partitions.items():
            if old is None or old.partitions.get(i) is not p:
                changed.append(NamedPartition(new.name, i))
    known = set(changed)
    changed += [tp for tp in sorted(force) if tp not in known and tp in ctx.states]
    for tp in changed:
        batch.leader_and_isr([b for b in ctx.replicas(tp) if b in zk_brokers], tp,
                             is_new=before.topic(tp.topic) is None)
    brokers_moved = {b: r.fenced for b, r in before.brokers.items()} != {b: r.fenced for b, r in after.brokers.items()}
    batch.update_metadata(targets, ctx.all_partitions() if brokers_moved else changed)
    for topic_id, old in before.topics_by_id.items():
        if topic_id not in after.topics_by_id:
            ctx.add_topic(old.name, topic_assignment(old))
            for i, p in old.partitions.items():
                tp = NamedPartition(old.name, i)
                ctx.states[tp] = PartitionState(p.leader, p.leader_epoch, p.isr, zk_controller_epoch,
                                                zk_versions.get(tp, p.partition_epoch))
            batch.topic_deleted(old.name)
            ctx.remove_topic(old.name)
    return batch.build()
