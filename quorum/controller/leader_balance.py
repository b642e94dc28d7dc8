"""Automatic preferred-leader rebalancing (`auto.leader.rebalance.enable`).

Theory of operation
-------------------
After a failover, leadership piles up on the brokers that stayed up: the
returning broker comes back as a follower of everything. Kafka's
controller puts it right periodically (every
`leader.imbalance.check.interval.seconds`), and so does
`QuorumController.tick` with `imbalanced_preferred_elections`:

* A partition is *imbalanced* when its leader is not its preferred replica
  (the first of the replica list).
* A broker's imbalance ratio is its imbalanced partitions over the
  partitions it is preferred replica of. Only brokers whose ratio exceeds
  `leader.imbalance.per.broker.percentage` get their leadership back, as in
  Kafka's ZooKeeper controller (`checkAndTriggerAutoLeaderRebalance`): a
  little imbalance is not worth the leader-epoch bump every client sees.
* Leadership moves only to a preferred replica that is live (registered,
  unfenced, not shutting down) and in the ISR, and never while the
  partition is being reassigned (the reassignment names its own leader).
* At most `MAX_ELECTIONS_PER_CHECK` moves per check (Kafka's KRaft bound on
  one batch of elections), the rest at the next one.

The walk uses the image's broker -> partitions index (`broker_replicas`,
which holds each broker's position in the replica list), so a check costs
the partitions of the brokers it looks at, not a scan of the cluster.
"""

from __future__ import annotations

from quorum.controller.config import ControllerConfig
from quorum.controller.elections import partition_change
from quorum.metadata.image import MetadataImage, TopicPartition
from quorum.metadata.records import PartitionChangeRecord

MAX_ELECTIONS_PER_CHECK = 1000


def imbalance_ratio(image: MetadataImage, broker_id: int) -> float:
    """Share of the partitions `broker_id` is preferred replica of that someone else leads (0 if none)."""
    preferred = _preferred_partitions(image, broker_id)
    if not preferred:
        return 0.0
    led_elsewhere = sum(1 for tp in preferred
                        if image.topics_by_id[tp.topic_id].partitions[tp.partition].leader != broker_id)
    return led_elsewhere / len(preferred)


def _preferred_partitions(image: MetadataImage, broker_id: int) -> list[TopicPartition]:
    return [tp for tp, position in image.broker_replicas.get(broker_id, {}).items() if position == 0]


def imbalanced_preferred_elections(image: MetadataImage, config: ControllerConfig,
                                   limit: int = MAX_ELECTIONS_PER_CHECK) -> list[PartitionChangeRecord]:
    """Records giving leadership back to preferred replicas on the brokers over the imbalance threshold."""
    threshold = config.leader_imbalance_per_broker_percentage / 100
    out: list[PartitionChangeRecord] = []
    for broker in image.usable_brokers():
        if imbalance_ratio(image, broker.broker_id) <= threshold:
            continue
        preferred = sorted(_preferred_partitions(image, broker.broker_id),
                           key=lambda tp: (image.topics_by_id[tp.topic_id].name, tp.partition))
        for tp in preferred:
            current = image.topics_by_id[tp.topic_id].partitions[tp.partition]
            if current.leader == broker.broker_id or broker.broker_id not in current.isr:
                continue
            if current.adding_replicas or current.removing_replicas:
                continue
            change = partition_change(tp.topic_id, tp.partition, current, is_live=image.is_usable,
                                      unclean=False, preferred=True)
            if change is not None:
                out.append(change)
                if len(out) >= limit:
                    return out
    return out
