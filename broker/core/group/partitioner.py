"""Which `__consumer_offsets` partition, and so which broker, coordinates a group (pure).

Theory of operation
-------------------
Kafka places a group on partition `Utils.abs(groupId.hashCode()) %
offsets.topic.num.partitions`; the leader of that partition is the group's
coordinator (FindCoordinator answers with it). Clients never compute this
themselves, but tools and operators do (and a data dir moved from Kafka
must keep its groups where they were), so raftka uses exactly Kafka's
arithmetic:

- `String.hashCode()` runs over UTF-16 code units, not code points: a
  character outside the Basic Multilingual Plane counts as its two
  surrogates. `s[0]*31^(n-1) + ... + s[n-1]`, wrapped to a signed 32-bit int.
- `Utils.abs` maps `Integer.MIN_VALUE` to 0 (`Math.abs` would return it
  unchanged, negative), so such a group lands on partition 0.
"""

from __future__ import annotations

OFFSETS_TOPIC_NAME = "__consumer_offsets"

_INT32_MIN = -(2**31)
_MASK32 = 0xFFFFFFFF


def java_string_hash_code(text: str) -> int:
    """`text.hashCode()` as Java computes it: a signed 32-bit int."""
    h = 0
    for unit in _utf16_code_units(text):
        h = (31 * h + unit) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka's `Utils.abs`: |n|, except that Integer.MIN_VALUE gives 0."""
    assert _INT32_MIN <= n < 2**31, f"{n} is not a 32-bit int"
    return 0 if n == _INT32_MIN else abs(n)


def partition_for_group(group_id: str, num_partitions: int) -> int:
    """The `__consumer_offsets` partition that holds `group_id` (as Kafka)."""
    assert num_partitions > 0, "offsets.topic.num.partitions must be positive"
    return kafka_abs(java_string_hash_code(group_id)) % num_partitions


def offsets_topic_configs(segment_bytes: int = 100 * 1024 * 1024) -> dict[str, str]:
    """Topic configs of `__consumer_offsets` when it is created on first use:
    compacted (the newest value per key is the state; tombstones delete),
    `offsets.topic.segment.bytes` (default 100 MiB) as in Kafka."""
    return {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "segment.bytes": str(segment_bytes),
    }


def _utf16_code_units(text: str):
    for ch in text:
        cp = ord(ch)
        if cp < 0x10000:
            yield cp
        else:
            cp -= 0x10000
            yield 0xD800 | (cp >> 10)
            yield 0xDC00 | (cp & 0x3FF)
