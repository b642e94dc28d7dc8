"""Helpers for the replication core's unit tests: a log model and builders."""

from __future__ import annotations

import uuid

from broker.core.replication import Partition, ReplicaFetch, ReplicationConfig
from quorum.metadata import PartitionRegistration
from storage.epoch_cache import LeaderEpochCache

TOPIC_ID = uuid.UUID(int=7)
LAG_MS = 1000
CONFIG = ReplicationConfig(replica_lag_time_max_ms=LAG_MS, replica_fetch_backoff_ms=50,
                           alter_partition_retry_backoff_ms=20)
ALL_ELIGIBLE = {1: 101, 2: 102, 3: 103}


class EpochLog:
    """The parts of a log the core reads, over the real `LeaderEpochCache`:
    the log end offset moves by `append(count, epoch)` and `truncate_to`."""

    def __init__(self, entries=(), log_end_offset: int = 0, log_start_offset: int = 0) -> None:
        self.epoch_cache = LeaderEpochCache(entries)
        self.log_end_offset = log_end_offset
        self.log_start_offset = log_start_offset

    @classmethod
    def of(cls, *epochs: int) -> EpochLog:
        """One record per offset, with the epochs given: EpochLog.of(0, 0, 2)."""
        log = cls()
        for epoch in epochs:
            log.append(1, epoch)
        return log

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for_epoch(epoch, self.log_end_offset)

    def append(self, count: int, epoch: int) -> int:
        if epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(epoch, self.log_end_offset)
        self.log_end_offset += count
        return self.log_end_offset

    def truncate_to(self, offset: int) -> None:
        # Epoch entries at the end go even when no record does: a leader
        # that wrote nothing in its epoch left one (see FollowerAction).
        self.epoch_cache.truncate_from_end(offset)
        self.log_end_offset = min(offset, self.log_end_offset)

    def epochs(self) -> list[int]:
        """The epoch of every offset (for comparing logs)."""
        return [self.epoch_cache.epoch_for_offset(o) for o in range(self.log_start_offset, self.log_end_offset)]


def registration(leader: int = 1, leader_epoch: int = 5, replicas=(1, 2, 3), isr=None,
                 partition_epoch: int = 10) -> PartitionRegistration:
    return PartitionRegistration(replicas=tuple(replicas), isr=tuple(replicas if isr is None else isr),
                                 leader=leader, leader_epoch=leader_epoch, partition_epoch=partition_epoch)


def leader_partition(log: EpochLog, *, isr=(1, 2, 3), min_isr: int = 2, now_ms: int = 0,
                     hw: int | None = None, leader_epoch: int = 5, eligible=None) -> Partition:
    """Broker 1 leading replicas (1, 2, 3) at `leader_epoch`, its epoch recorded in `log`."""
    p = Partition("t", 0, TOPIC_ID, 1, CONFIG, min_insync_replicas=min_isr)
    change = p.apply_registration(registration(isr=isr, leader_epoch=leader_epoch), log, now_ms,
                                  eligible=ALL_ELIGIBLE if eligible is None else eligible,
                                  checkpointed_high_watermark=hw)
    if change.epoch_start is not None:
        log.epoch_cache.assign(*change.epoch_start)
    return p


def fetch(replica: int, offset: int, log: EpochLog | None = None, *, last_epoch: int | None = None,
          leader_epoch: int = 5, broker_epoch: int = -1) -> ReplicaFetch:
    """Replica `replica` fetching at `offset`, its last epoch from `log` (or given)."""
    if last_epoch is None:
        last_epoch = log.epoch_cache.epoch_for_offset(offset - 1) if (log is not None and offset > 0) else -1
    return ReplicaFetch(replica, offset, last_epoch, leader_epoch, broker_epoch)
