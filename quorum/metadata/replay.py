"""Replaying metadata records onto an image.

Theory of operation
-------------------
`replay(image, records)` folds a batch of records into a new image. It
does not copy the image: an `_ImageBuilder` keeps small overlay dicts of
what the batch changed (brokers, topics and, per touched topic, the touched
partitions; configs; the derived indexes) and reads through them to the base
image, so a later record in the batch sees the earlier ones. `build()` then
writes each overlay into the base's persistent maps with one `PMap.update`,
copying only the touched paths.

A record that contradicts the image (a change to an unknown partition, a
broker epoch that does not match the registration) raises
`MetadataReplayError` and the batch is discarded: the metadata log is the
source of truth, so such a record means the writer had a bug.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from common.errors import RaftkaError
from quorum.metadata.image import (
    BrokerRegistration,
    ConfigResource,
    LoggedRecord,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
    TopicPartition,
)
from quorum.metadata.pmap import DELETE, PMap
from quorum.metadata.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ClientQuotaRecord,
    ConfigRecord,
    ConfigResourceType,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    ZkMigrationStateRecord,
    UserScramCredentialRecord,
    RemoveUserScramCredentialRecord,
    AccessControlEntryRecord,
    RemoveAccessControlEntryRecord,
)
from common.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from common.security.sasl import SCRAM_MECHANISMS, ScramCredential

_SCRAM_NAMES = {code: name for name, code in SCRAM_MECHANISMS.items()}

_EMPTY: PMap = PMap()


class MetadataReplayError(RaftkaError):
    """A metadata record contradicts the image it is applied to.

    The metadata log was written wrongly (a controller bug) or records were
    fed out of order; restore the node from a snapshot and report the bug.
    """


class _TopicBuilder:
    __slots__ = ("image", "changes")

    def __init__(self, image: TopicImage) -> None:
        self.image = image
        self.changes: dict[int, PartitionRegistration] = {}

    def get(self, partition: int) -> PartitionRegistration | None:
        p = self.changes.get(partition)
        return p if p is not None else self.image.partitions.get(partition)

    def partition_ids(self) -> set[int]:
        return set(self.image.partitions) | set(self.changes)

    def build(self) -> TopicImage:
        if not self.changes:
            return self.image
        return TopicImage(self.image.name, self.image.topic_id, self.image.partitions.update(self.changes))


class _ConfigBuilder:
    __slots__ = ("base", "cleared", "changes")

    def __init__(self, base: PMap[str, str]) -> None:
        self.base = base
        self.cleared = False
        self.changes: dict[str, Any] = {}

    def build(self) -> PMap[str, str]:
        base = _EMPTY if self.cleared else self.base
        return base.update(self.changes)


class _ImageBuilder:
    def __init__(self, base: MetadataImage) -> None:
        self.base = base
        self.offset = base.offset
        self.epoch = base.epoch
        self.next_producer_id = base.next_producer_id
        self.zk_migration_state = base.zk_migration_state
        self.scram_credentials: dict[tuple[str, str], Any] = {}
        self.scram_ever_set = base.scram_ever_set
        self.acls: dict[uuid.UUID, Any] = {}
        self.brokers: dict[int, Any] = {}
        self.topics: dict[uuid.UUID, Any] = {}
        self.names: dict[str, Any] = {}
        self.configs: dict[ConfigResource, _ConfigBuilder] = {}
        self.client_quotas: dict[tuple, _ConfigBuilder] = {}
        self.replica_index: dict[int, dict[TopicPartition, Any]] = {}
        self.preferred: dict[int, int] = {}
        self._current: tuple[int | None, Record] | None = None

    # --- reads through the overlays ---------------------------------------

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self.brokers:
            b = self.brokers[broker_id]
            return None if b is DELETE else b
        return self.base.brokers.get(broker_id)

    def topic(self, topic_id: uuid.UUID) -> _TopicBuilder | None:
        t = self.topics.get(topic_id)
        if t is None:
            image = self.base.topics_by_id.get(topic_id)
            if image is None:
                return None
            t = self.topics[topic_id] = _TopicBuilder(image)
        return None if t is DELETE else t

    def topic_id_by_name(self, name: str) -> uuid.UUID | None:
        if name in self.names:
            v = self.names[name]
            return None if v is DELETE else v
        return self.base.topic_ids_by_name.get(name)

    def config(self, resource: ConfigResource) -> _ConfigBuilder:
        c = self.configs.get(resource)
        if c is None:
            c = self.configs[resource] = _ConfigBuilder(self.base.configs.get(resource, _EMPTY))
        return c

    def fail(self, why: str) -> MetadataReplayError:
        offset, record = self._current or (None, None)
        where = "snapshot record" if offset is None else f"metadata record at offset {offset}"
        return MetadataReplayError(
            f"{where} ({record!r}) cannot be applied: {why}. The metadata log contradicts itself; "
            f"restore this node from a snapshot and report the bug"
        )

    # --- writes -----------------------------------------------------------

    def _index_partition(self, tp: TopicPartition, old: PartitionRegistration | None,
                         new: PartitionRegistration | None) -> None:
        if old is not None and new is not None and old.replicas == new.replicas:
            return  # a leader or ISR change (a fence moves thousands): nothing indexed moved
        old_pos = {b: i for i, b in enumerate(old.replicas)} if old else {}
        new_pos = {b: i for i, b in enumerate(new.replicas)} if new else {}
        for b in old_pos.keys() - new_pos.keys():
            self.replica_index.setdefault(b, {})[tp] = DELETE
        for b, i in new_pos.items():
            if old_pos.get(b) != i:
                self.replica_index.setdefault(b, {})[tp] = i
        old_first = old.replicas[0] if old and old.replicas else None
        new_first = new.replicas[0] if new and new.replicas else None
        if old_first != new_first:
            if old_first is not None:
                self.preferred[old_first] = self._preferred(old_first) - 1
            if new_first is not None:
                self.preferred[new_first] = self._preferred(new_first) + 1

    def _preferred(self, broker_id: int) -> int:
        if broker_id in self.preferred:
            return self.preferred[broker_id]
        return self.base.preferred_leader_counts.get(broker_id, 0)

    def set_partition(self, topic: _TopicBuilder, partition: int, new: PartitionRegistration,
                      old: PartitionRegistration | None) -> None:
        """`old`: the partition's registration before (None: a new partition)."""
        replicas = new.replicas
        distinct = set(replicas)
        if not replicas or len(distinct) != len(replicas) or not distinct.issuperset(new.isr):
            raise self.fail(f"partition state {new} needs distinct replicas and an ISR drawn from them")
        if new.leader != NO_LEADER and new.leader not in new.isr:
            raise self.fail(f"partition state {new} has a leader outside its ISR")
        topic.changes[partition] = new
        if old is None or old.replicas != replicas:
            # Not for a leader or ISR change (a fence moves thousands):
            # nothing indexed moved, and the key costs a tuple and a hash.
            self._index_partition(TopicPartition(topic.image.topic_id, partition), old, new)

    def replay(self, offset: int | None, epoch: int | None, record: Record) -> None:
        self._current = (offset, record)
        if offset is not None:
            if offset <= self.offset:
                raise self.fail(f"offset {offset} is not above the image's offset {self.offset}")
            self.offset = offset
        if epoch is not None:
            self.epoch = epoch
        handler = _HANDLERS.get(type(record))
        if handler is None:
            raise self.fail(f"no replay rule for {type(record).__name__}")
        handler(self, offset, record)

    def build(self) -> MetadataImage:
        base = self.base
        topics = {tid: (t if t is DELETE else t.build()) for tid, t in self.topics.items()}
        topics = {tid: t for tid, t in topics.items() if t is DELETE or t is not base.topics_by_id.get(tid)}
        configs: dict[ConfigResource, Any] = {}
        for resource, c in self.configs.items():
            built = c.build()
            if built is not c.base:
                configs[resource] = built if len(built) else DELETE
        quotas: dict[tuple, Any] = {}
        for entity, c in self.client_quotas.items():
            built = c.build()
            if built is not c.base:
                quotas[entity] = built if len(built) else DELETE
        index: dict[int, Any] = {}
        for b, changes in self.replica_index.items():
            built = base.broker_replicas.get(b, _EMPTY).update(changes)
            index[b] = built if len(built) else DELETE
        preferred = {b: (n if n else DELETE) for b, n in self.preferred.items()}
        return MetadataImage(
            offset=self.offset,
            epoch=self.epoch,
            brokers=base.brokers.update(self.brokers),
            topics_by_id=base.topics_by_id.update(topics),
            topic_ids_by_name=base.topic_ids_by_name.update(self.names),
            configs=base.configs.update(configs),
            client_quotas=base.client_quotas.update(quotas),
            next_producer_id=self.next_producer_id,
            broker_replicas=base.broker_replicas.update(index),
            preferred_leader_counts=base.preferred_leader_counts.update(preferred),
            zk_migration_state=self.zk_migration_state,
            scram_credentials=base.scram_credentials.update(self.scram_credentials),
            scram_ever_set=self.scram_ever_set,
            acls=base.acls.update(self.acls),
        )


