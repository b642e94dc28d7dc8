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
of brokers hosts (fencing, controlled shutdown, unregistration);
`changes_for_returning_broker` re-elects offline partitions when a broker
is unfenced (and finishes a reassignment that only waited for a leader
among its target replicas, KIP-455). Both walk the image's broker->partitions index, not the whole
cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

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
    image: MetadataImage, leaving: Collection[int], config: ControllerConfig
) -> list[PartitionChangeRecord]:
    """Move leadership off `leaving` and drop them from every ISR (keeping the last member).

    Used when brokers are fenced, start a controlled shutdown or unregister.
    """
    gone = set(leaving)

    def is_live(b: int) -> bool:
        return b not in gone and image.is_usable(b)

    out = []
    # One config lookup per topic, not per partition (a fenced broker may host 10,000).
    unclean: dict[uuid.UUID, bool] = {}
    for tp in _sorted_partitions(image, gone):
        current = image.topics_by_id[tp.topic_id].partitions[tp.partition]
        if current.leader not in gone and gone.isdisjoint(current.isr):
            continue
        target = tuple(b for b in current.isr if b not in gone) or current.isr[-1:]
        if tp.topic_id not in unclean:
            unclean[tp.topic_id] = unclean_enabled(image, tp.topic_id, config)
        change = partition_change(tp.topic_id, tp.partition, current, is_live=is_live,
                                  unclean=unclean[tp.topic_id], target_isr=target)
        if change is not None:
            out.append(change)
    return out


def changes_for_returning_broker(
    image: MetadataImage, broker_id: int, config: ControllerConfig
) -> list[PartitionChangeRecord]:
    """Elect leaders for offline partitions of a broker that is being unfenced."""

    def is_live(b: int) -> bool:
        return b == broker_id or image.is_usable(b)

    out = []
    for tp in _sorted_partitions(image, (broker_id,)):
        current = image.topics_by_id[tp.topic_id].partitions[tp.partition]
        if current.leader != NO_LEADER:
            continue
        change = partition_change(tp.topic_id, tp.partition, current, is_live=is_live,
                                  unclean=unclean_enabled(image, tp.topic_id, config))
        if change is not None:
            out.append(change)
            done = complete_if_done(tp.topic_id, tp.partition, current.merge(change), is_live)
            if done is not None:
                out.append(done)
    return out
