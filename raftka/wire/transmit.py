"""Putting response parts on a trio stream (I/O shell).

Small buffers are joined and sent with one `send_all`, so a batch of ready
responses costs one system call. Large buffers are sent as they are, never
copied. A `FileSlice` goes out with `os.sendfile` when the stream is a
plain `trio.SocketStream` (the kernel copies page cache to socket; 4.7 GB/s
here), waiting for writability with `trio.lowlevel.wait_writable`; on any
other stream (TLS, in-memory test streams) it is read with `os.pread` in
chunks and sent. `file_transfer` forces either path, so a bench can compare
them.
"""

from __future__ import annotations

import os
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

#: Buffers up to this size are joined with their neighbours before sending.
COALESCE_BYTES = 64 * 1024
#: Chunk size of the pread fallback.
PREAD_CHUNK_BYTES = 1024 * 1024


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


async def _sendfile(stream: trio.SocketStream, part: FileSlice) -> None:
    sock = stream.socket
    in_fd = _fileno(part.file)
    offset, remaining = part.offset, part.count
    await trio.lowlevel.checkpoint_if_cancelled()
    while remaining:
        try:
            sent = os.sendfile(sock.fileno(), in_fd, offset, remaining)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        if sent == 0:
            raise _short_file(part, part.count - remaining)
        offset += sent
        remaining -= sent
    await trio.lowlevel.cancel_shielded_checkpoint()


async def _pread_send(stream: trio.abc.SendStream, part: FileSlice) -> None:
    in_fd = _fileno(part.file)
    offset, remaining = part.offset, part.count
    while remaining:
        chunk = os.pread(in_fd, min(remaining, PREAD_CHUNK_BYTES), offset)
        if not chunk:
            raise _short_file(part, part.count - remaining)
        await stream.send_all(chunk)
        offset += len(chunk)
        remaining -= len(chunk)


async def send_parts(
    stream: trio.abc.SendStream,
    parts: Iterable[ResponsePart],
    file_transfer: FileTransfer = "auto",
) -> SendReport:
    """Send `parts` in order."""
    use_sendfile = file_transfer == "sendfile" or (
        file_transfer == "auto" and isinstance(stream, trio.SocketStream)
    )
    if use_sendfile and not isinstance(stream, trio.SocketStream):
        raise LocalProtocolError(
            f"file_transfer='sendfile' needs a trio.SocketStream, not {type(stream).__name__}"
        )
    run: list[ResponsePart] = []
    run_bytes = 0
    total = via_sendfile = via_pread = 0

    async def flush() -> None:
        nonlocal run, run_bytes
        if run:
            await stream.send_all(run[0] if len(run) == 1 else b"".join(run))  # type: ignore[arg-type]
            run, run_bytes = [], 0

    for part in parts:
        length = part_length(part)
        total += length
        if isinstance(part, FileSlice):
            await flush()
            if use_sendfile:
                await _sendfile(stream, part)  # type: ignore[arg-type]
                via_sendfile += length
            else:
                await _pread_send(stream, part)
                via_pread += length
        elif length > COALESCE_BYTES:
            await flush()
            await stream.send_all(part)
        elif length:
            run.append(part)
            run_bytes += length
            if run_bytes >= COALESCE_BYTES:
                await flush()
    await flush()
    return SendReport(total, via_sendfile, via_pread)
