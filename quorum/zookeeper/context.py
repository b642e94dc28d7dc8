"""What the ZooKeeper-mode controller knows, what it is told, and what it decides.

Theory of operation
-------------------
The controller core (`decisions.ZkControllerCore`) is pure: it never talks
to ZooKeeper or to brokers. Its shell feeds it *events* (the snapshot it
loaded on election, a changed `/brokers/ids`, new topics, deletion requests,
ISR change notifications, topic configs it asked for) and gets back a
`Decision`:

* `writes` -- `ZkTransaction`s. The shell applies each as one ZooKeeper
  `multi`, prefixed with `check(/controller_epoch, epoch_zk_version)`: if a
  newer controller has bumped the epoch the whole transaction fails, which
  is the fence against split brain (KAFKA-6082). A partition-state write is
  also conditional on the state znode's zkVersion, so it loses to any
  write the controller did not see (a leader's ISR change, a newer
  controller).
* `requests` -- LeaderAndIsr / UpdateMetadata / StopReplica for brokers,
  computed only from state that ZooKeeper has confirmed.
* `read_topic_configs` -- topics whose `/config/topics/<t>` the core needs
  (to know `unclean.leader.election.enable` before leaving a partition
  offline); the shell reads them and feeds `TopicConfigsLoaded`.
* `resign` -- the core saw a newer controller's hand (a partition state
  written with a higher controller epoch); stop acting at once.

The shell reports what happened to the writes with `WriteOutcome`s, and the
core answers with the next `Decision`, until a decision has no writes.

`ControllerContext` is the controller's in-memory copy of ZooKeeper (Kafka's
`ControllerContext`): live brokers, topic assignments, partition states with
their zkVersions, and a broker -> partitions index.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from quorum.zookeeper.messages import ControllerRequest
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment

# --- ZooKeeper writes as data ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateZNode:
    """Create `path`; with `make_parents`, the shell first creates missing empty parents
    (outside the fenced transaction: empty parents are harmless)."""

    path: str
    data: bytes
    make_parents: bool = False


@dataclass(frozen=True, slots=True)
class SetZNode:
    """Overwrite `path` if its zkVersion is still `version`."""

    path: str
    data: bytes
    version: int


@dataclass(frozen=True, slots=True)
class DeleteZNode:
    """Delete `path` (any version). A missing znode counts as deleted."""

    path: str


ZkOp = CreateZNode | SetZNode | DeleteZNode


@dataclass(frozen=True, slots=True)
class ZkTransaction:
    """Ops applied atomically, fenced by the controller epoch's zkVersion.

    `partition` names the state znode a partition-state transaction writes
    (its last op), so a lost race can be retried from the fresh state.
    """

    ops: tuple[ZkOp, ...]
    partition: NamedPartition | None = None


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What became of one transaction that was not fenced.

    `ok` False means the partition's state znode moved under us (BadVersion
    or NodeExists); `fresh` is its state as the shell re-read it (None if it
    is gone).
    """

    transaction: ZkTransaction
    ok: bool
    fresh: PartitionState | None = None


@dataclass(frozen=True, slots=True)
class BrokerRequest:
    broker_id: int
    request: ControllerRequest


@dataclass(frozen=True, slots=True)
class Decision:
    writes: tuple[ZkTransaction, ...] = ()
    requests: tuple[BrokerRequest, ...] = ()
    read_topic_configs: frozenset[str] = frozenset()
    resign: bool = False


# --- events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Everything the controller loads from ZooKeeper when it is elected."""

    controller_epoch: int
    epoch_zk_version: int
    brokers: Mapping[int, BrokerInfo]
    #: every topic's assignment; each must carry its topic id
    topics: Mapping[str, TopicAssignment]
    #: state of every partition that has a state znode
    states: Mapping[NamedPartition, PartitionState]
    topics_to_delete: frozenset[str] = frozenset()
    #: names of pending `/isr_change_notification` children (deleted: the load is fresher)
    isr_notifications: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Failover:
    snapshot: ClusterSnapshot


@dataclass(frozen=True, slots=True)
class BrokersChanged:
    """The live brokers now (children of `/brokers/ids` and their registrations)."""

    live: Mapping[int, BrokerInfo]


