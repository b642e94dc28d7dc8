"""Offset arithmetic of the `raftka` Spark data source: pure, no client, no Spark.

Theory of operation
-------------------
A read is a set of half-open ranges `[start_offset, end_offset)`, one per
topic partition; one range becomes one Spark partition (one task). The
driver plans ranges from the partitions' bounds, which ListOffsets gives:
`log_start_offset` (EARLIEST, -2) and the offset a consumer may read up to
(LATEST, -1: the high watermark, or the last stable offset under
read_committed).

Offsets travel as Spark's Kafka source writes them, a JSON object
`{"topic": {"0": 123, "1": 45}}`: the next offset to read per partition.
The same form is the user's `startingOffsets` / `endingOffsets`, where -2
means earliest and -1 latest, and it is what a streaming query keeps in
its checkpoint. `encode_offsets` always writes topics and partitions in
sorted order, so two equal positions are the same JSON text.

A streaming micro-batch runs from the previous batch's end to
`next_end_offsets`: each partition's latest offset, capped by the
`Trigger.AvailableNow` target when there is one, and by
`maxOffsetsPerTrigger`. The cap is spread over the partitions in proportion
to their lag, as Spark's Kafka source does. Spark rounds each share on its
own (up when the share is below one record), so a batch can overshoot the
limit by up to one record per partition; here the shares are whole numbers
by largest remainder (Hamilton's method), so a batch reads exactly
`min(limit, total lag)` records and still moves forward whenever any
partition lags.

A partition whose offset goes backwards (its log was truncated, or the
topic was deleted and created again) means records the query was promised
are gone. Like Spark's `failOnDataLoss=true`, that is an error, never a
silent skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from common.errors import RaftkaError

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


class SparkSourceError(RaftkaError):
    """The `raftka` Spark data source cannot do what it was asked; the message says which option or partition."""


@dataclass(frozen=True)
class PartitionBounds:
    """What ListOffsets says about one partition: `[log_start_offset, latest_offset)` is readable."""

    log_start_offset: int
    latest_offset: int

    def __post_init__(self) -> None:
        assert 0 <= self.log_start_offset <= self.latest_offset, self


@dataclass(frozen=True)
class OffsetRange:
    """One Spark partition: read `topic`-`partition` over `[start_offset, end_offset)`."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int

    def __post_init__(self) -> None:
        assert 0 <= self.start_offset < self.end_offset, self

    @property
    def count(self) -> int:
        """Offsets in the range; records can be fewer (compaction, transaction markers)."""
        return self.end_offset - self.start_offset


@dataclass(frozen=True)
class OffsetSpec:
    """A `startingOffsets` / `endingOffsets` value: "earliest", "latest", or per-partition offsets."""

    kind: str  # "earliest" | "latest" | "specific"
    specific: tuple[tuple[TopicPartition, int], ...] = ()


