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
- A small `FileSlice` (at most `SMALL_SLICE_BYTES`) is read with `os.pread`
  and sent in the `sendmsg` of the buffers around it. A follower that keeps
  up fetches one or a few small batches from each of many partitions: one
  `sendfile` and one `sendmsg` per partition cost 5-6 us here, a `pread`
  into a shared `sendmsg` about 1 us (at 64 KB: 27-35 us against 18).
  `file_transfer="sendfile"` sends every slice with `sendfile`.
- `file_transfer="pread"` reads slices with `os.pread` in chunks and sends
  them instead (for benchmarks comparing the two).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Literal, NamedTuple

import trio

from common.wire.errors import LocalProtocolError
from common.wire.framing import FileSlice, ResponsePart, part_length

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
#: With "auto", a file slice this small is read and sent with the buffers around it.
SMALL_SLICE_BYTES = 64 * 1024
#: With "auto", small slices read for one `sendmsg` stop after this many bytes.
RUN_READ_BYTES = 1024 * 1024


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


def _sendmsg(sock: socket.socket, buffers: list, flags: int) -> int:
    """One `sendmsg` of `buffers`; 0 if it would block."""
    try:
        return sock.sendmsg(buffers, (), flags)
    except BlockingIOError:
        return 0


def send_now(sock: socket.socket, parts: list, file_transfer: FileTransfer = "auto") -> tuple[SendReport, list]:
    """Send as much of `parts` as the socket takes without waiting.

    Returns what went out and the parts still to send, in order (the first
    one trimmed to what is left of it); an empty list when all went.
    """
    if len(parts) == 1 and type(parts[0]) is bytes:
        # One hand-built response (an acks=1 Produce's): one send.
        part = parts[0]
        try:
            sent = sock.send(part)
        except BlockingIOError:
            sent = 0
        return SendReport(sent, 0, 0), ([] if sent == len(part) else [memoryview(part)[sent:]])
    total = via_sendfile = via_pread = 0
    small = SMALL_SLICE_BYTES if file_transfer == "auto" else -1
    i, n = 0, len(parts)
    while i < n:
        part = parts[i]
        if isinstance(part, FileSlice) and part.count > small:
            if not part.count:
                i += 1
                continue
            if file_transfer == "pread":
                chunk = os.pread(_fileno(part.file), min(part.count, PREAD_CHUNK_BYTES), part.offset)
                if not chunk:
                    raise _short_file(part, 0)
                # Send the chunk as a buffer; the rest of the slice follows it.
                rest = FileSlice(part.file, part.offset + len(chunk), part.count - len(chunk))
                parts = [chunk, rest, *parts[i + 1 :]] if rest.count else [chunk, *parts[i + 1 :]]
                i, n = 0, len(parts)
                via_pread += len(chunk)
                continue
            try:
                sent = os.sendfile(sock.fileno(), _fileno(part.file), part.offset, part.count)
            except BlockingIOError:
                return SendReport(total, via_sendfile, via_pread), parts[i:]
            if sent == 0:
                raise _short_file(part, 0)
            total += sent
            via_sendfile += sent
            if sent < part.count:
                rest = FileSlice(part.file, part.offset + sent, part.count - sent)
                return SendReport(total, via_sendfile, via_pread), [rest, *parts[i + 1 :]]
            i += 1
            continue
        # The run of buffers (and small slices, read) up to the next file
        # slice that goes by sendfile, in one sendmsg; with MSG_MORE when
        # more follows, so the kernel puts them in the same segments as the
        # file's bytes.
        # A follower's answer after a failover is thousands of (header,
        # small slice) pairs: the loop keeps the run's length as it goes
        # (instead of `part_length` on every buffer afterwards) and asks a
        # slice's file for its descriptor directly (`_fileno` only for an
        # int or a closed file).
        run: list = []
        read = 0
        length = 0
        j = i
        while j < n and len(run) < IOV_BUFFERS:
            part = parts[j]
            if isinstance(part, FileSlice):
                file, offset, count = part
                if count > small or read >= RUN_READ_BYTES:
                    break
                if count:
                    try:
                        fd = file.fileno()
                    except (AttributeError, ValueError):  # an int; or a closed file, which `_fileno` reports
                        fd = _fileno(file)
                    chunk = os.pread(fd, count, offset)
                    if len(chunk) < count:
                        raise _short_file(part, len(chunk))
                    read += count
                    run.append(chunk)
                j += 1
                continue
            length += part.nbytes if type(part) is memoryview else len(part)
            run.append(part)
            j += 1
        via_pread += read
        length += read
        sent = _sendmsg(sock, run, socket.MSG_MORE if j < n else 0) if length else 0
        if sent == 0 and length:
            return SendReport(total, via_sendfile, via_pread), [*run, *parts[j:]]  # slices read stay read
        total += sent
        if sent == length:
            i = j
            continue
        sizes = [part_length(buffer) for buffer in run]
        for k, size in enumerate(sizes):
            if sent < size:
                rest = memoryview(run[k]).cast("B")[sent:]
                return SendReport(total, via_sendfile, via_pread), [rest, *run[k + 1 :], *parts[j:]]
            sent -= size
        i = j
    return SendReport(total, via_sendfile, via_pread), []


async def send_parts(
    sock: socket.socket, parts: Iterable[ResponsePart], file_transfer: FileTransfer = "auto"
) -> SendReport:
    """Send `parts` in order on a connected non-blocking socket, waiting
    for writability whenever the kernel's send buffer is full."""
    total = via_sendfile = via_pread = 0
    rest = list(parts)
    while True:
        report, rest = send_now(sock, rest, file_transfer)
        total += report.total_bytes
        via_sendfile += report.sendfile_bytes
        via_pread += report.pread_bytes
        if not rest:
            return SendReport(total, via_sendfile, via_pread)
        await trio.lowlevel.wait_writable(sock)