def _register_broker(b: _ImageBuilder, offset: int | None, r: RegisterBrokerRecord) -> None:
    epoch = r.broker_epoch if r.broker_epoch is not None else offset
    if epoch is None:
        raise b.fail("a RegisterBroker record in a snapshot must carry its broker_epoch")
    b.brokers[r.broker_id] = BrokerRegistration(
        r.broker_id, epoch, r.incarnation_id, r.endpoints, r.rack, r.fenced, r.in_controlled_shutdown,
        frozenset(r.offline_log_dirs))


def _registered(b: _ImageBuilder, broker_id: int, epoch: int) -> BrokerRegistration:
    reg = b.broker(broker_id)
    if reg is None:
        raise b.fail(f"broker {broker_id} is not registered")
    if reg.epoch != epoch:
        raise b.fail(f"broker {broker_id} is registered with epoch {reg.epoch}, not {epoch}")
    return reg


def _unregister_broker(b: _ImageBuilder, _: int | None, r: UnregisterBrokerRecord) -> None:
    _registered(b, r.broker_id, r.broker_epoch)
    b.brokers[r.broker_id] = DELETE


def _broker_change(b: _ImageBuilder, _: int | None, r: BrokerRegistrationChangeRecord) -> None:
    reg = _registered(b, r.broker_id, r.broker_epoch)
    b.brokers[r.broker_id] = BrokerRegistration(
        reg.broker_id, reg.epoch, reg.incarnation_id, reg.endpoints, reg.rack,
        reg.fenced if r.fenced is None else r.fenced,
        reg.in_controlled_shutdown if r.in_controlled_shutdown is None else r.in_controlled_shutdown,
        reg.offline_log_dirs if r.offline_log_dirs is None else frozenset(r.offline_log_dirs),
    )