def parse_offset_spec(text: str, option: str, topics: tuple[str, ...]) -> OffsetSpec:
    """Parse `earliest`, `latest` or Spark's JSON form (-2 earliest, -1 latest per partition)."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec(word)
    try:
        offsets = decode_offsets(json.loads(text))
    except (ValueError, TypeError, AttributeError) as exc:
        raise SparkSourceError(
            f"{option} must be 'earliest', 'latest' or JSON like "
            f'{{"{topics[0]}": {{"0": 23, "1": -2}}}} (-2: earliest, -1: latest); got {text!r} ({exc})'
        ) from None
    unknown = sorted({topic for topic, _ in offsets} - set(topics))
    if unknown:
        raise SparkSourceError(f"{option} names topics {unknown} that are not in subscribe={','.join(topics)}")
    for tp, offset in offsets.items():
        if offset < EARLIEST:
            raise SparkSourceError(f"{option}: offset {offset} of {tp[0]}-{tp[1]} is invalid; "
                                   "use an offset >= 0, -2 (earliest) or -1 (latest)")
    return OffsetSpec("specific", tuple(sorted(offsets.items())))


def resolve(spec: OffsetSpec, bounds: Mapping[TopicPartition, PartitionBounds], option: str) -> Offsets:
    """Turn a spec into one offset per partition of `bounds`, checked against them."""
    if spec.kind == "earliest":
        return {tp: b.log_start_offset for tp, b in bounds.items()}
    if spec.kind == "latest":
        return {tp: b.latest_offset for tp, b in bounds.items()}
    given = dict(spec.specific)
    # Spark's Kafka source insists on every partition too: a forgotten
    # partition silently read from some default is a worse surprise.
    missing = sorted(set(bounds) - set(given))
    if missing:
        names = ", ".join(f"{t}-{p}" for t, p in missing)
        raise SparkSourceError(f"{option} gives offsets for some partitions but not for {names}; "
                               "give every partition (-2: earliest, -1: latest)")
    extra = sorted(set(given) - set(bounds))
    if extra:
        names = ", ".join(f"{t}-{p}" for t, p in extra)
        raise SparkSourceError(f"{option} names partitions {names} that the topic does not have")
    resolved: Offsets = {}
    for tp, b in bounds.items():
        offset = given[tp]
        if offset == EARLIEST:
            offset = b.log_start_offset
        elif offset == LATEST:
            offset = b.latest_offset
        elif not b.log_start_offset <= offset <= b.latest_offset:
            raise SparkSourceError(
                f"{option}: offset {offset} of {tp[0]}-{tp[1]} is outside the readable "
                f"[{b.log_start_offset}, {b.latest_offset}] (log start offset, latest offset)")
        resolved[tp] = offset
    return resolved


def plan_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One range per partition of `end` with something to read, in (topic, partition) order."""
    ranges = []
    for tp in sorted(end):
        begin, until = start[tp], end[tp]
        if begin > until:
            raise SparkSourceError(f"{tp[0]}-{tp[1]}: start offset {begin} is after end offset {until}; "
                                   "startingOffsets must not be past endingOffsets")
        if begin < until:
            ranges.append(OffsetRange(tp[0], tp[1], begin, until))
    return ranges


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """End offsets that advance `start` toward `latest` by at most `max_rows` offsets in all,
    shared in proportion to each partition's lag (largest remainder; ties by partition)."""
    assert max_rows > 0
    assert set(start) == set(latest) and all(latest[tp] >= start[tp] for tp in start)
    lag = {tp: latest[tp] - start[tp] for tp in sorted(start)}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    share = {tp: max_rows * n // total for tp, n in lag.items()}
    remainder = {tp: max_rows * n % total for tp, n in lag.items()}
    # The remainders sum to a multiple of `total`: (max_rows - sum(share)) * total.
    # So at least that many partitions have a non-zero remainder, and each
    # extra record goes to one whose exact share exceeds its floor, which
    # keeps every share within its lag.
    left = max_rows - sum(share.values())
    for tp in sorted(remainder, key=lambda tp: (-remainder[tp], tp))[:left]:
        assert remainder[tp] > 0
        share[tp] += 1
    end = {tp: start[tp] + share[tp] for tp in lag}
    assert sum(end[tp] - start[tp] for tp in end) == max_rows
    return end


def next_end_offsets(
    start: Offsets,
    bounds: Mapping[TopicPartition, PartitionBounds],
    max_rows: int | None,
    target: Offsets | None = None,
) -> Offsets:
    """The end of the next micro-batch that starts at `start`.

    Partitions that appeared since `start` begin at their log start offset
    (new partitions are read from the beginning, as in Spark). `target`, the
    `Trigger.AvailableNow` snapshot, caps every partition and leaves out
    partitions created after it. A partition no longer in `bounds` (its
    topic was deleted) keeps its offset."""
    begin: Offsets = {}
    latest: Offsets = {}
    for tp, b in bounds.items():
        if target is not None and tp not in target:
            continue
        first = start.get(tp, b.log_start_offset)
        if b.latest_offset < first:
            raise SparkSourceError(
                f"{tp[0]}-{tp[1]}: the latest offset is {b.latest_offset} but the query has read up to "
                f"{first}; records it was promised are gone (log truncated, or topic re-created). "
                "Start a new query (a new checkpoint location) to read the partition again")
        until = b.latest_offset if target is None else max(first, min(target[tp], b.latest_offset))
        begin[tp], latest[tp] = first, until
    end = latest if max_rows is None else rate_limit(begin, latest, max_rows)
    for tp, offset in start.items():
        end.setdefault(tp, offset)
    return end


def encode_offsets(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Spark's Kafka offset JSON object, topics and partitions in sorted order."""
    encoded: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        encoded.setdefault(topic, {})[str(partition)] = offset
    return encoded


def decode_offsets(encoded: Mapping[str, Mapping[str, int]]) -> Offsets:
    """The inverse of `encode_offsets`; raises ValueError/TypeError on anything else."""
    if not isinstance(encoded, Mapping):
        raise TypeError(f"expected a JSON object of topics, got {type(encoded).__name__}")
    offsets: Offsets = {}
    for topic, partitions in encoded.items():
        if not isinstance(partitions, Mapping):
            raise TypeError(f"topic {topic!r} must map to an object of partition: offset")
        for partition, offset in partitions.items():
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise TypeError(f"offset of {topic}-{partition} must be an integer, got {offset!r}")
            offsets[(topic, int(partition))] = offset
    return offsets
