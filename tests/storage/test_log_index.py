"""Sparse index math against a linear-scan oracle, and the file encodings."""

import struct
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.errors import CorruptIndexError
from storage.index import (
    OffsetIndex,
    TimeIndex,
    floor_index,
    parse_offset_index,
    parse_time_index,
    strict_floor_index,
)

sorted_keys = st.lists(st.integers(0, 10_000), unique=True).map(sorted)


def oracle_floor(keys, target):
    best = -1
    for i, k in enumerate(keys):
        if k <= target:
            best = i
    return best


def oracle_strict_floor(keys, target):
    best = -1
    for i, k in enumerate(keys):
        if k < target:
            best = i
    return best


@given(sorted_keys, st.integers(-5, 10_005))
def test_floor_index_matches_linear_scan(keys, target):
    assert floor_index(array("q", keys), target) == oracle_floor(keys, target)
    assert strict_floor_index(array("q", keys), target) == oracle_strict_floor(keys, target)


@given(st.lists(st.integers(0, 10_000), min_size=1).map(sorted), st.integers(-5, 10_005))
def test_floor_with_repeated_timestamps(keys, target):
    # Time index keys only grow, but a lookup must still handle repeats.
    assert floor_index(keys, target) == oracle_floor(keys, target)
    assert strict_floor_index(keys, target) == oracle_strict_floor(keys, target)


entries = st.lists(st.tuples(st.integers(1, 500), st.integers(1, 500)), max_size=60)


def _build(base, steps):
    index = OffsetIndex(base, 1000)
    offset, position = base, 0
    for d_off, d_pos in steps:
        offset += d_off
        position += d_pos
        index.append(offset, position)
    return index


@given(st.integers(0, 1 << 40), entries, st.integers(0, 40_000))
def test_offset_index_lookup_is_the_floor_entry(base, steps, probe):
    index = _build(base, steps)
    pairs = list(zip(index.offsets, index.positions))
    target = base + probe
    expected = max((p for p in pairs if p[0] <= target), default=(base, 0))
    assert tuple(index.lookup(target)) == expected
    by_position = max((p for p in pairs if p[1] <= probe), default=(base, 0))
    assert tuple(index.lookup_position(probe)) == by_position


@given(st.integers(0, 1 << 40), entries)
def test_offset_index_file_round_trip(base, steps):
    index = _build(base, steps)
    size = (index.positions[-1] + 1) if len(index) else 0
    again = parse_offset_index(index.encode(), base, 1000, size)
    assert list(again.offsets) == list(index.offsets)
    assert list(again.positions) == list(index.positions)
    # Encoding from an entry on gives the file's tail.
    half = len(index) // 2
    assert index.encode()[half * 8 :] == index.encode(half)


@given(st.integers(0, 1 << 40), st.lists(st.tuples(st.integers(1, 100), st.integers(0, 50)), max_size=40))
def test_time_index_round_trip_and_lookup(base, steps):
    index = TimeIndex(base, 1000)
    ts, off = 1000, base
    for d_ts, d_off in steps:
        ts += d_ts
        off += d_off
        index.maybe_append(ts, off)
        index.maybe_append(ts, off)  # not a new maximum: ignored
    again = parse_time_index(index.encode(), base, 1000)
    assert list(again.timestamps) == list(index.timestamps)
    assert list(again.offsets) == list(index.offsets)
    for target in range(900, ts + 5, 7):
        below = [(t, o) for t, o in zip(index.timestamps, index.offsets) if t < target]
        assert tuple(index.lookup_before(target)) == (below[-1] if below else (-1, base))


def test_truncation_drops_entries_at_and_past_the_cut():
    index = _build(100, [(10, 100)] * 5)  # (110,100) (120,200) ... (150,500)
    index.written = 5
    index.truncate_to_position(300)
    assert list(index.offsets) == [110, 120]
    assert index.written == 2
    time_index = TimeIndex(100, 10)
    for ts, off in [(5, 100), (7, 110), (9, 130)]:
        time_index.maybe_append(ts, off)
    time_index.truncate_to_offset(130)
    assert list(time_index.timestamps) == [5, 7]
    assert time_index.last_ts == 7


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x00" * 7, "not a multiple"),
        (b"\x00\x00\x00\x05\x00\x00\x00\x10" * 2, "must increase"),  # repeated entry
        (b"\x00\x00\x00\x05\x00\x00\x10\x00", "inside the segment"),  # position past the end
        (b"\xff\xff\xff\xff\x00\x00\x00\x10", "must increase"),  # negative relative offset
    ],
)
def test_damaged_offset_index_is_refused(data, why):
    with pytest.raises(CorruptIndexError, match=why):
        parse_offset_index(data, 0, 100, segment_size=1000)


def test_damaged_time_index_is_refused():
    good = TimeIndex(0, 10)
    good.maybe_append(10, 1)
    good.maybe_append(20, 2)
    data = good.encode()
    with pytest.raises(CorruptIndexError):
        parse_time_index(data[12:] + data[:12], 0, 10)  # timestamps go backwards
    with pytest.raises(CorruptIndexError):
        parse_time_index(data[:-1], 0, 10)
    # A negative timestamp is never indexed (the in-memory arrays are
    # unsigned): a file holding one is damaged, and gets rebuilt.
    negative = struct.pack(">qi", -5, 1)
    with pytest.raises(CorruptIndexError, match=">= 0"):
        parse_time_index(negative + data, 0, 10)
