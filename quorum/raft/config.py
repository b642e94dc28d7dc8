"""Timeouts and limits of the Raft core, named after Kafka's keys.

`controller_quorum_fetch_timeout_ms` is `controller.quorum.fetch.timeout.ms`,
and so on; the few knobs Kafka does not expose have plain names.

`QuorumConfig.from_node_config` takes the values `common.config.NodeConfig`
already parsed from the properties file; tests build a `QuorumConfig`
directly with short timeouts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class QuorumConfig:
    # controller.quorum.election.timeout.ms: a voter with no leader waits a
    # random time in [T, 2T) before starting an election (Raft §5.2).
    controller_quorum_election_timeout_ms: int = 1000
    # controller.quorum.fetch.timeout.ms: a follower that hears nothing from its
    # leader for this long starts a pre-vote; a leader that has not heard from a
    # majority for this long resigns (check-quorum).
    controller_quorum_fetch_timeout_ms: int = 2000
    # controller.quorum.election.backoff.max.ms: cap of the backoff after a lost
    # election, and of the delay non-preferred successors wait after EndQuorumEpoch.
    controller_quorum_election_backoff_max_ms: int = 1000
    # controller.quorum.request.timeout.ms: an unanswered request is sent again.
    controller_quorum_request_timeout_ms: int = 2000
    # controller.quorum.retry.backoff.ms: pause before retrying after an error answer.
    controller_quorum_retry_backoff_ms: int = 20
    # How long the leader parks an empty Fetch (long poll). Kafka hard-codes 500.
    fetch_max_wait_ms: int = 500
    # Bytes per Fetch / FetchSnapshot answer (Kafka's raft client uses 8 MiB).
    fetch_max_bytes: int = 8 * 1024 * 1024
    fetch_snapshot_max_bytes: int = 8 * 1024 * 1024
    # metadata.log.max.record.bytes.between.snapshots
    metadata_log_max_record_bytes_between_snapshots: int = 20 * 1024 * 1024
    # The leader forgets an observer that has not fetched for this long.
    observer_session_timeout_ms: int = 300_000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"quorum config {field.name}={value!r}: must be a non-negative integer")
        if self.controller_quorum_election_timeout_ms < 1 or self.controller_quorum_fetch_timeout_ms < 1:
            raise ConfigError(
                "controller.quorum.election.timeout.ms and controller.quorum.fetch.timeout.ms must be at least 1"
            )
        if self.controller_quorum_request_timeout_ms <= self.fetch_max_wait_ms:
            raise ConfigError(
                f"controller.quorum.request.timeout.ms={self.controller_quorum_request_timeout_ms} must exceed "
                f"the fetch long-poll wait {self.fetch_max_wait_ms} ms, or every parked Fetch would time out"
            )

    @classmethod
    def from_node_config(cls, node_config: Any, **overrides: int) -> QuorumConfig:
        """Take the quorum keys from a parsed `common.config.NodeConfig`."""
        keys = (
            "controller_quorum_election_timeout_ms",
            "controller_quorum_fetch_timeout_ms",
            "controller_quorum_election_backoff_max_ms",
            "metadata_log_max_record_bytes_between_snapshots",
        )
        values = {key: getattr(node_config, key) for key in keys}
        values.update(overrides)
        return cls(**values)
