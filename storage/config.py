"""Per-log configuration, with Kafka's topic-level key names and defaults.

`LogConfig` holds the values the log engine reads; `from_properties` maps
Kafka's dotted keys (`segment.bytes`, ...) onto its fields and refuses an
unknown key or a bad value with a `ConfigError` naming the key and what is
allowed. `flush.messages` and `flush.ms` unset (None) mean "never fsync on
a schedule", Kafka's default: durability comes from replication.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from common.errors import ConfigError

_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1

# Kafka key -> (field, minimum, maximum, what the value means).
_KEYS: dict[str, tuple[str, int, int, str]] = {
    "segment.bytes": ("segment_bytes", 14, _INT32_MAX, "bytes in a segment before it rolls"),
    "segment.ms": ("segment_ms", 1, _INT64_MAX, "ms after which a segment rolls"),
    "segment.index.bytes": ("segment_index_bytes", 12, _INT32_MAX, "bytes of a segment's index"),
    "index.interval.bytes": ("index_interval_bytes", 0, _INT32_MAX, "bytes between index entries"),
    "retention.ms": ("retention_ms", -1, _INT64_MAX, "ms a segment is kept; -1 keeps forever"),
    "retention.bytes": ("retention_bytes", -1, _INT64_MAX, "bytes kept per log; -1 is unlimited"),
    "max.message.bytes": ("max_message_bytes", 0, _INT32_MAX, "largest record batch, in bytes"),
    "flush.messages": ("flush_messages", 1, _INT64_MAX, "messages between fsyncs"),
    "flush.ms": ("flush_ms", 0, _INT64_MAX, "ms between fsyncs"),
}

_DAY_MS = 24 * 60 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """The log engine's settings (Kafka topic configs, same defaults)."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * _DAY_MS
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * _DAY_MS
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    flush_messages: int | None = None
    flush_ms: int | None = None

    def __post_init__(self) -> None:
        for key, (field, low, high, meaning) in _KEYS.items():
            value = getattr(self, field)
            if value is None and field in ("flush_messages", "flush_ms"):
                continue
            _check_range(key, value, low, high, meaning)

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> LogConfig:
        """Build from Kafka's keys (values as ints or decimal strings).
        Keys left out keep their defaults."""
        kwargs: dict[str, int] = {}
        for key, raw in props.items():
            if key not in _KEYS:
                raise ConfigError(
                    f"{key} is not a log config key; the known keys are "
                    f"{', '.join(sorted(_KEYS))}"
                )
            field, low, high, meaning = _KEYS[key]
            kwargs[field] = _parse_int(key, raw, low, high, meaning)
        return cls(**kwargs)

    def to_properties(self) -> dict[str, str]:
        """The settings under Kafka's keys (unset flush keys left out)."""
        out = {}
        for key, (field, *_rest) in _KEYS.items():
            value = getattr(self, field)
            if value is not None:
                out[key] = str(value)
        return out


def _parse_int(key: str, raw: Any, low: int, high: int, meaning: str) -> int:
    if isinstance(raw, bool):
        value = None
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        value = int(raw.strip())
    else:
        value = None
    if value is None:
        raise ConfigError(f"{key}={raw!r} is not an integer; it is the {meaning}")
    _check_range(key, value, low, high, meaning)
    return value


def _check_range(key: str, value: Any, low: int, high: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{key}={value!r} is out of range: it is the {meaning}, "
            f"an integer from {low} to {high}"
        )
