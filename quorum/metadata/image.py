"""The immutable metadata image: the cluster as of one offset of the metadata log.

Theory of operation
-------------------
A `MetadataImage` is what you get by replaying the metadata log from the
start (or from a snapshot) up to `offset`. It is immutable: `apply` returns
a new image and leaves the old one valid, so readers (request handlers,
the controller) can hold an image without locks while the next one is
built (KIP-631, "MetadataImage/MetadataDelta" in Kafka's KRaft broker).

* Every map is a `PMap` (persistent hash map). A new image shares every
  untouched broker, topic and partition with its predecessor, so applying
  N records costs O(N * changed), not O(partitions in the cluster).
* Partitions live inside their `TopicImage`; a topic is found by id
  (`topics_by_id`) or by name (`topic_ids_by_name`).
* Derived indexes, maintained on replay and equal whenever the primary maps
  are: `broker_replicas` (broker -> its partitions, with the broker's
  position in the replica list) and `preferred_leader_counts` (broker ->
  number of partitions whose first replica it is). Fencing a broker and
  placing new replicas use them instead of scanning every partition.
* The broker epoch is the offset of the broker's `RegisterBrokerRecord`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from common.security.acl import AclBinding
from common.security.sasl import ScramCredential

from quorum.metadata.pmap import PMap
from quorum.metadata.records import (
    NO_LEADER,
    UNASSIGNED_DIR,
    ConfigResourceType,
    Endpoint,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
)
from common.frozen import descriptor_init


class LoggedRecord(NamedTuple):
    """A decoded record with the offset and leader epoch it has in the metadata log."""

    offset: int
    epoch: int
    record: Record


class TopicPartition(NamedTuple):
    topic_id: uuid.UUID
    partition: int


class ConfigResource(NamedTuple):
    type: ConfigResourceType
    name: str


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    epoch: int
    incarnation_id: uuid.UUID
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool
    #: The log dirs its heartbeats report offline (KIP-858): its replicas
    #: assigned to one of them are offline.
    offline_log_dirs: frozenset[uuid.UUID] = frozenset()

    @property
    def usable(self) -> bool:
        """May lead partitions and receive new replicas: unfenced and not shutting down."""
        return not self.fenced and not self.in_controlled_shutdown


@descriptor_init
@dataclass(frozen=True, slots=True)
class PartitionRegistration:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    #: Each replica's log dir, in `replicas` order; empty: none assigned.
    directories: tuple[uuid.UUID, ...] = ()

    @classmethod
    def from_record(cls, r: PartitionRecord) -> PartitionRegistration:
        return cls(r.replicas, r.isr, r.leader, r.leader_epoch, r.partition_epoch,
                   r.removing_replicas, r.adding_replicas, r.directories)

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """The registration after `change`: always a new partition epoch; a new
        leader epoch whenever the record names a leader (as Kafka's merge).
        New replicas without `directories` keep each replica's log dir
        (`UNASSIGNED_DIR` for one that joins)."""
        leader, leader_epoch = self.leader, self.leader_epoch
        if change.leader is not None:
            leader, leader_epoch = change.leader, self.leader_epoch + 1
        replicas = self.replicas if change.replicas is None else change.replicas
        directories = self.directories
        if change.directories is not None:
            directories = change.directories
        elif directories and replicas != self.replicas:
            directories = tuple(self.directory(r) for r in replicas)
        return PartitionRegistration(
            replicas,
            self.isr if change.isr is None else change.isr,
            leader,
            leader_epoch,
            self.partition_epoch + 1,
            self.removing_replicas if change.removing_replicas is None else change.removing_replicas,
            self.adding_replicas if change.adding_replicas is None else change.adding_replicas,
            directories,
        )

    def directory(self, broker_id: int) -> uuid.UUID:
        """The log dir of `broker_id`'s replica (`UNASSIGNED_DIR`: none assigned)."""
        if self.directories:
            for replica, directory in zip(self.replicas, self.directories):
                if replica == broker_id:
                    return directory
        return UNASSIGNED_DIR

    def with_directory(self, broker_id: int, directory: uuid.UUID) -> tuple[uuid.UUID, ...]:
        """`directories` with `broker_id`'s replica in `directory`."""
        current = self.directories or (UNASSIGNED_DIR,) * len(self.replicas)
        return tuple(directory if r == broker_id else d for r, d in zip(self.replicas, current))

    def offline_replicas(self, live: frozenset[int] | set[int],
                         offline_dirs: dict[int, frozenset[uuid.UUID]]) -> list[int]:
        """The replicas a Metadata answer lists offline: on a broker not in
        `live`, or in a log dir its broker reports offline (`offline_dirs`:
        broker -> those dirs, only brokers that have one; Kafka's
        `isReplicaInOfflineDir`)."""
        if not offline_dirs or not self.directories:
            return [r for r in self.replicas if r not in live]
        return [r for r, d in zip(self.replicas, self.directories)
                if r not in live or d in offline_dirs.get(r, ())]

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0]


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: PMap[int, PartitionRegistration] = field(default_factory=PMap)


