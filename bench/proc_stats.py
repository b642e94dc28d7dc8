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


def log_bytes(log_dir: str, topic: str) -> int:
    """Bytes in the `.log` segment files of `topic`'s partitions in `log_dir`."""
    total = 0
    prefix = f"{topic}-"
    for name in os.listdir(log_dir):
        suffix = name[len(prefix):]
        if not name.startswith(prefix) or not suffix.isdigit():
            continue
        partition_dir = os.path.join(log_dir, name)
        for segment in os.listdir(partition_dir):
            if segment.endswith(".log"):
                total += os.path.getsize(os.path.join(partition_dir, segment))
    return total
