"""CPU time of processes, from /proc (Linux).

`cpu_seconds(pid)` is utime + stime of one process (all its threads), in
seconds: fields 14 and 15 of `/proc/<pid>/stat`, in clock ticks
(`SC_CLK_TCK`, 100 per second on Linux, so the resolution is 10 ms).
Kernel time spent on the process's behalf (socket copies, page-cache
writes) is in stime, so it counts. `process_cpu_seconds(pid)` is the
same quantity to the nanosecond.

`CpuMark`s of a local cluster (`cluster_cpu_mark`) taken at two instants
give, by `cpu_between`, the CPU seconds each group of its processes
(brokers, controllers, ZooKeeper servers, and the bench process itself)
used in between, and how busy the whole machine was (`/proc/stat`: the
share of all CPUs' time not idle). A latency measured while the machine
had no idle CPU says how fast this machine was that minute as much as how
much work the cluster did; the CPU seconds say the latter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # The command name (field 2) is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS_PER_S


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, every thread, live or ended) of process
    `pid`, to the nanosecond: its POSIX CPU-time clock, whose id Linux
    derives from the pid as `clock_getcpuclockid(3)` does. /proc's
    utime + stime counts 10 ms ticks, which at the consume bench's default
    size is 0.045 CPU-s/GB a tick; falls back to it where the clock is
    not readable."""
    try:
        return time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:
        return cpu_seconds(pid)


#: Linux's process CPU clock type (CPUCLOCK_SCHED: the scheduler's runtime).
_CPUCLOCK_SCHED = 2


class CpuMark(NamedTuple):
    """CPU seconds so far of each process, by pid: (group, seconds); and
    the machine's (busy, all) CPU clock ticks so far."""

    at: float
    by_pid: dict[int, tuple[str, float]]
    machine_ticks: tuple[int, int]


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot (`/proc/stat`).
    Idle, iowait and steal (time the hypervisor gave to another guest) are
    not busy, so a host that steals shows as a less busy machine."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


def cpu_mark(groups: Mapping[int, str]) -> CpuMark:
    """A `CpuMark` of the processes in `groups` ({pid: group}) that are still there."""
    by_pid = {}
    for pid, group in groups.items():
        try:
            by_pid[pid] = (group, process_cpu_seconds(pid))
        except OSError:
            pass  # exited meanwhile
    return CpuMark(time.monotonic(), by_pid, machine_ticks())


def cluster_cpu_mark(cluster: Any) -> CpuMark:
    """A `CpuMark` of the running nodes of a `cluster.LocalCluster`
    (groups "brokers", "controllers", "zookeeper") and this process ("bench")."""
    groups: dict[int, str] = {os.getpid(): "bench"}
    for node in cluster.nodes.values():
        if node.is_running():
            groups[node.pid] = f"{node.role}s"
    for server in getattr(cluster.zookeeper, "servers", ()):
        if server.running:
            groups[server.process.pid] = "zookeeper"
    return cpu_mark(groups)


def cpu_between(start: CpuMark, end: CpuMark) -> tuple[dict[str, float], float]:
    """({group: CPU seconds used from `start` to `end`}, the share of the
    machine's CPU time that was busy meanwhile, 0..1). A process counts if
    it ran at both marks."""
    used: dict[str, float] = {}
    for pid, (group, seconds) in end.by_pid.items():
        if pid in start.by_pid:
            used[group] = used.get(group, 0.0) + seconds - start.by_pid[pid][1]
    busy = end.machine_ticks[0] - start.machine_ticks[0]
    total = end.machine_ticks[1] - start.machine_ticks[1]
    return used, (busy / total if total > 0 else 0.0)


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


class CpuSampler:
    """Per-second CPU of a local cluster's process groups during a phase,
    for the report's time series: a thread takes a `cluster_cpu_mark`
    every `interval_s`; `series(group)` is `(t_s, cores busy)` for each
    interval, t_s its end in seconds after `start()` (the phase's clock).

        sampler = CpuSampler(cluster).start()
        ...measured phase...
        runner.series("broker_cpu_cores", "cores", sampler.stop().series("brokers"))
    """

    def __init__(self, cluster: Any, interval_s: float = 1.0):
        import threading

        self.cluster = cluster
        self.interval_s = interval_s
        self.marks: list[CpuMark] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self, at: float | None = None) -> "CpuSampler":
        """Start sampling; `at` (a monotonic time, default now) is t_s = 0."""
        self.t0 = time.monotonic() if at is None else at
        self.marks.append(cluster_cpu_mark(self.cluster))
        self._thread.start()
        return self

    def _run(self) -> None:
        # Marks at fixed times after the start: a late wake-up shortens the next wait.
        n = 1
        while not self._stop.wait(max(0.0, self.t0 + n * self.interval_s - time.monotonic())):
            self.marks.append(cluster_cpu_mark(self.cluster))
            n += 1

    def stop(self) -> "CpuSampler":
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return self

    def series(self, group: str = "brokers", since: float | None = None) -> list[tuple[float, float]]:
        """`(t_s, cores busy)` per interval; with `since` (a monotonic time:
        the measured phase's start) t_s counts from there and intervals
        that began before it (warm-up) are left out."""
        zero = self.t0 if since is None else since
        # A phase that begins a moment after a mark (the workers start a few ms after the release
        # the sampler started at) keeps that interval: a tenth of it, at most, is the phase before.
        slack = self.interval_s / 10
        out = []
        for before, after in zip(self.marks, self.marks[1:]):
            used, _ = cpu_between(before, after)
            seconds = after.at - before.at
            if seconds > 0 and before.at >= zero - slack:
                out.append((after.at - zero, used.get(group, 0.0) / seconds))
        return out
