"""What a new image means for one broker's replicas.

Theory of operation
-------------------
A broker publishes each new image by comparing it with the previous one
and acting on the partitions it hosts (KIP-631's "MetadataDelta" and
`TopicsDelta.localChanges` in Kafka's broker):

* **leaders** -- partitions whose registration changed and that this broker
  now leads: become (or stay) leader at `leader_epoch`, adopt the new ISR;
* **followers** -- partitions whose registration changed and that this
  broker hosts but does not lead: follow `leader_id` (-1: no leader yet) at
  `leader_epoch`;
* **stopped** -- replicas this broker must stop: the topic was deleted, or
  the broker left the partition's replica list. `delete` says whether the
  local log goes too (both causes delete it today; the flag is there for
  stops that keep the data, such as an offline log dir).

`image_delta` walks only what differs between the two images: the
persistent maps share untouched subtrees, and `pmap.diff` skips them.
A broker compares `leader_epoch` with its own state to tell a leadership
change from an ISR-only update.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from quorum.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from quorum.metadata.pmap import MISSING, PMap, diff
from common.frozen import descriptor_init


@descriptor_init
@dataclass(frozen=True, slots=True)
class LocalPartition:
    """A partition this broker hosts, with its new registration."""

    topic_name: str
    topic_id: uuid.UUID
    partition: int
    registration: PartitionRegistration

    @property
    def leader_id(self) -> int:
        return self.registration.leader

    @property
    def leader_epoch(self) -> int:
        return self.registration.leader_epoch


@dataclass(frozen=True, slots=True)
class StoppedReplica:
    topic_name: str
    topic_id: uuid.UUID
    partition: int
    delete: bool


@dataclass(frozen=True, slots=True)
class MetadataDelta:
    """Changes to one broker's replicas between two images, sorted by (topic name, partition)."""

    broker_id: int
    leaders: tuple[LocalPartition, ...]
    followers: tuple[LocalPartition, ...]
    stopped: tuple[StoppedReplica, ...]

    @property
    def empty(self) -> bool:
        return not (self.leaders or self.followers or self.stopped)


_EMPTY: PMap = PMap()


def image_delta(old: MetadataImage, new: MetadataImage, broker_id: int) -> MetadataDelta:
    """What `broker_id` must do to move from `old` to `new`."""
    leaders: list[LocalPartition] = []
    followers: list[LocalPartition] = []
    stopped: list[StoppedReplica] = []
    for topic_id, before, after in diff(old.topics_by_id, new.topics_by_id):
        old_parts = _EMPTY if before is MISSING else before.partitions
        new_parts = _EMPTY if after is MISSING else after.partitions
        for index, was, now in diff(old_parts, new_parts):
            hosted_before = was is not MISSING and broker_id in was.replicas
            hosted_now = now is not MISSING and broker_id in now.replicas
            if hosted_now:
                if was is not MISSING and was.partition_epoch == now.partition_epoch and was == now:
                    continue  # the epoch first: every change bumps it, and it spares a field-by-field compare
                local = LocalPartition(after.name, topic_id, index, now)
                (leaders if now.leader == broker_id else followers).append(local)
            elif hosted_before:
                topic: TopicImage = before
                stopped.append(StoppedReplica(topic.name, topic_id, index, delete=True))
    return MetadataDelta(broker_id, tuple(sorted(leaders, key=_order)), tuple(sorted(followers, key=_order)),
                         tuple(sorted(stopped, key=_order)))


def _order(x: LocalPartition | StoppedReplica) -> tuple[str, int]:
    return (x.topic_name, x.partition)
