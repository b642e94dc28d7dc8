"""What the machine charges for the bytes themselves: references measured
in the same run as a bench, so a broker's CPU per GB is read against them.

`sendfile_floor`: the same segment files sent over loopback TCP by a
process that does nothing but `os.sendfile`. A broker serving consumers
spends part of its CPU in the kernel, sending file pages into loopback
sockets (and, on loopback, running the receiver's TCP processing in the
sender's context); no broker escapes that. The sender is a child process
that connects to a reader in the calling process and sends each file in
`chunk_bytes` calls (a consumer's Fetch answer is about 2 MB in about 1 MB
per-partition slices); its CPU is counted as the broker's is (user +
system time). The reader receives into one reused buffer and is not
counted, like the consumers. It is a reference, not a strict bound: the
broker's librdkafka consumers read faster than this reader, and the
figure moves by ±20% from run to run (`bench consume` measures it right
after its consume phase).

`page_cache_write_cost`: CPU per GB of writing a new file with 1 MB
`pwrite`s, as a log append does. On a VM whose balloon device reports
free pages to the host (this project's machines: virtio-balloon with
free page reporting), memory the guest has not touched lately costs a
host fault on first touch. On a 2-core VM of that kind, this measurement
(which `raftka bench produce` reports as `page_cache_write_cpu_s_per_gb`)
gave 0.2 CPU-s/GB for the first ~0.75 GB of new page cache and 3.2 for
every GB after it. A bench that grows its logs by gigabytes pays that per
byte appended, on every replica; `bench produce` measures it after its
phases, when the pages it gets are the same kind its brokers got.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Sequence

#: Bytes per sendfile call (about one partition's slice of a Fetch answer),
#: and per pwrite (about one produce request's batches).
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 300.0


def _send(port: int, paths: Sequence[str], chunk_bytes: int, out) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sent = 0
        cpu0 = time.process_time()
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                offset = 0
                while offset < size:
                    n = os.sendfile(sock.fileno(), fd, offset, min(chunk_bytes, size - offset))
                    if n == 0:
                        break
                    offset += n
                sent += offset
            finally:
                os.close(fd)
        out.send((sent, time.process_time() - cpu0))


def _drain(listener: socket.socket, received: list[int]) -> None:
    conn, _ = listener.accept()
    with conn:
        buf = bytearray(4 << 20)
        total = 0
        while n := conn.recv_into(buf):
            total += n
    received.append(total)


def sendfile_floor(paths: Sequence[str], chunk_bytes: int = CHUNK_BYTES) -> dict[str, float]:
    """Send `paths` once over loopback with sendfile: bytes sent, the
    sender's CPU seconds, and CPU seconds per GB (10**9 bytes, as the
    benches count it)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT_S)
        received: list[int] = []
        reader = threading.Thread(target=_drain, args=(listener, received), daemon=True)
        reader.start()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        sender = ctx.Process(target=_send, args=(listener.getsockname()[1], list(paths), chunk_bytes, child))
        sender.start()
        child.close()
        if not parent.poll(TIMEOUT_S):
            sender.kill()
            raise RuntimeError(f"the sendfile floor's sender sent nothing back in {TIMEOUT_S:.0f} s")
        sent, cpu_s = parent.recv()
        sender.join(TIMEOUT_S)
        reader.join(TIMEOUT_S)
    if not received or received[0] != sent:
        raise RuntimeError(f"the sendfile floor's reader got {received} bytes of {sent} sent")
    return {"bytes": sent, "cpu_s": cpu_s, "cpu_s_per_gb": cpu_s / (sent / 1e9) if sent else float("nan")}


def page_cache_write_cost(directory: str, nbytes: int, chunk_bytes: int = CHUNK_BYTES) -> dict[str, float]:
    """Write `nbytes` to a new file in `directory` (then delete it): bytes
    written, this thread's CPU seconds, and CPU seconds per GB."""
    chunk = os.urandom(chunk_bytes)
    path = os.path.join(directory, f"page-cache-write-cost-{os.getpid()}.tmp")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        written = 0
        cpu0 = time.thread_time()
        while written < nbytes:
            written += os.pwrite(fd, chunk[: min(chunk_bytes, nbytes - written)], written)
        cpu_s = time.thread_time() - cpu0
    finally:
        os.close(fd)
        os.unlink(path)
    return {"bytes": written, "cpu_s": cpu_s, "cpu_s_per_gb": cpu_s / (written / 1e9) if written else float("nan")}
