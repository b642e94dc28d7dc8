"""The replication core's `Partition` as the request handlers see it (pure).

Theory of operation
-------------------
`broker.replication.Partition` is the partition state of a hosted replica
(roles, leader epochs, ISR, HW, acks=all). The request handlers
(`broker.fetch`, `broker.produce`, `broker.list_offsets`, the group
coordinator) were written against an older, replication-less state and ask
it a few questions in their own words; `ReplicaState` answers those on top
of the core so the handlers need no change. It holds the replica's log
read-only (`LogView`) to answer "where does a follower read up to".
"""

from __future__ import annotations

import uuid


from broker.replication import LogView, Partition, ReplicationConfig


class ReplicaState(Partition):
    """`Partition` plus the handlers' vocabulary (see the module docstring)."""

    def __init__(self, topic: str, partition: int, topic_id: uuid.UUID, broker_id: int,
                 log: LogView, config: ReplicationConfig | None = None) -> None:
        super().__init__(topic, partition, topic_id, broker_id, config)
        self.log = log

    def fetch_upper_bound(self, read_committed: bool, from_follower: bool = False) -> int:
        """Reads stop before this offset: the LEO for a replica, the HW
        (or LSO) for consumers."""
        if from_follower:
            return self.log.log_end_offset
        return super().fetch_upper_bound(read_committed)
