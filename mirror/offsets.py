"""Offset syncs and checkpoints: the records, when to write them, and the
translation of a source offset into a target offset.

The wire formats are MirrorMaker 2's (Kafka `Struct`s, big-endian), so
MM2's own tools can read what raftka writes:

    offset sync   key   (topic: int16-length string, partition: int32)
                  value (upstream offset: int64, downstream offset: int64)
    checkpoint    key   (group: string, topic: string, partition: int32)
                  value (version: int16 = 0, upstream offset: int64,
                         downstream offset: int64, metadata: string)

The offset-syncs topic lives on the source (`mm2-offset-syncs.<target>.internal`,
one partition, as MM2's default `offset-syncs.topic.location=source`); the
checkpoints topic `<source>.checkpoints.internal` on the target. The
checkpoint's topic is the *target* topic's name, as in MM2.

Translation (`OffsetSyncStore.translate`): a consumer group's committed
source offset U means "every record before U is consumed". With S the
latest sync at or below U:

- U == S.upstream: S.downstream, exact;
- the next sync S' is above U and the two syncs have the same distance on
  both sides (no gap in between, so every record between them kept its
  offset delta): U + (S.downstream - S.upstream), exact;
- otherwise S.downstream + 1 (MM2's rule since KIP-937's fix): the group
  re-reads the records between S and U on the target, and loses none.
- no sync at or below U: no translation (no checkpoint is written, so the
  group never skips ahead of what the target holds).

The emitter writes a sync for a partition's first record after a start,
whenever the offset delta changes (a gap on either side: compaction,
transaction markers), once `offset.lag.max` records passed since the last
one, and at every commit point for a partition whose latest record is not
synced yet, so translation of a caught-up group is exact.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64_2 = struct.Struct(">qq")


def _string(s: str) -> bytes:
    raw = s.encode()
    return _I16.pack(len(raw)) + raw


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    return buf[pos:pos + n].decode(), pos + n


@dataclasses.dataclass(frozen=True)
class OffsetSync:
    topic: str
    partition: int
    upstream: int
    downstream: int

    def key(self) -> bytes:
        return _string(self.topic) + _I32.pack(self.partition)

    def value(self) -> bytes:
        return _I64_2.pack(self.upstream, self.downstream)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> OffsetSync:
        topic, pos = _read_string(key, 0)
        (partition,) = _I32.unpack_from(key, pos)
        upstream, downstream = _I64_2.unpack_from(value, 0)
        return cls(topic, partition, upstream, downstream)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    group: str
    topic: str  # the target topic
    partition: int
    upstream: int
    downstream: int
    metadata: str = ""

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + _I32.pack(self.partition)

    def value(self) -> bytes:
        return _I16.pack(0) + _I64_2.pack(self.upstream, self.downstream) + _string(self.metadata)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Checkpoint:
        group, pos = _read_string(key, 0)
        topic, pos = _read_string(key, pos)
        (partition,) = _I32.unpack_from(key, pos)
        upstream, downstream = _I64_2.unpack_from(value, 2)
        metadata, _ = _read_string(value, 18)
        return cls(group, topic, partition, upstream, downstream, metadata)


TopicPartition = tuple[str, int]


class OffsetSyncEmitter:
    """Decides which acknowledged records become offset syncs (per source partition)."""

    def __init__(self, max_offset_lag: int) -> None:
        self.max_offset_lag = max_offset_lag
        self._synced: dict[TopicPartition, tuple[int, int]] = {}
        self._latest: dict[TopicPartition, tuple[int, int]] = {}

    def acked(self, tp: TopicPartition, upstream: int, downstream: int) -> OffsetSync | None:
        """The target acknowledged source record `upstream` of `tp` at
        `downstream`; the sync to write now, if any."""
        self._latest[tp] = (upstream, downstream)
        last = self._synced.get(tp)
        if (last is None or downstream - upstream != last[1] - last[0]
                or upstream - last[0] >= self.max_offset_lag):
            return self._emit(tp, upstream, downstream)
        return None

    def pending(self) -> list[OffsetSync]:
        """At a commit point: syncs for each partition whose latest record is not synced."""
        return [self._emit(tp, up, down) for tp, (up, down) in sorted(self._latest.items())
                if self._synced.get(tp) != (up, down)]

    def forget(self, tp: TopicPartition) -> None:
        """The partition moved to another mirror process (its next first record syncs anew)."""
        self._synced.pop(tp, None)
        self._latest.pop(tp, None)

    def _emit(self, tp: TopicPartition, upstream: int, downstream: int) -> OffsetSync:
        self._synced[tp] = (upstream, downstream)
        return OffsetSync(tp[0], tp[1], upstream, downstream)


class OffsetSyncStore:
    """Every offset sync read from the offset-syncs topic, per source partition, for translation."""

    def __init__(self) -> None:
        self._syncs: dict[TopicPartition, list[tuple[int, int]]] = {}

    def add(self, sync: OffsetSync) -> None:
        rows = self._syncs.setdefault((sync.topic, sync.partition), [])
        entry = (sync.upstream, sync.downstream)
        if rows and entry[0] <= rows[-1][0]:
            # A restarted mirror re-sends from its last commit: a sync for an
            # upstream offset seen before replaces the history from there on
            # (the records above it were written again at new target offsets).
            del rows[bisect.bisect_left(rows, (entry[0], -1)):]
        rows.append(entry)

    def translate(self, tp: TopicPartition, upstream: int) -> int | None:
        rows = self._syncs.get(tp)
        if not rows:
            return None
        i = bisect.bisect_right(rows, (upstream, float("inf"))) - 1
        if i < 0:
            return None
        up, down = rows[i]
        if up == upstream:
            return down
        if i + 1 < len(rows):
            next_up, next_down = rows[i + 1]
            if next_up - up == next_down - down:
                return upstream + (down - up)
        return down + 1

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._syncs)


class CheckpointTracker:
    """Which checkpoints are new: a (group, partition) gets one when its translated offset moved."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, TopicPartition], tuple[int, int]] = {}

    def checkpoints(self, group: str, committed: dict[TopicPartition, tuple[int, str]],
                    target_topic: dict[str, str], store: OffsetSyncStore) -> list[Checkpoint]:
        """Checkpoints for `group`, whose committed source offsets are
        `committed` ((offset, metadata) per source partition); partitions of
        topics the flow does not mirror (absent from `target_topic`) and
        offsets with no translation yet are left out."""
        out = []
        for tp, (offset, metadata) in sorted(committed.items()):
            if tp[0] not in target_topic or offset < 0:
                continue
            downstream = store.translate(tp, offset)
            if downstream is None:
                continue
            if self._last.get((group, tp)) == (offset, downstream):
                continue
            self._last[(group, tp)] = (offset, downstream)
            out.append(Checkpoint(group, target_topic[tp[0]], tp[1], offset, downstream, metadata))
        return out

    def latest(self, target_topic: dict[str, str]) -> list[Checkpoint]:
        """The last checkpoint of every (group, partition) of a mirrored topic."""
        return [Checkpoint(group, target_topic[tp[0]], tp[1], up, down)
                for (group, tp), (up, down) in sorted(self._last.items()) if tp[0] in target_topic]


def offsets_to_sync(checkpoints: list[Checkpoint], target_committed: dict[TopicPartition, int]) -> dict[
        TopicPartition, int]:
    """The target offsets to write into a group not active on the target:
    each checkpoint's downstream offset, unless the group already committed
    that far or further there (a mirror never rewinds a group)."""
    out = {}
    for c in checkpoints:
        tp = (c.topic, c.partition)
        if c.downstream > target_committed.get(tp, -1):
            out[tp] = c.downstream
    return out
