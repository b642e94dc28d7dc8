"""Putting response parts on a non-blocking socket (I/O shell).

The server sends on the connection's socket directly, waiting for
writability with `trio.lowlevel.wait_writable` only when the kernel's send
buffer is full: a send that goes through costs one system call and no trip
through trio's scheduler.

- Buffers are sent with `sendmsg` (scatter-gather, up to `IOV_BUFFERS` a
  call), so a batch of responses costs one system call and no byte is
  copied to join them.
- A `FileSlice` goes out with `os.sendfile` (the kernel copies page cache
  to socket; 4.7 GB/s here). The buffers before it are sent with
  `MSG_MORE`, so the kernel puts a Fetch response's headers in the same
  segments as the records instead of in tiny segments of their own.
- `file_transfer="pread"` reads slices with `os.pread` in chunks and sends
  them instead (for benchmarks comparing the two).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Literal, NamedTuple

import trio

from raftka.wire.errors import LocalProtocolError
from raftka.wire.framing import FileSlice, ResponsePart, part_length

FileTransfer = Literal["auto", "sendfile", "pread"]


class SendReport(NamedTuple):
    """Bytes `send_parts` put on the wire, and how file slices went."""

    total_bytes: int
    sendfile_bytes: int
    pread_bytes: int


#: Chunk size of the pread path.
PREAD_CHUNK_BYTES = 1024 * 1024
#: Buffers per `sendmsg` (Linux's IOV_MAX is 1024).
IOV_BUFFERS = 512


def _fileno(file: object) -> int:
    if isinstance(file, int):
        return file
    try:
        return file.fileno()  # type: ignore[attr-defined]
    except ValueError as exc:  # closed file object
        raise LocalProtocolError(
            f"a FileSlice's file was closed before its response was sent ({exc}); "
            "keep segment files open while responses that slice them are queued"
        ) from None


def _short_file(part: FileSlice, sent: int) -> LocalProtocolError:
    return LocalProtocolError(
        f"FileSlice(offset={part.offset}, count={part.count}) ended after {sent} "
        "bytes: the file is shorter than the response promised; the frame is "
        "corrupt, so the connection must close"
    )


async def _send_buffers(sock: socket.socket, buffers: list, flags: int) -> None:
    """Send every byte of `buffers` (consumed: the list is left empty)."""
    while buffers:
        batch = buffers[:IOV_BUFFERS]
        try:
            sent = sock.sendmsg(batch, (), flags if len(batch) == len(buffers) else flags | socket.MSG_MORE)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        done = 0
        for buffer in batch:
            size = part_length(buffer)
            if sent < size:
                break
            sent -= size
            done += 1
        del buffers[:done]
        if sent:
            buffers[0] = memoryview(buffers[0]).cast("B")[sent:]


async def _sendfile(sock: socket.socket, part: FileSlice) -> None:
    out_fd = sock.fileno()
    in_fd = _fileno(part.file)
    offset, remaining = part.offset, part.count
    while remaining:
        try:
            sent = os.sendfile(out_fd, in_fd, offset, remaining)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        if sent == 0:
            raise _short_file(part, part.count - remaining)
        offset += sent
        remaining -= sent


async def _pread_send(sock: socket.socket, part: FileSlice) -> None:
    in_fd = _fileno(part.file)
    offset, remaining = part.offset, part.count
    while remaining:
        chunk = os.pread(in_fd, min(remaining, PREAD_CHUNK_BYTES), offset)
        if not chunk:
            raise _short_file(part, part.count - remaining)
        offset += len(chunk)
        remaining -= len(chunk)
        # Like sendfile: the last piece is pushed.
        await _send_buffers(sock, [chunk], socket.MSG_MORE if remaining else 0)


async def send_parts(
    sock: socket.socket, parts: Iterable[ResponsePart], file_transfer: FileTransfer = "auto"
) -> SendReport:
    """Send `parts` in order on a connected non-blocking socket."""
    use_pread = file_transfer == "pread"
    pending: list = []
    total = via_sendfile = via_pread = 0
    for part in parts:
        if isinstance(part, FileSlice):
            if pending:
                await _send_buffers(sock, pending, socket.MSG_MORE)
            if use_pread:
                await _pread_send(sock, part)
                via_pread += part.count
            else:
                await _sendfile(sock, part)
                via_sendfile += part.count
            total += part.count
            continue
        length = part_length(part)
        if length:
            pending.append(part)
            total += length
    if pending:
        await _send_buffers(sock, pending, 0)
    return SendReport(total, via_sendfile, via_pread)
