"""`raftka bench storage`: storage.Log append/read against plain file I/O.

What it measures, in one run, on the real file system (a temp directory):

- **append**: `Log.append` of N MiB of ~16 KiB batches (100-byte records),
  as a leader does (validate, assign offsets, stamp the leader epoch,
  write), against plain `os.write` calls of the same bytes in the same
  16 KiB chunks to a plain file. Neither side fsyncs (the log's default
  flush policy).
- **read**: `Log.read(offset, max_bytes=1 MiB)` (a consumer's fetch) then
  `os.preadv` of every returned slice into one preallocated buffer,
  against one `os.preadv` of the same byte range of the plain file (same
  size, same alignment: the files have the same layout) into the same
  buffer. Both files are read
  from a warm page cache (just written), so the comparison is CPU cost per
  byte; `--cold` fsyncs both files and drops them from the page cache with
  `posix_fadvise(POSIX_FADV_DONTNEED)` first, to compare disk reads.
- **first read**: the read phase opens the log again, as a restarted
  broker does: its segments are below the recovery point, so their records
  are checked when first read (`storage.segment`). One pass of
  `Log.read` over the whole log, timed alone before the comparison, is
  that check (`log_first_read_cpu_s_per_gb`); the comparison then reads
  checked segments, as every later reader does (the plain file is read
  once too, untimed, so both sides read pages already read once).

The two sides run interleaved, 1 MiB at a time, so noise from other work
on the machine hits both alike. The result rows go to `--results` (see
`bench.results`); `--json` also prints one JSON object per measurement.

Each side is timed twice: wall clock (`append_ratio`, `read_ratio`) and
the bench thread's CPU time, user + system (`append_ratio_cpu`,
`read_ratio_cpu`). On a shared machine the wall clock also counts the
milliseconds the bench waits for a CPU, which land on one side or the
other by chance: at load average 7 on 2 cores, three runs of the same
code gave append ratios of 0.48, 0.64 and 0.80. The CPU time counts only
the work each side does, the kernel's copy into the page cache included;
page-cache writeback runs in kernel threads and is charged to neither
side (both write the same bytes). With `--cold` the CPU time leaves out
the wait for the disk: there the wall-clock read ratio is the one to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench.cli import add_common_options

MIB = 1024 * 1024
BATCH_TARGET_BYTES = 16 * 1024
RECORD_VALUE_BYTES = 100
FETCH_BYTES = MIB
LEADER_EPOCH = 0


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser(
        "storage",
        help="append and read back N MiB of 16 KiB batches; compare with plain file writes",
    )
    p.add_argument("--size-mb", type=int, default=256, help="MiB to append (default 256)")
    p.add_argument("--dir", default=None, help="where to put the temp files (made if missing; default: system temp)")
    p.add_argument(
        "--cold",
        action="store_true",
        help="drop both files from the page cache before reading (posix_fadvise DONTNEED)",
    )
    add_common_options(p)
    p.set_defaults(func=run)


def make_batch() -> tuple[bytes, int]:
    """The largest batch of 100-byte records that fits 16 KiB, and its
    record count."""
    from storage.batch import build_batch

    def build(n: int) -> bytes:
        return build_batch([(None, b"v" * RECORD_VALUE_BYTES, (), 1_700_000_000_000 + i) for i in range(n)])

    n = BATCH_TARGET_BYTES // (RECORD_VALUE_BYTES + 8)
    while len(build(n + 1)) <= BATCH_TARGET_BYTES:
        n += 1
    while len(build(n)) > BATCH_TARGET_BYTES:
        n -= 1
    return build(n), n


def run(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from bench.results import new_run_id, write_rows

    if args.size_mb <= 0:
        raise SystemExit("raftka bench storage: --size-mb must be positive")
    console = Console(stderr=args.json)
    batch, records_per_batch = make_batch()
    batch_bytes = len(batch)
    n_batches = max(1, args.size_mb * MIB // batch_bytes)
    total_bytes = n_batches * batch_bytes
    params = {
        "size_mb": args.size_mb,
        "batch_bytes": batch_bytes,
        "records_per_batch": records_per_batch,
        "record_value_bytes": RECORD_VALUE_BYTES,
        "fetch_bytes": FETCH_BYTES,
        "page_cache": "cold" if args.cold else "warm",
        "read_method": "os.preadv into a preallocated buffer, same byte ranges both sides",
    }
    with tempfile.TemporaryDirectory(prefix="raftka-bench-storage-", dir=args.dir) as tmp:
        progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(), console=console, transient=False,
        )
        with progress:
            (t_append, t_write), (c_append, c_write) = _bench_append(tmp, batch, n_batches, progress)
            if args.cold:
                _drop_page_cache(tmp)
            (t_read, t_plain_read), (c_read, c_plain_read), read_bytes, c_first = _bench_read(
                tmp, total_bytes, batch_bytes, progress
            )
    if read_bytes != total_bytes:
        raise SystemExit(f"raftka bench storage: read back {read_bytes} bytes, wrote {total_bytes}")

    mb = total_bytes / 1e6
    sides = {
        "log_append": t_append,
        "plain_write": t_write,
        "log_read": t_read,
        "plain_read": t_plain_read,
    }
    n_records = n_batches * records_per_batch
    rows = []
    for name, seconds in sides.items():
        rows.append(_row(params, f"{name}_throughput", mb / seconds, "MB/s"))
        rows.append(_row(params, f"{name}_rate", n_batches / seconds, "batches/s"))
        rows.append(_row(params, f"{name}_records_rate", n_records / seconds, "records/s"))
        rows.append(_row(params, f"{name}_time_per_batch", seconds / n_batches * 1e6, "us"))
        rows.append(_row(params, f"{name}_time_per_record", seconds / n_records * 1e9, "ns"))
    cpu_sides = {"log_append": c_append, "plain_write": c_write, "log_read": c_read, "plain_read": c_plain_read}
    for name, seconds in cpu_sides.items():
        rows.append(_row(params, f"{name}_cpu_time_per_batch", seconds / n_batches * 1e6, "us"))
        rows.append(_row(params, f"{name}_cpu_time_per_record", seconds / n_records * 1e9, "ns"))
    append_ratio = t_write / t_append
    read_ratio = t_plain_read / t_read
    append_ratio_cpu = c_write / c_append
    read_ratio_cpu = c_plain_read / c_read
    rows.append(_row(params, "append_ratio", append_ratio, "ratio"))
    rows.append(_row(params, "read_ratio", read_ratio, "ratio"))
    rows.append(_row(params, "append_ratio_cpu", append_ratio_cpu, "ratio"))
    rows.append(_row(params, "read_ratio_cpu", read_ratio_cpu, "ratio"))
    rows.append(_row(params, "log_first_read_cpu_s_per_gb", c_first / (total_bytes / 1e9), "cpu_s"))

    table = Table(
        title=f"storage bench: {args.size_mb} MiB in {n_batches} batches of {batch_bytes} B, "
        f"{records_per_batch} records each",
        box=box.SIMPLE_HEAD,
    )
    for col in ("", "MB/s", "batches/s", "records/s", "µs/\nbatch", "CPU µs/\nbatch", "CPU ns/\nrecord"):
        table.add_column(col, justify="right")
    for name, seconds in sides.items():
        table.add_row(
            name, f"{mb / seconds:,.0f}", f"{n_batches / seconds:,.0f}", f"{n_records / seconds:,.0f}",
            f"{seconds / n_batches * 1e6:.2f}", f"{cpu_sides[name] / n_batches * 1e6:.2f}",
            f"{cpu_sides[name] / n_records * 1e9:.1f}",
        )
    console.print(table)
    console.print(
        f"append ratio (log/plain): {append_ratio:.2f} by wall clock, {append_ratio_cpu:.2f} by CPU time "
        "(target ≥ 0.70)"
    )
    console.print(
        f"read ratio (log/plain):   {read_ratio:.2f} by wall clock, {read_ratio_cpu:.2f} by CPU time "
        "(target ≥ 0.80)"
    )
    console.print(
        f"first read of the reopened log (records checked once): {c_first / (total_bytes / 1e9):.2f} CPU-s per GB, "
        f"{c_first / n_records * 1e9:.1f} ns per record"
    )
    path = write_rows(args.results, rows, run_id=new_run_id())
    console.print(f"rows appended to {path}")
    if args.json:
        for row in rows:
            print(json.dumps({**{k: v for k, v in row.items() if k != "params"}, **row["params"]}))
        sys.stdout.flush()
    return 0


def _row(params: dict, metric: str, value: float, unit: str) -> dict:
    return {"scenario": "storage", "mode": "n/a", "params": params, "metric": metric, "value": value, "unit": unit}


def _bench_append(tmp: str, batch: bytes, n_batches: int, progress) -> tuple[tuple[float, float], tuple[float, float]]:
    """((log, plain) wall seconds, (log, plain) CPU seconds)."""
    from storage.config import LogConfig
    from storage.log import Log

    log = Log.open(os.path.join(tmp, "bench-0"), LogConfig(), now_ms=0)
    plain_fd = os.open(os.path.join(tmp, "plain"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # One buffer per side, as a broker has one per request: the log
    # rewrites the base offset and stamps the leader epoch in place (as
    # the broker's produce path asks it to), the plain side writes as is.
    log_buf = bytearray(batch)
    plain_buf = bytearray(batch)
    append = log.append
    write = os.write
    per_round = max(1, MIB // len(batch))
    task = progress.add_task("append (log vs plain)", total=n_batches)
    t_log = t_plain = c_log = c_plain = 0.0
    done = 0
    perf = time.perf_counter
    cpu = time.thread_time
    try:
        while done < n_batches:
            k = min(per_round, n_batches - done)
            # Alternate which side goes first, so neither always runs on
            # caches the other just warmed (or cooled).
            for side in ("plain", "log") if done // per_round % 2 else ("log", "plain"):
                c0, t0 = cpu(), perf()
                if side == "plain":
                    for _ in range(k):
                        write(plain_fd, plain_buf)
                    t_plain += perf() - t0
                    c_plain += cpu() - c0
                else:
                    for _ in range(k):
                        append(log_buf, 0, LEADER_EPOCH)
                    t_log += perf() - t0
                    c_log += cpu() - c0
            done += k
            progress.update(task, completed=done)
    finally:
        os.close(plain_fd)
        log.close()
    return (t_log, t_plain), (c_log, c_plain)


def _bench_read(
    tmp: str, total_bytes: int, batch_bytes: int, progress
) -> tuple[tuple[float, float], tuple[float, float], int]:
    """((log, plain) wall seconds, (log, plain) CPU seconds, bytes read, CPU
    seconds of the first pass, which checks the records)."""
    from storage.batch import HEADER_SIZE, parse_header
    from storage.config import LogConfig
    from storage.log import Log

    log = Log.open(os.path.join(tmp, "bench-0"), LogConfig(), now_ms=0)
    plain_fd = os.open(os.path.join(tmp, "plain"), os.O_RDONLY)
    buf = bytearray(FETCH_BYTES + 2 * batch_bytes)
    view = memoryview(buf)
    preadv = os.preadv
    read = log.read
    task = progress.add_task("read (log vs plain)  ", total=total_bytes)
    t_log = t_plain = c_log = c_plain = 0.0
    offset = 0
    log_done = plain_done = 0
    perf = time.perf_counter
    cpu = time.thread_time
    try:
        c0 = cpu()
        while offset < log.log_end_offset:
            last = read(offset, FETCH_BYTES)[-1]
            offset = parse_header(last.file.pread(HEADER_SIZE, last.position + last.size - batch_bytes)).next_offset
        c_first = cpu() - c0
        # That pass read every page of the log once; the kernel charges a
        # page's second read more than its first (this VM: 0.7-0.9 µs more
        # per 16 KiB), so the plain file is read once too, untimed.
        for position in range(0, total_bytes, FETCH_BYTES):
            os.pread(plain_fd, FETCH_BYTES, position)
        offset = 0
        rounds = 0
        while log_done < total_bytes:
            got = 0
            for side in ("plain", "log") if rounds % 2 else ("log", "plain"):
                c0, t0 = cpu(), perf()
                if side == "log":
                    got = 0
                    for s in read(offset, FETCH_BYTES):
                        got += preadv(s.file.fileno(), [view[got : got + s.size]], s.position)
                    # The next fetch offset, as a consumer finds it: from the
                    # last batch (all batches here have the same size).
                    offset = parse_header(buf, got - batch_bytes).next_offset
                    t_log += perf() - t0
                    c_log += cpu() - c0
                else:
                    # The same byte range of the plain file (same layout):
                    # reads of the same size and alignment cost the same.
                    want = min(FETCH_BYTES // batch_bytes * batch_bytes, total_bytes - plain_done)
                    plain_done += preadv(plain_fd, [view[:want]], plain_done)
                    t_plain += perf() - t0
                    c_plain += cpu() - c0
            log_done += got
            rounds += 1
            progress.update(task, completed=log_done)
    finally:
        os.close(plain_fd)
        log.close()
    return (t_log, t_plain), (c_log, c_plain), log_done, c_first


def _drop_page_cache(tmp: str) -> None:
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