def _topic(b: _ImageBuilder, _: int | None, r: TopicRecord) -> None:
    if b.topic_id_by_name(r.name) is not None:
        raise b.fail(f"topic {r.name!r} already exists")
    if b.topic(r.topic_id) is not None:
        raise b.fail(f"topic id {r.topic_id} already exists")
    b.topics[r.topic_id] = _TopicBuilder(TopicImage(r.name, r.topic_id))
    b.names[r.name] = r.topic_id


def _known_topic(b: _ImageBuilder, topic_id: uuid.UUID) -> _TopicBuilder:
    topic = b.topic(topic_id)
    if topic is None:
        raise b.fail(f"topic id {topic_id} does not exist")
    return topic


def _partition(b: _ImageBuilder, _: int | None, r: PartitionRecord) -> None:
    topic = _known_topic(b, r.topic_id)
    b.set_partition(topic, r.partition, PartitionRegistration.from_record(r), topic.get(r.partition))


def _partition_change(b: _ImageBuilder, _: int | None, r: PartitionChangeRecord) -> None:
    topic = _known_topic(b, r.topic_id)
    current = topic.get(r.partition)
    if current is None:
        raise b.fail(f"partition {r.partition} of topic {topic.image.name!r} does not exist")
    b.set_partition(topic, r.partition, current.merge(r), current)


def _remove_topic(b: _ImageBuilder, _: int | None, r: RemoveTopicRecord) -> None:
    topic = _known_topic(b, r.topic_id)
    for p in topic.partition_ids():
        b._index_partition(TopicPartition(r.topic_id, p), topic.get(p), None)
    b.topics[r.topic_id] = DELETE
    b.names[topic.image.name] = DELETE
    # Kafka drops a deleted topic's configs with it.
    c = b.config(ConfigResource(ConfigResourceType.TOPIC, topic.image.name))
    c.cleared, c.changes = True, {}


