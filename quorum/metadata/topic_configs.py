"""Topic-level configs: the keys raftka knows, their Kafka defaults and validation.

Theory of operation
-------------------
A topic's dynamic configs live in the metadata image as strings (one
`ConfigRecord` per key). This module says which keys exist, what type each
has, what Kafka's default is, and whether a value is valid. The controller
validates with it before it writes a record; brokers and storage read the
effective value (explicit or default) with `effective_topic_config` and turn
it into a Python value with `ConfigDef.parse`.

Values are validated as Kafka's `ConfigDef` does: integers by range,
doubles by range, booleans case-insensitively, enumerations by membership, lists as
comma-separated items.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class ConfigType(enum.IntEnum):
    """Kafka's `DescribeConfigsResponse.ConfigType` codes."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


_NUMBER_BOUNDS = {int(ConfigType.INT): (_INT_MIN, _INT_MAX), int(ConfigType.LONG): (_LONG_MIN, _LONG_MAX)}


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config key."""

    name: str
    type: ConfigType
    default: str
    doc: str
    minimum: int | None = None
    choices: tuple[str, ...] | None = None
    #: DOUBLE keys: the closed range a value must lie in.
    fraction_range: tuple[float, float] | None = None

    def validate(self, value: str | None) -> str | None:
        """None if `value` is acceptable, else a message saying what is wrong."""
        if value is None:
            return f"Null value not supported for topic config {self.name}"
        bounds = _NUMBER_BOUNDS.get(int(self.type))
        if bounds is not None:
            lo, hi = bounds
            try:
                n = int(value.strip())
            except ValueError:
                return f"Invalid value {value} for configuration {self.name}: Not a number of type {self.type.name}"
            if not lo <= n <= hi:
                return f"Invalid value {value} for configuration {self.name}: out of range for {self.type.name}"
            if self.minimum is not None and n < self.minimum:
                return f"Invalid value {value} for configuration {self.name}: Value must be at least {self.minimum}"
            return None
        if self.type == ConfigType.DOUBLE:
            try:
                x = float(value.strip())
            except ValueError:
                return f"Invalid value {value} for configuration {self.name}: Not a number of type DOUBLE"
            if x != x:  # NaN: float() reads it, no range holds it
                return f"Invalid value {value} for configuration {self.name}: Not a number of type DOUBLE"
            lo, hi = self.fraction_range or (float("-inf"), float("inf"))
            if x < lo:
                return f"Invalid value {value} for configuration {self.name}: Value must be at least {lo}"
            if x > hi:
                return f"Invalid value {value} for configuration {self.name}: Value must be no more than {hi}"
            return None
        if self.type == ConfigType.BOOLEAN:
            if value.strip().lower() not in ("true", "false"):
                return f"Invalid value {value} for configuration {self.name}: Expected value to be either true or false"
            return None
        if self.type == ConfigType.LIST:
            items = split_list(value)
            if self.name.endswith(THROTTLED_REPLICAS_SUFFIX):
                return throttled_replicas_error(self.name, value, items)
            if not items and self.name.endswith("cleanup.policy"):
                # Kafka 4.1 accepts an empty cleanup.policy (a SUBTRACT of the
                # last policy): neither deleted by retention nor compacted.
                return None
            if not items:
                return f"Invalid value {value!r} for configuration {self.name}: the list must not be empty"
            bad = [i for i in items if self.choices is not None and i not in self.choices]
            if bad:
                return (f"Invalid value {value} for configuration {self.name}: "
                        f"{bad[0]!r} is not one of {', '.join(self.choices or ())}")
            return None
        if self.choices is not None and value not in self.choices:
            return (f"Invalid value {value} for configuration {self.name}: "
                    f"String must be one of: {', '.join(self.choices)}")
        return None

    def parse(self, value: str) -> Any:
        """The Python value of a validated string: int, float, bool, list[str] or str."""
        if self.type in (ConfigType.INT, ConfigType.LONG):
            return int(value.strip())
        if self.type == ConfigType.DOUBLE:
            return float(value.strip())
        if self.type == ConfigType.BOOLEAN:
            return value.strip().lower() == "true"
        if self.type == ConfigType.LIST:
            return split_list(value)
        return value


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


_DEFS = (
    ConfigDef("cleanup.policy", ConfigType.LIST, "delete",
              "delete: drop old segments by time or size; compact: keep the newest value per key.",
              choices=("delete", "compact")),
    ConfigDef("retention.ms", ConfigType.LONG, "604800000",
              "Keep a segment at most this long (-1: forever).", minimum=-1),
    ConfigDef("retention.bytes", ConfigType.LONG, "-1",
              "Delete old segments once a partition is larger than this (-1: no limit)."),
    ConfigDef("segment.bytes", ConfigType.INT, "1073741824",
              "Roll a new segment when the active one reaches this size.", minimum=14),
    ConfigDef("segment.ms", ConfigType.LONG, "604800000",
              "Roll a new segment when the active one is this old.", minimum=1),
    ConfigDef("min.insync.replicas", ConfigType.INT, "1",
              "acks=all produce fails with NOT_ENOUGH_REPLICAS below this many in-sync replicas.", minimum=1),
    ConfigDef("unclean.leader.election.enable", ConfigType.BOOLEAN, "false",
              "Elect an out-of-sync replica when no in-sync replica is alive (may lose data)."),
    ConfigDef("max.message.bytes", ConfigType.INT, "1048588",
              "The largest record batch this topic accepts.", minimum=0),
    ConfigDef("compression.type", ConfigType.STRING, "producer",
              "Compression of stored batches; producer keeps the producer's codec.",
              choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    ConfigDef("message.timestamp.type", ConfigType.STRING, "CreateTime",
              "Whether a record's timestamp is set by the producer or at append.",
              choices=("CreateTime", "LogAppendTime")),
    ConfigDef("message.timestamp.before.max.ms", ConfigType.LONG, str(_LONG_MAX),
              "Refuse a CreateTime record whose timestamp is this far behind the broker's clock.",
              minimum=0),
    # Kafka 4.0's default (KIP-1030): a record at most an hour in the future.
    ConfigDef("message.timestamp.after.max.ms", ConfigType.LONG, "3600000",
              "Refuse a CreateTime record whose timestamp is this far ahead of the broker's clock.",
              minimum=0),
    ConfigDef("flush.messages", ConfigType.LONG, str(_LONG_MAX),
              "fsync after this many messages (default: rely on replication).", minimum=1),
    ConfigDef("flush.ms", ConfigType.LONG, str(_LONG_MAX),
              "fsync when data is this old (default: rely on replication).", minimum=0),
    ConfigDef("delete.retention.ms", ConfigType.LONG, "86400000",
              "How long compaction keeps tombstones.", minimum=0),
    ConfigDef("min.compaction.lag.ms", ConfigType.LONG, "0",
              "A record stays uncompacted at least this long.", minimum=0),
    ConfigDef("max.compaction.lag.ms", ConfigType.LONG, str(_LONG_MAX),
              "A record stays uncompacted at most this long, whatever the dirty ratio (KIP-354).", minimum=1),
    ConfigDef("min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5",
              "Compact a log once this fraction of it is dirty (written since its last compaction).",
              fraction_range=(0.0, 1.0)),
    ConfigDef("index.interval.bytes", ConfigType.INT, "4096",
              "Bytes between two offset index entries.", minimum=0),
    ConfigDef("segment.index.bytes", ConfigType.INT, "10485760",
              "Maximum size of a segment's offset index.", minimum=4),
    # Accepted and described as Kafka's; deleted segment files go after the
    # broker's file.delete.delay.ms whatever the topic says.
    ConfigDef("file.delete.delay.ms", ConfigType.LONG, "60000",
              "How long a deleted segment's files stay on disk (the broker's setting applies).", minimum=0),
    ConfigDef("leader.replication.throttled.replicas", ConfigType.LIST, "",
              "Replicas (PARTITION:BROKER,... or * for all) whose leader holds what it sends to followers "
              "out of the ISR to the broker's leader.replication.throttled.rate."),
    ConfigDef("follower.replication.throttled.replicas", ConfigType.LIST, "",
              "Replicas (PARTITION:BROKER,... or * for all) that fetch, while out of the ISR, at most the "
              "broker's follower.replication.throttled.rate."),
)

TOPIC_CONFIGS: Mapping[str, ConfigDef] = {d.name: d for d in _DEFS}
"""Every topic config key raftka knows, by name."""


THROTTLED_REPLICAS_SUFFIX = ".replication.throttled.replicas"


def throttled_replicas_error(name: str, value: str, items: list[str]) -> str | None:
    """A throttled-replicas list is empty, `*`, or PARTITION:BROKER pairs (Kafka's format)."""
    if items == ["*"] or not items:
        return None
    for item in items:
        partition, sep, broker = item.partition(":")
        if not (sep and partition.strip().isdigit() and broker.strip().isdigit()):
            return (f"Invalid value {value} for configuration {name}: {item!r} is not PARTITION:BROKER; "
                    f"give a list such as 0:1,1:2 or * for every replica")
    return None


def topic_config_error(key: str, value: str | None) -> str | None:
    """None if `key=value` is a valid topic config, else a message for INVALID_CONFIG."""
    d = TOPIC_CONFIGS.get(key)
    if d is None:
        return f"Unknown topic config name: {key}"
    return d.validate(value)


def effective_topic_config(explicit: Mapping[str, str]) -> dict[str, str]:
    """Every known key with its explicit value or Kafka's default."""
    return {name: explicit.get(name, d.default) for name, d in TOPIC_CONFIGS.items()}
