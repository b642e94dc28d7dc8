"""Framing: frames come out whole however the bytes are chunked, a frame a
handler still holds is never overwritten, and an oversized or negative size
is refused on sight of its 4 bytes."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import (
    FileSlice,
    FrameBuffer,
    LocalProtocolError,
    ReceiveBuffer,
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


# --- ReceiveBuffer: the server's zero-copy receive side ----------------------


def receive(buffer: ReceiveBuffer, data: bytes) -> list[memoryview]:
    """Put `data` into `buffer` as a socket's recv_into would, as often as it takes."""
    frames = []
    while data:
        view = buffer.receive_view()
        n = min(len(view), len(data))
        view[:n] = data[:n]
        del view
        frames.extend(buffer.received(n))
        data = data[n:]
    return frames


@given(
    bodies=st.lists(st.binary(max_size=3000), max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=30),
    keep=st.lists(st.booleans(), max_size=30),
)
def test_receive_buffer_yields_every_frame_and_never_overwrites_one_still_held(bodies, cuts, keep):
    stream = b"".join(frame(b) for b in bodies)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    buffer = ReceiveBuffer(request_max_bytes=10_000, min_chunk_bytes=1024, max_chunk_bytes=8192)
    held: list[tuple[memoryview, bytes]] = []
    out = []
    for start, end in zip(points, points[1:]):
        for f in receive(buffer, stream[start:end]):
            out.append(bytes(f))
            if keep and keep[len(out) % len(keep)]:
                held.append((f, out[-1]))
        # A handler still holding its request sees its bytes unchanged.
        assert all(bytes(f) == expected for f, expected in held)
        if len(held) > 3:
            held = held[::2]
    assert out == bodies
    assert buffer.buffered_bytes == 0
    assert all(f.readonly for f, _ in held)


def test_receive_buffer_reuses_its_memory_once_frames_are_let_go():
    buffer = ReceiveBuffer(request_max_bytes=100_000)
    body = bytes(range(256)) * 40
    for _ in range(2000):
        [f] = receive(buffer, frame(body))
        assert f == body
        del f
    # 20 MB went through; the buffer still holds one 64 KiB chunk.
    assert buffer.chunk_bytes == 64 * 1024


@pytest.mark.parametrize("size", [2**31 - 1, 1001, -1])
def test_receive_buffer_refuses_an_oversized_frame_from_its_prefix(size):
    buffer = ReceiveBuffer(request_max_bytes=1000)
    with pytest.raises(RemoteProtocolError, match="socket.request.max.bytes|negative"):
        receive(buffer, frame(b"ok") + struct.pack(">i", size)[:3])
        receive(buffer, struct.pack(">i", size)[3:])


def test_a_huge_frame_gets_memory_as_its_bytes_arrive_not_on_its_prefix_alone():
    buffer = ReceiveBuffer(request_max_bytes=100_000_000, max_chunk_bytes=1 << 20)
    assert receive(buffer, struct.pack(">i", 90_000_000) + b"x" * 10) == []
    assert len(buffer.receive_view()) <= 1 << 20
    body = b"y" * 3_000_000
    [f] = receive(ReceiveBuffer(request_max_bytes=100_000_000, max_chunk_bytes=1 << 20), frame(body))
    assert f == body
