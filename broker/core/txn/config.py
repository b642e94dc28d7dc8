"""Settings of the transaction coordinator, with Kafka's key names (pure).

`TransactionCoordinatorConfig.from_properties` reads the same keys as
Kafka's broker (`transaction.*`, `transactional.id.expiration.ms`); every
default is Kafka's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import ConfigError

TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"


@dataclass(frozen=True, slots=True)
class TransactionCoordinatorConfig:
    #: `transaction.state.log.num.partitions`, `.replication.factor`,
    #: `.min.isr`, `.segment.bytes`: the shape of `__transaction_state`
    #: when it is created on first use.
    transaction_state_log_num_partitions: int = 50
    transaction_state_log_replication_factor: int = 3
    transaction_state_log_min_isr: int = 2
    transaction_state_log_segment_bytes: int = 100 * 1024 * 1024
    #: `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a
    #: producer may ask for (else INVALID_TRANSACTION_TIMEOUT).
    transaction_max_timeout_ms: int = 900_000
    #: `transactional.id.expiration.ms`: a transactional id with no
    #: transaction for this long is forgotten (a tombstone).
    transactional_id_expiration_ms: int = 7 * 24 * 60 * 60 * 1000
    #: `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how
    #: often transactions past their timeout are looked for and aborted.
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    #: `transaction.remove.expired.transaction.cleanup.interval.ms`: how
    #: often expired transactional ids are looked for.
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    #: `request.timeout.ms` of the coordinator's writes to its log: how long
    #: an answer waits for its record to commit before COORDINATOR_NOT_AVAILABLE.
    transaction_state_write_timeout_ms: int = 5000
    #: `transaction.state.log.load.buffer.size`: bytes read per step of a load.
    transaction_state_log_load_buffer_size: int = 5 * 1024 * 1024
    #: `transaction.partition.verification.enable` (KIP-890): a partition
    #: leader asks the coordinator before a transactional producer's batch
    #: opens a transaction there.
    transaction_partition_verification_enable: bool = True

    def __post_init__(self) -> None:
        if self.transaction_state_log_num_partitions <= 0:
            raise ConfigError("transaction.state.log.num.partitions must be at least 1")
        if self.transaction_state_log_replication_factor <= 0:
            raise ConfigError("transaction.state.log.replication.factor must be at least 1")
        if self.transaction_state_log_min_isr <= 0:
            raise ConfigError("transaction.state.log.min.isr must be at least 1")
        if self.transaction_max_timeout_ms <= 0:
            raise ConfigError("transaction.max.timeout.ms must be at least 1")
        if self.transactional_id_expiration_ms <= 0:
            raise ConfigError("transactional.id.expiration.ms must be at least 1")
        if self.transaction_abort_timed_out_transaction_cleanup_interval_ms <= 0:
            raise ConfigError("transaction.abort.timed.out.transaction.cleanup.interval.ms must be at least 1")
        if self.transaction_remove_expired_transaction_cleanup_interval_ms <= 0:
            raise ConfigError("transaction.remove.expired.transaction.cleanup.interval.ms must be at least 1")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TransactionCoordinatorConfig:
        """Build from Kafka-named properties; unknown keys are ignored."""
        kwargs: dict[str, int | bool] = {}
        for key, field_name in _INT_KEYS.items():
            if key in props:
                try:
                    kwargs[field_name] = int(str(props[key]).strip())
                except ValueError:
                    raise ConfigError(f"{key} must be an integer, got {props[key]!r}") from None
        key = "transaction.partition.verification.enable"
        if key in props:
            value = str(props[key]).strip().lower()
            if value not in ("true", "false"):
                raise ConfigError(f"{key} must be true or false, got {props[key]!r}")
            kwargs["transaction_partition_verification_enable"] = value == "true"
        return cls(**kwargs)

    def topic_configs(self) -> dict[str, str]:
        """Topic configs of `__transaction_state` when it is created: compacted
        (the newest record per transactional id is its state), uncompressed,
        `min.insync.replicas` from `transaction.state.log.min.isr`, as Kafka."""
        return {
            "cleanup.policy": "compact",
            "compression.type": "uncompressed",
            "min.insync.replicas": str(self.transaction_state_log_min_isr),
            "segment.bytes": str(self.transaction_state_log_segment_bytes),
            "unclean.leader.election.enable": "false",
        }


_INT_KEYS = {
    "transaction.state.log.num.partitions": "transaction_state_log_num_partitions",
    "transaction.state.log.replication.factor": "transaction_state_log_replication_factor",
    "transaction.state.log.min.isr": "transaction_state_log_min_isr",
    "transaction.state.log.segment.bytes": "transaction_state_log_segment_bytes",
    "transaction.max.timeout.ms": "transaction_max_timeout_ms",
    "transactional.id.expiration.ms": "transactional_id_expiration_ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms":
        "transaction_abort_timed_out_transaction_cleanup_interval_ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms":
        "transaction_remove_expired_transaction_cleanup_interval_ms",
    "transaction.state.log.load.buffer.size": "transaction_state_log_load_buffer_size",
}
