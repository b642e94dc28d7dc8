"""CPU time of processes, from /proc (Linux).

`cpu_seconds(pid)` is utime + stime of one process (all its threads), in
seconds: fields 14 and 15 of `/proc/<pid>/stat`, in clock ticks
(`SC_CLK_TCK`, 100 per second on Linux, so the resolution is 10 ms).
Kernel time spent on the process's behalf (socket copies, page-cache
writes) is in stime, so it counts.
"""

from __future__ import annotations

import os

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS_PER_S


def segment_files(log_dir: str, topic: str) -> list[str]:
    """The `.log` segment files of `topic`'s partitions in `log_dir`."""
    prefix = f"{topic}-"
    paths = []
    for name in sorted(os.listdir(log_dir)):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            partition_dir = os.path.join(log_dir, name)
            paths += [os.path.join(partition_dir, s) for s in sorted(os.listdir(partition_dir)) if s.endswith(".log")]
    return paths


def log_bytes(log_dir: str, topic: str) -> int:
    """Bytes in the `.log` segment files of `topic`'s partitions in `log_dir`."""
    return sum(os.path.getsize(path) for path in segment_files(log_dir, topic))