@dataclass(frozen=True, slots=True)
class TopicsChanged:
    """`/brokers/topics` children changed: every topic name now, and the assignments of new ones."""

    names: frozenset[str]
    new_assignments: Mapping[str, TopicAssignment]


@dataclass(frozen=True, slots=True)
class TopicDeletionRequested:
    """Children of `/admin/delete_topics`."""

    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class IsrChangesNotified:
    """`/isr_change_notification` children and the partition states they name, freshly read."""

    notifications: tuple[str, ...]
    states: Mapping[NamedPartition, PartitionState | None]


@dataclass(frozen=True, slots=True)
class TopicConfigsLoaded:
    """`/config/topics/<t>` of topics the core asked for (or whose config changed)."""

    configs: Mapping[str, Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class PartitionsAdded:
    """`/brokers/topics/<t>` of existing topics changed (Kafka's partition-modification
    watch): their assignments now, freshly read."""

    assignments: Mapping[str, TopicAssignment]


ControllerEvent = (Failover | BrokersChanged | TopicsChanged | TopicDeletionRequested | IsrChangesNotified
                   | TopicConfigsLoaded | PartitionsAdded)


# --- the controller's view ---------------------------------------------------------------


@dataclass(slots=True)
class ControllerContext:
    controller_id: int
    epoch: int = 0
    epoch_zk_version: int = -1
    live_brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicAssignment] = field(default_factory=dict)
    states: dict[NamedPartition, PartitionState] = field(default_factory=dict)
    topics_to_delete: set[str] = field(default_factory=set)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    #: broker -> partitions it is a replica of (assigned, live or not)
    replicas_by_broker: dict[int, set[NamedPartition]] = field(default_factory=dict)

    def add_topic(self, name: str, assignment: TopicAssignment) -> None:
        assert assignment.topic_id is not None, f"topic {name!r} needs a topic id before the controller adopts it"
        self.remove_topic(name)
        self.topics[name] = assignment
        for p, replicas in assignment.partitions.items():
            for b in replicas:
                self.replicas_by_broker.setdefault(b, set()).add(NamedPartition(name, p))

    def extend_topic(self, name: str, assignment: TopicAssignment) -> list[NamedPartition]:
        """Adopt a grown assignment of a known topic; its new partitions (existing ones keep theirs)."""
        old = self.topics[name]
        assert assignment.topic_id == old.topic_id, f"topic {name!r} changed id: not a growth"
        added = [NamedPartition(name, p) for p in sorted(set(assignment.partitions) - set(old.partitions))]
        partitions = {**assignment.partitions, **old.partitions}
        self.topics[name] = TopicAssignment(partitions, old.topic_id, old.adding_replicas, old.removing_replicas)
        for tp in added:
            for b in partitions[tp.partition]:
                self.replicas_by_broker.setdefault(b, set()).add(tp)
        return added

    def remove_topic(self, name: str) -> None:
        old = self.topics.pop(name, None)
        if old is None:
            return
        for p, replicas in old.partitions.items():
            tp = NamedPartition(name, p)
            self.states.pop(tp, None)
            for b in replicas:
                hosted = self.replicas_by_broker.get(b)
                if hosted is not None:
                    hosted.discard(tp)
                    if not hosted:
                        del self.replicas_by_broker[b]
        self.topic_configs.pop(name, None)
        self.topics_to_delete.discard(name)

    def replicas(self, tp: NamedPartition) -> tuple[int, ...]:
        return self.topics[tp.topic].partitions[tp.partition]

    def topic_id(self, topic: str) -> uuid.UUID:
        topic_id = self.topics[topic].topic_id
        assert topic_id is not None
        return topic_id

    def is_live(self, broker_id: int) -> bool:
        return broker_id in self.live_brokers

    def all_partitions(self) -> list[NamedPartition]:
        return sorted(NamedPartition(t, p) for t, a in self.topics.items() for p in a.partitions)

    def partitions_on(self, broker_ids) -> list[NamedPartition]:
        seen: set[NamedPartition] = set()
        for b in broker_ids:
            seen |= self.replicas_by_broker.get(b, set())
        return sorted(seen)
