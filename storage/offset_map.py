"""The cleaner's key -> newest offset map, bounded in memory.

Theory of operation
-------------------
Compaction first reads the dirty part of a log and notes, per key, the
offset of its newest record; then it rewrites the log keeping a record
only if no newer offset is noted for its key. Kafka's `SkimpyOffsetMap`
stores a 16-byte MD5 of each key in a fixed buffer
(`log.cleaner.dedupe.buffer.size`): compact, but two keys whose hashes
collide lose a record. This map keys a `dict` by the key bytes themselves,
so it is exact; it counts an estimate of the memory each entry takes (the
key's length plus `ENTRY_OVERHEAD_BYTES`) against the same setting.

When the map is full the cleaner stops reading at a batch boundary and
cleans only up to there (`storage.cleaner_job`); the next pass takes the
rest. The map always takes at least one batch, so a pass always advances.

Pure: no I/O.
"""

from __future__ import annotations

# A dict slot (~30 bytes at 2/3 load), a bytes object's header (33), an
# int (28), rounded up.
ENTRY_OVERHEAD_BYTES = 100


class OffsetMap:
    """Key bytes -> the newest offset seen for it (offsets only grow)."""

    __slots__ = ("max_bytes", "used_bytes", "_offsets")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._offsets: dict[bytes, int] = {}

    def put(self, key: bytes, offset: int) -> None:
        offsets = self._offsets
        previous = offsets.get(key)
        if previous is None:
            self.used_bytes += len(key) + ENTRY_OVERHEAD_BYTES
        else:
            assert offset > previous, f"offsets go backwards for a key: {previous} then {offset}"
        offsets[key] = offset

    def get(self, key: bytes) -> int:
        """The newest offset noted for `key`, or -1."""
        return self._offsets.get(key, -1)

    @property
    def is_full(self) -> bool:
        return self.used_bytes >= self.max_bytes

    def __len__(self) -> int:
        return len(self._offsets)

    def clear(self) -> None:
        self._offsets.clear()
        self.used_bytes = 0
