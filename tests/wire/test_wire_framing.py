"""Framing: frames come out whole however the bytes are chunked, and an
oversized or negative size is refused on sight of its 4 bytes."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftka.wire import (
    FileSlice,
    FrameBuffer,
    LocalProtocolError,
    RemoteProtocolError,
    frame_parts,
    frame_size_prefix,
    split_frames,
)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_split_frames_returns_complete_frames_and_where_the_partial_one_starts():
    data = frame(b"one") + frame(b"") + frame(b"three") + frame(b"four")[:6]
    frames, consumed = split_frames(data)
    assert [bytes(f) for f in frames] == [b"one", b"", b"three"]
    assert consumed == 7 + 4 + 9
    assert all(f.readonly for f in frames)


@given(
    bodies=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_frame_buffer_yields_the_same_frames_for_any_chunking(bodies, cuts):
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    buffer = FrameBuffer(request_max_bytes=1000)
    out = []
    for start, end in zip(points, points[1:]):
        out.extend(bytes(f) for f in buffer.feed(stream[start:end]))
    assert out == bodies
    assert buffer.buffered_bytes == 0


@pytest.mark.parametrize("size", [2**31 - 1, 1001, -1, -(2**31)])
def test_oversized_or_negative_size_is_refused_from_the_prefix_alone(size):
    buffer = FrameBuffer(request_max_bytes=1000)
    with pytest.raises(RemoteProtocolError, match="socket.request.max.bytes|negative"):
        buffer.feed(struct.pack(">i", size))


def test_oversized_size_is_refused_even_when_its_prefix_arrives_in_pieces():
    buffer = FrameBuffer(request_max_bytes=1000)
    prefix = struct.pack(">i", 5000)
    assert buffer.feed(frame(b"ok") + prefix[:2]) == [b"ok"]
    with pytest.raises(RemoteProtocolError, match="5000 bytes"):
        buffer.feed(prefix[2:])


def test_a_frame_of_exactly_request_max_bytes_is_accepted():
    buffer = FrameBuffer(request_max_bytes=1000)
    assert [bytes(f) for f in buffer.feed(frame(b"x" * 1000))] == [b"x" * 1000]


def test_bytes_wanted_asks_for_the_rest_of_a_big_frame():
    buffer = FrameBuffer()
    buffer.feed(struct.pack(">i", 1_000_000) + b"x" * 1000)
    assert buffer.bytes_wanted == 999_000
    buffer.feed(b"x" * 998_999)
    assert buffer.bytes_wanted == 1
    assert [f.nbytes for f in buffer.feed(b"x")] == [1_000_000]
    assert buffer.bytes_wanted == 4


def test_frame_parts_prefixes_the_total_of_buffers_and_file_slices():
    parts = frame_parts(b"abc", memoryview(b"de"), FileSlice(0, 10, 7))
    assert parts[0] == struct.pack(">i", 3 + 2 + 7)
    assert parts[1:] == [b"abc", memoryview(b"de"), FileSlice(0, 10, 7)]
    assert frame_size_prefix([1, 2, 3]) == struct.pack(">i", 6)


def test_a_frame_too_big_for_int32_is_our_mistake():
    with pytest.raises(LocalProtocolError, match="int32"):
        frame_size_prefix([2**31])
