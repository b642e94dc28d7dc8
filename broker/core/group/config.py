"""Settings of the group coordinator, with Kafka's key names (pure).

`GroupCoordinatorConfig.from_properties` reads the same keys as Kafka's
broker (`group.*`, `offsets.*`, `offset.metadata.max.bytes`); every
default is Kafka's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass

from common.errors import ConfigError

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GroupCoordinatorConfig:
    #: `group.initial.rebalance.delay.ms`: how long the first rebalance of an
    #: empty group waits for more members (extended while members keep
    #: arriving, up to the rebalance timeout).
    group_initial_rebalance_delay_ms: int = 3000
    #: `group.min.session.timeout.ms` / `group.max.session.timeout.ms`: the
    #: session timeouts a JoinGroup may ask for (else INVALID_SESSION_TIMEOUT).
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    #: `group.max.size` (else GROUP_MAX_SIZE_REACHED).
    group_max_size: int = _INT32_MAX
    #: How long a new member's JoinGroup may stay parked before the member is
    #: dropped (Kafka's fixed `group.new.member.join.timeout`, 5 minutes).
    group_new_member_join_timeout_ms: int = 300_000
    #: `offsets.retention.minutes` (7 days), as milliseconds.
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000
    #: `offsets.retention.check.interval.ms`: how often expired offsets and
    #: empty groups are swept (tombstones from `tick`).
    offsets_retention_check_interval_ms: int = 600_000
    #: `offset.metadata.max.bytes` (else OFFSET_METADATA_TOO_LARGE).
    offset_metadata_max_bytes: int = 4096
    #: `offsets.topic.num.partitions` and `offsets.topic.replication.factor`:
    #: the shape of `__consumer_offsets` when it is created on first use.
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    #: `offsets.topic.segment.bytes`.
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    #: `offsets.commit.timeout.ms`: how long the shell waits for a write's
    #: records to commit before answering COORDINATOR_NOT_AVAILABLE.
    offsets_commit_timeout_ms: int = 5000
    #: `group.consumer.session.timeout.ms`: a consumer-protocol (KIP-848)
    #: member without a heartbeat for this long leaves its group.
    group_consumer_session_timeout_ms: int = 45_000
    #: `group.consumer.heartbeat.interval.ms`: how often a consumer-protocol
    #: member is told to heartbeat.
    group_consumer_heartbeat_interval_ms: int = 5000
    #: `group.consumer.assignors`: the server-side assignors a member may
    #: name; the first is the default.
    group_consumer_assignors: tuple[str, ...] = ("uniform", "range")
    #: `group.consumer.migration.policy` (Kafka's key; `group.protocol.upgrade.policy`
    #: is read as an alias): whether a non-empty classic group becomes a
    #: consumer-protocol group when a member joins with ConsumerGroupHeartbeat
    #: (upgrade), and a consumer group back a classic one when its last
    #: consumer-protocol member leaves (downgrade). One of disabled, upgrade,
    #: downgrade, bidirectional (Kafka 4's default). Empty groups convert
    #: either way whatever the policy.
    group_consumer_migration_policy: str = "bidirectional"

    def __post_init__(self) -> None:
        if self.offsets_topic_num_partitions <= 0:
            raise ConfigError("offsets.topic.num.partitions must be at least 1")
        if self.offsets_topic_replication_factor <= 0:
            raise ConfigError("offsets.topic.replication.factor must be at least 1")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError("group.min.session.timeout.ms must not exceed group.max.session.timeout.ms")
        if self.group_max_size <= 0:
            raise ConfigError("group.max.size must be at least 1")
        if self.group_initial_rebalance_delay_ms < 0:
            raise ConfigError("group.initial.rebalance.delay.ms must not be negative")
        unknown = [a for a in self.group_consumer_assignors if a not in ("uniform", "range")]
        if unknown or not self.group_consumer_assignors:
            raise ConfigError(f"group.consumer.assignors must list some of uniform, range; got {unknown or 'none'}")
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ConfigError("group.consumer.heartbeat.interval.ms must be less than group.consumer.session.timeout.ms")
        if self.group_consumer_migration_policy not in MIGRATION_POLICIES:
            raise ConfigError(f"group.consumer.migration.policy must be one of {', '.join(MIGRATION_POLICIES)} "
                              f"(case-insensitive); got {self.group_consumer_migration_policy!r}")
        if self.offsets_retention_ms <= 0:
            raise ConfigError("offsets.retention.minutes must be at least 1")
        if self.offsets_retention_check_interval_ms <= 0:
            raise ConfigError("offsets.retention.check.interval.ms must be at least 1")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> GroupCoordinatorConfig:
        """Build from Kafka-named properties; unknown keys are ignored (they
        belong to other parts of the broker)."""
        kwargs: dict[str, Any] = {}
        for key, field_name in _INT_KEYS.items():
            if key in props:
                kwargs[field_name] = _parse_int(key, props[key])
        if "offsets.retention.minutes" in props:
            kwargs["offsets_retention_ms"] = _parse_int("offsets.retention.minutes",
                                                        props["offsets.retention.minutes"]) * 60_000
        if "group.consumer.assignors" in props:
            # Kafka also accepts class names; the last dotted part names the assignor.
            kwargs["group_consumer_assignors"] = tuple(
                a.strip().rsplit(".", 1)[-1].lower().removesuffix("assignor")
                for a in str(props["group.consumer.assignors"]).split(",") if a.strip())
        for key in (MIGRATION_POLICY_ALIAS, MIGRATION_POLICY_KEY):  # Kafka's key wins over the alias
            if key in props:
                kwargs["group_consumer_migration_policy"] = str(props[key]).strip().lower()
        return cls(**kwargs)

    def allows_upgrade(self) -> bool:
        return self.group_consumer_migration_policy in ("upgrade", "bidirectional")

    def allows_downgrade(self) -> bool:
        return self.group_consumer_migration_policy in ("downgrade", "bidirectional")


MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")
MIGRATION_POLICY_KEY = "group.consumer.migration.policy"
#: Another name some write for the same setting; Kafka knows only the key above.
MIGRATION_POLICY_ALIAS = "group.protocol.upgrade.policy"

_INT_KEYS = {
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "group.max.size": "group_max_size",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
    "offset.metadata.max.bytes": "offset_metadata_max_bytes",
    "offsets.topic.num.partitions": "offsets_topic_num_partitions",
    "offsets.topic.replication.factor": "offsets_topic_replication_factor",
    "offsets.topic.segment.bytes": "offsets_topic_segment_bytes",
    "offsets.commit.timeout.ms": "offsets_commit_timeout_ms",
    "group.consumer.session.timeout.ms": "group_consumer_session_timeout_ms",
    "group.consumer.heartbeat.interval.ms": "group_consumer_heartbeat_interval_ms",
}


def _parse_int(key: str, raw: str) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
