"""Replication settings, with Apache Kafka's broker key names and defaults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicationConfig:
    """What the replication core's decisions depend on (broker-wide).

    - `replica_lag_time_max_ms` (`replica.lag.time.max.ms`): a follower that
      has not caught up with the leader's log end offset for this long
      leaves the ISR.
    - `replica_fetch_backoff_ms` (`replica.fetch.backoff.ms`): how long a
      follower waits before fetching a partition again after an error.
    - `replica_fetch_wait_max_ms`, `replica_fetch_min_bytes`,
      `replica_fetch_max_bytes`, `replica_fetch_response_max_bytes`
      (`replica.fetch.*`): the long poll and the size limits of a
      follower's Fetch.
    - `alter_partition_retry_backoff_ms`: how long a leader waits before
      sending an unanswered (or retriably failed) AlterPartition again
      (Kafka's AlterPartitionManager retries after `retry.backoff.ms`).
    """

    replica_lag_time_max_ms: int = 30000
    replica_fetch_backoff_ms: int = 1000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1
    replica_fetch_max_bytes: int = 1048576
    replica_fetch_response_max_bytes: int = 10485760
    alter_partition_retry_backoff_ms: int = 100

    def __post_init__(self) -> None:
        assert self.replica_lag_time_max_ms > 0, "replica.lag.time.max.ms must be positive"
        assert self.replica_fetch_backoff_ms >= 0 and self.alter_partition_retry_backoff_ms >= 0
        assert self.replica_fetch_wait_max_ms >= 0 and self.replica_fetch_min_bytes >= 0
        assert self.replica_fetch_max_bytes > 0 and self.replica_fetch_response_max_bytes > 0