_EMPTY_PMAP: PMap = PMap()


@dataclass(frozen=True, slots=True, repr=False)
class MetadataImage:
    """The cluster metadata as of `offset` (-1: nothing applied yet)."""

    offset: int = -1
    epoch: int = -1
    brokers: PMap[int, BrokerRegistration] = field(default_factory=PMap)
    topics_by_id: PMap[uuid.UUID, TopicImage] = field(default_factory=PMap)
    topic_ids_by_name: PMap[str, uuid.UUID] = field(default_factory=PMap)
    configs: PMap[ConfigResource, PMap[str, str]] = field(default_factory=PMap)
    next_producer_id: int = 0
    broker_replicas: PMap[int, PMap[TopicPartition, int]] = field(default_factory=PMap)
    preferred_leader_counts: PMap[int, int] = field(default_factory=PMap)
    #: KIP-866 `ZkMigrationState` code (0: never migrated from ZooKeeper)
    zk_migration_state: int = 0
    #: SCRAM credentials (KIP-554) by (mechanism name, user name).
    scram_credentials: PMap[tuple[str, str], ScramCredential] = field(default_factory=PMap)
    #: Whether a SCRAM credential was ever stored: bootstrap credentials
    #: (`raftka storage format --add-scram`) go only into a cluster that had none.
    scram_ever_set: bool = False
    #: ACLs (KIP-801) by their id.
    acls: PMap[uuid.UUID, AclBinding] = field(default_factory=PMap)
    #: Client quotas (KIP-546) by entity ((type, name or None for the default), ...)
    #: -> {quota key: value}.
    client_quotas: PMap[tuple[tuple[str, str | None], ...], PMap[str, float]] = field(default_factory=PMap)

    def apply(self, records: Iterable[LoggedRecord]) -> MetadataImage:
        """The image after replaying `records` (offsets strictly above `self.offset`).

        Raises `MetadataReplayError` if a record contradicts the image; the
        image itself is never half-updated.
        """
        from quorum.metadata.replay import replay

        return replay(self, records)

    def __repr__(self) -> str:
        partitions = sum(len(t.partitions) for t in self.topics_by_id.values())
        return (f"MetadataImage(offset={self.offset}, epoch={self.epoch}, brokers={len(self.brokers)}, "
                f"topics={len(self.topics_by_id)}, partitions={partitions})")

    # --- lookups -------------------------------------------------------

    def topic(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids_by_name.get(name)
        return None if topic_id is None else self.topics_by_id[topic_id]

    def partition(self, topic_id: uuid.UUID, partition: int) -> PartitionRegistration | None:
        topic = self.topics_by_id.get(topic_id)
        return None if topic is None else topic.partitions.get(partition)

    def topic_config(self, name: str) -> PMap[str, str]:
        """A topic's explicitly set configs (see `topic_configs.effective_topic_config`)."""
        return self.configs.get(ConfigResource(ConfigResourceType.TOPIC, name), _EMPTY_PMAP)

    def offline_log_dirs(self) -> dict[int, frozenset[uuid.UUID]]:
        """broker -> its offline log dirs, for the brokers that have one."""
        return {b: reg.offline_log_dirs for b, reg in self.brokers.items() if reg.offline_log_dirs}

    def usable_brokers(self) -> list[BrokerRegistration]:
        """Unfenced brokers not in controlled shutdown, by id."""
        return sorted((b for b in self.brokers.values() if b.usable), key=lambda b: b.broker_id)

    def is_usable(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.usable

    def partitions_of_broker(self, broker_id: int) -> Iterator[tuple[TopicPartition, PartitionRegistration]]:
        """Every partition that has `broker_id` among its replicas."""
        for tp in self.broker_replicas.get(broker_id, _EMPTY_PMAP):
            yield tp, self.topics_by_id[tp.topic_id].partitions[tp.partition]

    def replica_count(self, broker_id: int) -> int:
        return len(self.broker_replicas.get(broker_id, _EMPTY_PMAP))

    def preferred_leader_count(self, broker_id: int) -> int:
        return self.preferred_leader_counts.get(broker_id, 0)

    def leader_count(self, broker_id: int) -> int:
        """Partitions `broker_id` currently leads (walks its replicas only)."""
        return sum(1 for _, p in self.partitions_of_broker(broker_id) if p.leader == broker_id)
