"""Settings of log compaction, with Kafka's key names and defaults.

`CompactionConfig` holds one topic's keys (`cleanup.policy`,
`delete.retention.ms`, `min.compaction.lag.ms`, `max.compaction.lag.ms`,
`min.cleanable.dirty.ratio`); `CleanerConfig` the broker's
(`log.cleaner.*`). Both build from Kafka's dotted keys with
`from_properties`, which ignores keys it does not own (a caller passes a
topic's whole config) and refuses a bad value with a `ConfigError` naming
the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from common.errors import ConfigError

_LONG_MAX = (1 << 63) - 1
_DAY_MS = 86_400_000


@dataclasses.dataclass(frozen=True)
class CompactionConfig:
    """One topic's compaction settings (Kafka's topic configs)."""

    compact: bool = True
    # cleanup.policy=compact,delete: retention by time and size runs too
    # (the log manager's business; recorded here so it can ask).
    delete: bool = False
    delete_retention_ms: int = _DAY_MS
    min_compaction_lag_ms: int = 0
    # KIP-354: a dirty record older than this forces a clean whatever the
    # dirty ratio.
    max_compaction_lag_ms: int = _LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5

    def __post_init__(self) -> None:
        for key, value in (
            ("delete.retention.ms", self.delete_retention_ms),
            ("min.compaction.lag.ms", self.min_compaction_lag_ms),
            ("max.compaction.lag.ms", self.max_compaction_lag_ms),
        ):
            if not 0 <= value <= _LONG_MAX:
                raise ConfigError(f"{key}={value} is out of range: milliseconds from 0 to {_LONG_MAX}")
        if self.max_compaction_lag_ms < 1:
            raise ConfigError("max.compaction.lag.ms must be at least 1")
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise ConfigError(
                f"min.cleanable.dirty.ratio={self.min_cleanable_dirty_ratio} is out of range: "
                "a fraction from 0 to 1"
            )

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> CompactionConfig:
        kwargs: dict[str, Any] = {}
        if "cleanup.policy" in props:
            raw = props["cleanup.policy"]
            items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
            policies = {p.strip() for p in items if p.strip()}
            # Empty is allowed (Kafka 4.1): the log is neither compacted nor
            # trimmed by retention.
            if not policies <= {"compact", "delete"}:
                raise ConfigError(
                    f"cleanup.policy={raw!r} is not a list of 'compact' and 'delete'"
                )
            kwargs["compact"] = "compact" in policies
            kwargs["delete"] = "delete" in policies
        for key, field_name in (
            ("delete.retention.ms", "delete_retention_ms"),
            ("min.compaction.lag.ms", "min_compaction_lag_ms"),
            ("max.compaction.lag.ms", "max_compaction_lag_ms"),
        ):
            if key in props:
                kwargs[field_name] = _parse_int(key, props[key])
        if "min.cleanable.dirty.ratio" in props:
            raw = props["min.cleanable.dirty.ratio"]
            try:
                kwargs["min_cleanable_dirty_ratio"] = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"min.cleanable.dirty.ratio={raw!r} is not a number from 0 to 1") from None
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class CleanerConfig:
    """The broker's cleaner settings (Kafka's `log.cleaner.*` keys)."""

    # log.cleaner.dedupe.buffer.size: memory for the key -> offset map.
    # Kafka's map stores a 16-byte hash and an offset per key (24 bytes);
    # ours keeps the keys themselves, so a key costs its length plus about
    # 100 bytes of Python overhead (see `storage.offset_map`).
    dedupe_buffer_size: int = 128 * 1024 * 1024
    # log.cleaner.io.max.bytes.per.second: bytes read plus written.
    io_max_bytes_per_second: float = float("inf")
    # log.cleaner.io.buffer.size: bytes one `clean_step` reads at most
    # (beyond one batch), i.e. how long the cleaner holds the event loop.
    io_buffer_size: int = 512 * 1024
    # log.cleaner.backoff.ms: sleep when no log needs cleaning.
    backoff_ms: int = 15_000
    # file.delete.delay.ms: cleaned-away segment files stay open (renamed
    # `.deleted`) this long, so reads already handed out can finish.
    file_delete_delay_ms: int = 60_000

    _KEYS = {
        "log.cleaner.dedupe.buffer.size": "dedupe_buffer_size",
        "log.cleaner.io.buffer.size": "io_buffer_size",
        "log.cleaner.backoff.ms": "backoff_ms",
        "file.delete.delay.ms": "file_delete_delay_ms",
    }

    def __post_init__(self) -> None:
        if self.dedupe_buffer_size < 1024:
            raise ConfigError(f"log.cleaner.dedupe.buffer.size={self.dedupe_buffer_size} is below 1024 bytes")
        if self.io_buffer_size < 1:
            raise ConfigError(f"log.cleaner.io.buffer.size={self.io_buffer_size} must be positive")
        if not self.io_max_bytes_per_second > 0:
            raise ConfigError(
                f"log.cleaner.io.max.bytes.per.second={self.io_max_bytes_per_second} must be positive"
            )
        if self.backoff_ms < 0 or self.file_delete_delay_ms < 0:
            raise ConfigError("log.cleaner.backoff.ms and file.delete.delay.ms must not be negative")

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> CleanerConfig:
        kwargs: dict[str, Any] = {}
        for key, field_name in cls._KEYS.items():
            if key in props:
                kwargs[field_name] = _parse_int(key, props[key])
        key = "log.cleaner.io.max.bytes.per.second"
        if key in props:
            try:
                kwargs["io_max_bytes_per_second"] = float(props[key])
            except (TypeError, ValueError):
                raise ConfigError(f"{key}={props[key]!r} is not a number of bytes per second") from None
        return cls(**kwargs)


def _parse_int(key: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{key}={raw!r} is not an integer")
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