def _config(b: _ImageBuilder, _: int | None, r: ConfigRecord) -> None:
    b.config(ConfigResource(r.resource_type, r.resource_name)).changes[r.key] = (
        DELETE if r.value is None else r.value)


def _client_quota(b: _ImageBuilder, _: int | None, r: ClientQuotaRecord) -> None:
    c = b.client_quotas.get(r.entity)
    if c is None:
        c = b.client_quotas[r.entity] = _ConfigBuilder(b.base.client_quotas.get(r.entity, _EMPTY))
    c.changes[r.key] = DELETE if r.value is None else r.value


def _producer_ids(b: _ImageBuilder, _: int | None, r: ProducerIdsRecord) -> None:
    if r.next_producer_id <= b.next_producer_id:
        raise b.fail(f"next producer id {r.next_producer_id} does not advance past {b.next_producer_id}")
    b.next_producer_id = r.next_producer_id


def _noop(b: _ImageBuilder, _: int | None, r: NoOpRecord) -> None:
    return None


def _scram_credential(b: _ImageBuilder, _: int | None, r: UserScramCredentialRecord) -> None:
    mechanism = _SCRAM_NAMES.get(r.mechanism)
    if mechanism is None:
        raise b.fail(f"unknown SCRAM mechanism id {r.mechanism}")
    b.scram_credentials[(mechanism, r.name)] = ScramCredential(r.salt, r.stored_key, r.server_key, r.iterations)
    b.scram_ever_set = True


def _remove_scram_credential(b: _ImageBuilder, _: int | None, r: RemoveUserScramCredentialRecord) -> None:
    # name "" is what a snapshot writes to keep `scram_ever_set` once every credential is gone.
    b.scram_ever_set = True
    mechanism = _SCRAM_NAMES.get(r.mechanism)
    if mechanism is not None and r.name:
        b.scram_credentials[(mechanism, r.name)] = DELETE


def _acl(b: _ImageBuilder, _: int | None, r: AccessControlEntryRecord) -> None:
    try:
        b.acls[r.id] = AclBinding(ResourceType(r.resource_type), r.resource_name, PatternType(r.pattern_type),
                                  r.principal, r.host, Operation(r.operation), Permission(r.permission_type))
    except ValueError as exc:
        raise b.fail(f"ACL {r.id}: {exc}") from None


def _remove_acl(b: _ImageBuilder, _: int | None, r: RemoveAccessControlEntryRecord) -> None:
    b.acls[r.id] = DELETE


def _zk_migration_state(b: _ImageBuilder, _: int | None, r: ZkMigrationStateRecord) -> None:
    b.zk_migration_state = r.migration_state


_HANDLERS: dict[type, Callable[[_ImageBuilder, Any, Any], None]] = {
    RegisterBrokerRecord: _register_broker,
    UnregisterBrokerRecord: _unregister_broker,
    BrokerRegistrationChangeRecord: _broker_change,
    TopicRecord: _topic,
    PartitionRecord: _partition,
    PartitionChangeRecord: _partition_change,
    RemoveTopicRecord: _remove_topic,
    ConfigRecord: _config,
    ClientQuotaRecord: _client_quota,
    ProducerIdsRecord: _producer_ids,
    NoOpRecord: _noop,
    ZkMigrationStateRecord: _zk_migration_state,
    UserScramCredentialRecord: _scram_credential,
    RemoveUserScramCredentialRecord: _remove_scram_credential,
    AccessControlEntryRecord: _acl,
    RemoveAccessControlEntryRecord: _remove_acl,
}


def replay(image: MetadataImage, records: Iterable[LoggedRecord]) -> MetadataImage:
    """`image` after `records`; see `MetadataImage.apply`."""
    builder = _ImageBuilder(image)
    for offset, epoch, record in records:
        builder.replay(offset, epoch, record)
    return builder.build()


def replay_snapshot(records: Iterable[Record], offset: int, epoch: int) -> MetadataImage:
    """The image a snapshot's records describe, as of `offset`/`epoch`.

    Snapshot records have no offsets of their own, so a RegisterBroker
    record must carry its `broker_epoch`.
    """
    builder = _ImageBuilder(MetadataImage())
    for record in records:
        builder.replay(None, None, record)
    builder.offset, builder.epoch = offset, epoch
    return builder.build()
