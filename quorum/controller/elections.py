"""Leader election and ISR changes for one partition, and for every partition of a broker.

Theory of operation
-------------------
Every leader or ISR change the controller makes goes through
`partition_change`, the analogue of Kafka's `PartitionChangeBuilder`:

* The ISR never becomes empty. When the brokers leaving it are all of it,
  the last member stays, so the partition keeps a record of who has the
  newest data (the pre-KIP-966 rule; ELR is out of scope).
* A leader is needed when there is none, or when the current one is no
  longer live or no longer in the ISR. The new leader is the first replica,
  in assignment order, that is live and in the ISR (KIP-631: live means
  registered, unfenced and not in controlled shutdown).
* With no live ISR member the partition goes offline (leader -1) -- unless
  unclean election is allowed (the topic's `unclean.leader.election.enable`,
  or an explicit ElectLeaders UNCLEAN): then the first live replica leads
  and the ISR is reset to just it, accepting possible data loss.
* A preferred election moves leadership to the first replica when it is
  live and in the ISR.
* The record names only what changed. Replaying it bumps the partition
  epoch, and the leader epoch when a leader is named (see
  `PartitionRegistration.merge`), which fences the old leader's requests.

`changes_for_leaving_brokers` applies these rules to every partition a set
of brokers hosts (controlled shutdown, unregistration), and `LeaderMoves`
to a fenced broker's partitions, a batch of them per controller tick;
`changes_for_returning_broker` re-elects offline partitions when a broker
is unfenced (and finishes a reassignment that only waited for a leader
among its target replicas, KIP-455). Both walk the image's broker->partitions index, not the whole
cluster.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Collection, Iterator

from quorum.controller.config import ControllerConfig
from quorum.controller.reassignment import IsLive, complete_if_done
from quorum.metadata.image import MetadataImage, PartitionRegistration, TopicPartition
from quorum.metadata.records import NO_LEADER, PartitionChangeRecord
from quorum.metadata.topic_configs import TOPIC_CONFIGS



def partition_change(
    topic_id: uuid.UUID,
    partition: int,
    current: PartitionRegistration,
    *,
    is_live: IsLive,
    unclean: bool,
    target_isr: tuple[int, ...] | None = None,
    preferred: bool = False,
) -> PartitionChangeRecord | None:
    """The record that moves `current` to `target_isr` with a valid leader, or None if nothing changes."""
    isr = current.isr if target_isr is None else target_isr
    assert isr, "the ISR never becomes empty"
    assert set(isr) <= set(current.replicas), (isr, current.replicas)
    leader = current.leader
    if leader == NO_LEADER or leader not in isr or not is_live(leader):
        in_sync = [r for r in current.replicas if r in isr and is_live(r)]
        if in_sync:
            leader = in_sync[0]
        elif unclean:
            live = [r for r in current.replicas if is_live(r)]
            leader = live[0] if live else NO_LEADER
            if live:
                isr = (leader,)
        else:
            leader = NO_LEADER
    elif preferred:
        first = current.replicas[0]
        if first != leader and first in isr and is_live(first):
            leader = first
    new_isr = None if isr == current.isr else isr
    new_leader = None if leader == current.leader else leader
    if new_isr is None and new_leader is None:
        return None
    return PartitionChangeRecord(topic_id=topic_id, partition=partition, isr=new_isr, leader=new_leader)


def unclean_enabled(image: MetadataImage, topic_id: uuid.UUID, config: ControllerConfig) -> bool:
    """The topic's `unclean.leader.election.enable`, else the cluster default."""
    topic = image.topics_by_id[topic_id]
    raw = image.topic_config(topic.name).get("unclean.leader.election.enable")
    if raw is None:
        return config.unclean_leader_election_enable
    return bool(TOPIC_CONFIGS["unclean.leader.election.enable"].parse(raw))


def _sorted_partitions(image: MetadataImage, broker_ids: Collection[int]) -> list[TopicPartition]:
    seen: set[TopicPartition] = set()
    for b in broker_ids:
        seen.update(image.broker_replicas.get(b, ()))
    names = {topic_id: image.topics_by_id[topic_id].name for topic_id in {tp.topic_id for tp in seen}}
    return sorted(seen, key=lambda tp: (names[tp.topic_id], tp.partition))


def changes_for_leaving_brokers(
    image: MetadataImage, leaving: Collection[int], config: ControllerConfig, limit: int | None = None
) -> list[PartitionChangeRecord]:
    """Move leadership off `leaving` and drop them from every ISR (keeping the last member).

    Used when brokers start a controlled shutdown or unregister; fencing
    goes through `LeaderMoves`, a batch at a time. With `limit`, the first
    (at least) `limit` changes only: a broker in controlled shutdown gets
    the next ones at its next heartbeat.
    """
    gone = set(leaving)
    return _changes_off(image, gone, iter(_sorted_partitions(image, gone)), config, limit)


def changes_for_offline_replicas(
    image: MetadataImage, broker_id: int, partitions: Collection[TopicPartition], config: ControllerConfig,
    limit: int | None = None,
) -> list[PartitionChangeRecord]:
    """Move leadership of `partitions` off `broker_id` and drop it from their
    ISRs (keeping the last member): its replicas of them are offline (their
    log dir failed), its others serve on."""
    names = {tp.topic_id: image.topics_by_id[tp.topic_id].name for tp in partitions
             if tp.topic_id in image.topics_by_id}
    ordered = sorted((tp for tp in partitions if tp.topic_id in names),
                     key=lambda tp: (names[tp.topic_id], tp.partition))
    return _changes_off(image, {broker_id}, iter(ordered), config, limit)


