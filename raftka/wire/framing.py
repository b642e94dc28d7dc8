"""Size-prefixed framing of the Kafka protocol (pure: no sockets, no trio).

Theory of operation
-------------------
Every Kafka request and response is one frame: a big-endian int32 size,
then that many bytes. A server reads from a socket in bulk (64 KiB or more
per `receive_some`) and hands the bytes to `FrameBuffer.feed`, which returns
every complete frame they finish. Reading in bulk and parsing all complete
frames costs about half as much per request as one exact read per frame
(see ARCHITECTURE.md, "The hot path").

Frames are returned as read-only `memoryview`s over buffers that are never
written again, so no frame is copied out of what was received, and kio can
decode them in place. A frame view keeps the chunk it points
into alive; handlers that keep a small part of a request for a long time
should copy it.

A declared size larger than `socket.request.max.bytes` (or negative) is
refused as soon as its 4 bytes are seen, before any of the body is
buffered, as Kafka's `NetworkReceive` does. The caller then closes the
connection.

Outgoing responses may be built as a list of parts: buffers and
`FileSlice`s (a byte range of an open file, sent with `os.sendfile` by the
server). `frame_size_prefix` computes the size prefix of such a list.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple, Protocol

from raftka.wire.errors import LocalProtocolError, RemoteProtocolError

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
