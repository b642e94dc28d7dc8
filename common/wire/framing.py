"""Size-prefixed framing of the Kafka protocol (pure: no sockets, no trio).

Theory of operation
-------------------
Every Kafka request and response is one frame: a big-endian int32 size,
then that many bytes.

A server receives straight into a `ReceiveBuffer`: the socket writes into
its chunk (`recv_into(buffer.receive_view())`) and `received(n)` returns
every complete frame the new bytes finish, as read-only `memoryview`s of
the chunk. No byte is copied between the kernel and the handler, and the
chunk is reused: once no view of it is alive (every request it held has
been handled), the next bytes go to its start again, so a busy connection
keeps writing into the same warm memory instead of fresh allocations
(docs/architecture.md, "The hot path"). A view that outlives its request only
stops that reuse; it never sees other bytes. A frame that does not fit
what is left of the chunk moves, with the part of it already received, to
a fresh chunk sized for it.

`FrameBuffer` is the simpler form for clients: `feed(data)` takes the
bytes of a `receive_some` and returns the frames they complete, as
read-only views of buffers that are never written again.

In both, a declared size larger than `socket.request.max.bytes` (or
negative) is refused as soon as its 4 bytes are seen, before any of the
body is buffered, as Kafka's `NetworkReceive` does. The caller then closes
the connection.

Outgoing responses may be built as a list of parts: buffers and
`FileSlice`s (a byte range of an open file, sent with `os.sendfile` by the
server). `frame_size_prefix` computes the size prefix of such a list.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple, Protocol

from common.wire.errors import LocalProtocolError, RemoteProtocolError

SIZE_PREFIX = struct.Struct(">i")
SIZE_PREFIX_BYTES = 4
MAX_INT32 = 2**31 - 1

#: Kafka's default `socket.request.max.bytes`.
DEFAULT_REQUEST_MAX_BYTES = 104857600


class HasFileno(Protocol):
    def fileno(self) -> int: ...


class FileSlice(NamedTuple):
    """`count` bytes of `file` starting at `offset`, to be sent as they are.

    `file` is an open file object (preferred: if the storage layer closes it
    before the response is sent, `fileno()` raises and the connection is
    closed instead of sending another file's bytes) or a raw fd. The bytes
    must exist when the response is sent: a short file is an error that
    closes the connection, because the frame's size prefix already promised
    them.
    """

    file: HasFileno | int
    offset: int
    count: int


Buffer = bytes | bytearray | memoryview
ResponsePart = Buffer | FileSlice


def part_length(part: ResponsePart) -> int:
    """Number of bytes `part` puts on the wire."""
    if isinstance(part, FileSlice):
        return part.count
    if isinstance(part, memoryview):
        return part.nbytes
    return len(part)


def frame_size_prefix(lengths: Iterable[int]) -> bytes:
    """The 4-byte size prefix of a frame whose parts have these lengths."""
    total = sum(lengths)
    if total > MAX_INT32:
        raise LocalProtocolError(
            f"a frame of {total} bytes does not fit Kafka's int32 size prefix; "
            "split the response (e.g. lower the fetch's max bytes)"
        )
    return SIZE_PREFIX.pack(total)


def frame_parts(*parts: ResponsePart) -> list[ResponsePart]:
    """`[size prefix, *parts]`: one complete frame as a list of parts."""
    return [frame_size_prefix(part_length(p) for p in parts), *parts]


def _check_size(size: int, request_max_bytes: int) -> None:
    if size < 0:
        raise RemoteProtocolError(
            f"frame declares a negative size ({size}); the peer is not speaking "
            "the Kafka protocol"
        )
    if size > request_max_bytes:
        raise RemoteProtocolError(
            f"frame declares {size} bytes, more than socket.request.max.bytes="
            f"{request_max_bytes}; refused before reading its body (raise "
            "socket.request.max.bytes if such requests are legitimate)"
        )


def split_frames(
    buf: bytes | bytearray | memoryview, request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES
) -> tuple[list[memoryview], int]:
    """Every complete frame at the start of `buf`, and how many bytes they use.

    Returns `(frames, consumed)`: frames are views of `buf` without their
    size prefix; `buf[consumed:]` is the start of an incomplete frame. If the
    size prefix of the incomplete frame is already there, it is checked too,
    so an oversized frame is refused before its body arrives.
    """
    view = memoryview(buf).cast("B")
    if not view.readonly:
        view = view.toreadonly()
    end = view.nbytes
    frames: list[memoryview] = []
    pos = 0
    unpack_from = SIZE_PREFIX.unpack_from
    while end - pos >= SIZE_PREFIX_BYTES:
        (size,) = unpack_from(view, pos)
        _check_size(size, request_max_bytes)
        start = pos + SIZE_PREFIX_BYTES
        if end - start < size:
            break
        frames.append(view[start : start + size])
        pos = start + size
    return frames, pos


class FrameBuffer:
    """Accumulates received bytes and yields complete frames.

    Pure state machine: `feed(data)` returns the frames `data` completes,
    raising `RemoteProtocolError` on an oversized or negative size prefix.
    `bytes_wanted` tells the reader how much to ask for next, so a large
    frame arrives in few, large reads.
    """

    def __init__(self, request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES) -> None:
        self.request_max_bytes = request_max_bytes
        self._pending = bytearray()
        # Bytes `_pending` must hold before parsing it again can yield a frame.
        self._needed = SIZE_PREFIX_BYTES

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held now (bounded by request_max_bytes + 4)."""
        return len(self._pending)

    @property
    def bytes_wanted(self) -> int:
        """How many more bytes complete the frame being buffered (at least 1)."""
        return max(1, self._needed - len(self._pending))

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        if not self._pending:
            if not isinstance(data, bytes):
                data = bytes(data)
            frames, consumed = split_frames(data, self.request_max_bytes)
            if consumed < len(data):
                self._keep(memoryview(data)[consumed:])
            return frames
        self._pending += data
        if self._needed == SIZE_PREFIX_BYTES:
            # The size prefix may just have become complete: check it now.
            self._update_needed()
        if len(self._pending) < self._needed:
            return []
        # Hand the accumulated bytearray over to the frames (read-only views)
        # and never touch it again, instead of copying it into bytes.
        whole = self._pending
        self._pending = bytearray()
        self._needed = SIZE_PREFIX_BYTES
        frames, consumed = split_frames(whole, self.request_max_bytes)
        if consumed < len(whole):
            self._keep(memoryview(whole)[consumed:])
        return frames

    def _keep(self, rest: memoryview) -> None:
        self._pending += rest
        self._update_needed()

    def _update_needed(self) -> None:
        if len(self._pending) >= SIZE_PREFIX_BYTES:
            (size,) = SIZE_PREFIX.unpack_from(self._pending, 0)
            _check_size(size, self.request_max_bytes)
            self._needed = SIZE_PREFIX_BYTES + size
        else:
            self._needed = SIZE_PREFIX_BYTES


#: First chunk of a `ReceiveBuffer`; chunks grow to hold a few frames of the
#: largest size seen, up to `MAX_CHUNK_BYTES` (a larger frame gets a chunk
#: of its own).
MIN_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 2 * 1024 * 1024
#: Receive into a fresh chunk rather than into a smaller tail than this.
MIN_RECEIVE_BYTES = 16 * 1024


def _exported(chunk: bytearray) -> bool:
    """Whether a view of `chunk` is alive (a frame still being handled).

    A bytearray with live buffer exports refuses to change size, so a
    one-byte shrink (undone at once, without reallocating) tells."""
    try:
        del chunk[-1:]
    except BufferError:
        return True
    chunk.append(0)
    return False


class ReceiveBuffer:
    """The receiving end of one connection: bytes in, complete frames out.

    Pure state machine. The owner receives into `receive_view()` and
    reports the byte count to `received(n)`, which returns the frames they
    complete (read-only views, without their size prefix) and raises
    `RemoteProtocolError` on an oversized or negative size prefix. The
    owner must not keep the view given by `receive_view()` across calls:
    it would pin the chunk.
    """

    def __init__(
        self,
        request_max_bytes: int = DEFAULT_REQUEST_MAX_BYTES,
        *,
        min_chunk_bytes: int = MIN_CHUNK_BYTES,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
    ) -> None:
        assert 0 < min_chunk_bytes <= max_chunk_bytes
        self.request_max_bytes = request_max_bytes
        self._max_chunk_bytes = max_chunk_bytes
        self._chunk_bytes = min_chunk_bytes
        self._chunk = bytearray(min_chunk_bytes)
        # One retired chunk, reused once no frame points into it.
        self._spare: bytearray | None = None
        # The incomplete frame is _chunk[_start:_end]; it needs _needed bytes.
        self._start = 0
        self._end = 0
        self._needed = SIZE_PREFIX_BYTES

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held now (bounded by request_max_bytes + 4)."""
        return self._end - self._start

    @property
    def chunk_bytes(self) -> int:
        """Size of the chunk being received into (for tests and stats)."""
        return len(self._chunk)

    def receive_view(self) -> memoryview:
        """Where the next bytes should be received: a writable view, at
        least one byte long, no longer than the rest of the chunk."""
        chunk = self._chunk
        end = self._end
        if self._start == end and end and not _exported(chunk):
            self._start = end = self._end = 0
        missing = self._needed - (end - self._start)
        tail = len(chunk) - end
        if tail < missing or (tail < MIN_RECEIVE_BYTES and self._needed == SIZE_PREFIX_BYTES):
            chunk = self._move()
        return memoryview(chunk)[self._end:]

    def received(self, nbytes: int) -> list[memoryview]:
        """The frames completed by `nbytes` just received into `receive_view()`."""
        assert 0 <= nbytes <= len(self._chunk) - self._end, nbytes
        end = self._end = self._end + nbytes
        pos = self._start
        if end - pos < self._needed:
            return []
        chunk = self._chunk
        unpack_from = SIZE_PREFIX.unpack_from
        frames: list[memoryview] = []
        view = None
        while end - pos >= SIZE_PREFIX_BYTES:
            (size,) = unpack_from(chunk, pos)
            _check_size(size, self.request_max_bytes)
            start = pos + SIZE_PREFIX_BYTES
            if end - start < size:
                self._grow_for(size)
                self._start = pos
                self._needed = SIZE_PREFIX_BYTES + size
                return frames
            if view is None:
                view = memoryview(chunk).toreadonly()
            frames.append(view[start : start + size])
            pos = start + size
        self._start = pos
        self._needed = SIZE_PREFIX_BYTES
        return frames

    def _grow_for(self, size: int) -> None:
        # Chunks hold at least four frames of the largest size seen.
        while self._chunk_bytes < 4 * size and self._chunk_bytes < self._max_chunk_bytes:
            self._chunk_bytes *= 2

    def _move(self) -> bytearray:
        """Continue in another chunk, taking the incomplete frame along."""
        old = self._chunk
        partial = self._end - self._start
        needed = self._needed
        if needed <= self._max_chunk_bytes:
            size = max(self._chunk_bytes, needed)
        else:
            # A huge frame grows with what arrives (at most doubling, so
            # copies stay below its size) instead of being allocated whole
            # on the word of its size prefix.
            size = min(needed, max(self._max_chunk_bytes, 2 * partial))
        spare = self._spare
        if spare is not None and len(spare) >= size and not _exported(spare):
            chunk = spare
        else:
            chunk = bytearray(size)
        chunk[:partial] = memoryview(old)[self._start : self._end]
        self._chunk = chunk
        self._start, self._end = 0, partial
        # Keep the old chunk for reuse, unless it was a one-off for a huge frame.
        self._spare = old if len(old) <= self._max_chunk_bytes else None
        return chunk