def _changes_off(image: MetadataImage, gone: set[int], partitions: Iterator[TopicPartition],
                 config: ControllerConfig, limit: int | None) -> list[PartitionChangeRecord]:
    """The changes that take `gone` out of the leadership and ISR of each of
    `partitions` (consumed until `limit` changes are made); partitions no
    longer in the image are passed over."""

    def is_live(b: int) -> bool:
        return b not in gone and image.is_usable(b)

    out: list[PartitionChangeRecord] = []
    # One config lookup per topic, not per partition (a fenced broker may host 10,000).
    unclean: dict[uuid.UUID, bool] = {}
    for tp in partitions:
        topic = image.topics_by_id.get(tp.topic_id)
        current = None if topic is None else topic.partitions.get(tp.partition)
        if current is None or (current.leader not in gone and gone.isdisjoint(current.isr)):
            continue
        target = tuple(b for b in current.isr if b not in gone) or current.isr[-1:]
        if tp.topic_id not in unclean:
            unclean[tp.topic_id] = unclean_enabled(image, tp.topic_id, config)
        change = partition_change(tp.topic_id, tp.partition, current, is_live=is_live,
                                  unclean=unclean[tp.topic_id], target_isr=target)
        if change is not None:
            out.append(change)
            # An unclean election can leave only target replicas in the ISR:
            # that finishes a reassignment (KIP-455), as after any change.
            done = complete_if_done(tp.topic_id, tp.partition, current.merge(change), is_live)
            if done is not None:
                out.append(done)
            if limit is not None and len(out) >= limit:
                break
    return out


class LeaderMoves:
    """Partitions still to move off fenced brokers, `limit` changes per tick.

    Fencing a broker that leads 10,000 partitions makes 10,000 records. As
    one metadata batch, every broker must decode and replay all of them
    before acting on the first, and the controller must decide all of them
    before appending any: the first partition took writes again only ~1 s
    after the fence. So the fence record goes out with the first `limit`
    changes, and each later tick takes the next `limit` partitions (by
    topic name, partition), decided against the working image of its own
    time: a topic deleted or a partition changed meanwhile is judged as it
    is then, never by a record computed earlier. Kafka's controller, too,
    appends a large non-atomic result as several batches.

    Soft state: a newly active controller queues the partitions of every
    fenced broker (`__init__`), so a failover halfway loses no move.
    """

    def __init__(self, image: MetadataImage) -> None:
        self._brokers: set[int] = set()
        self._queue: collections.deque[TopicPartition] = collections.deque()
        self.add(image, [b for b, reg in image.brokers.items() if reg.fenced])

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __len__(self) -> int:
        """Partitions still to look at (each moves, or turns out not to need it)."""
        return len(self._queue)

    def add(self, image: MetadataImage, broker_ids: Collection[int]) -> None:
        if broker_ids:
            self._brokers.update(broker_ids)
            self._queue.extend(_sorted_partitions(image, broker_ids))

    def take(self, image: MetadataImage, config: ControllerConfig, limit: int,
             fencing: Collection[int] = ()) -> list[PartitionChangeRecord]:
        """The next (at most) `limit` changes. `fencing`: brokers fenced by
        records not in `image` yet; a broker usable again (re-registered
        and unfenced) is no longer moved off."""
        gone = {b for b in self._brokers if b in fencing or not image.is_usable(b)}
        if not gone:
            self._brokers.clear()
            self._queue.clear()
            return []
        queue = self._queue
        changes = _changes_off(image, gone, _drain(queue), config, limit)
        if not queue:
            self._brokers.clear()
        return changes


def _drain(queue: collections.deque[TopicPartition]) -> Iterator[TopicPartition]:
    while queue:
        yield queue.popleft()


def changes_for_returning_broker(
    image: MetadataImage, broker_id: int, config: ControllerConfig, limit: int | None = None
) -> list[PartitionChangeRecord]:
    """Elect leaders for offline partitions of a broker that is being
    unfenced (or was, by records not in `image` yet); with `limit`, the
    first (at least) `limit` changes only."""

    def is_live(b: int) -> bool:
        return b == broker_id or image.is_usable(b)

    out: list[PartitionChangeRecord] = []
    unclean: dict[uuid.UUID, bool] = {}
    for tp in _sorted_partitions(image, (broker_id,)):
        current = image.topics_by_id[tp.topic_id].partitions[tp.partition]
        if current.leader != NO_LEADER:
            continue
        if tp.topic_id not in unclean:
            unclean[tp.topic_id] = unclean_enabled(image, tp.topic_id, config)
        change = partition_change(tp.topic_id, tp.partition, current, is_live=is_live,
                                  unclean=unclean[tp.topic_id])
        if change is not None:
            out.append(change)
            done = complete_if_done(tp.topic_id, tp.partition, current.merge(change), is_live)
            if done is not None:
                out.append(done)
            if limit is not None and len(out) >= limit:
                break
    return out
