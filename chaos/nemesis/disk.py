"""Disk faults.

- `disk`: a broker's disk full, by `Disks`: every broker's log dir is a
  small tmpfs of its own, and the fault fills it to the last byte with a
  file the broker does not read (`chaos-disk-fill`); the heal deletes the
  file, and restarts the broker if the full disk stopped it. It needs root
  (its mounts).
- `eio`: a broker's partition logs fail every write with EIO, through the
  test-only `raftka.test.disk.fault.file` every broker of the run is started
  with (storage.fault_fs.FaultSwitchFileSystem); the heal empties the file. The
  broker answers KAFKA_STORAGE_ERROR to what it cannot write and serves
  reads; it needs no restart (the heal restarts it only if it stopped).
  With several log dirs per broker (`raftka chaos run --log-dirs 2`), only
  the broker's last dir fails (`eio <dir>`): the broker takes it offline,
  the controller moves its partitions' leadership, and the broker serves on
  from its other dirs; the heal restarts the broker, which is how an
  offline dir comes back. It needs nothing but that setting.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.nemesis.errors import NemesisError
from chaos.schedule import Fault

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis

FILL_FILE = "chaos-disk-fill"
#: What a node that stops because its metadata log's disk is full says (quorum.node.driver).
STOPPED_ON_FULL_DISK = "cannot be written (ENOSPC"
#: In each broker's log dir: the disk fault its partition logs have (`raftka.test.disk.fault.file`).
DISK_FAULT_FILE = "chaos-disk-fault"


class DiskFaults:
    """Each broker's injected disk fault, written where the broker reads it (storage.fault_fs)."""

    def __init__(self, dirs: dict[int, Path], failing_dir: dict[int, Path] | None = None) -> None:
        self.dirs = dict(dirs)
        #: With several log dirs per broker: the one dir that fails (else all of them).
        self.failing_dir = dict(failing_dir or {})
        self.failing: set[int] = set()
        #: Every broker whose disk ever failed: the final heal may restart these.
        self.victims: set[int] = set()

    def set(self, node_id: int, fault: str) -> None:
        if fault and node_id in self.failing_dir:
            fault = f"{fault} {self.failing_dir[node_id]}"
        path = self.dirs[node_id] / DISK_FAULT_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{fault}\n")
        tmp.replace(path)  # the broker never reads half a word
        if fault:
            self.failing.add(node_id)
            self.victims.add(node_id)
        else:
            self.failing.discard(node_id)

    def heal(self) -> None:
        for node_id in sorted(self.failing):
            self.set(node_id, "")


class Disks:
    """A tmpfs of `size_mb` under each broker's log dir, and a filler to make it full."""

    def __init__(self, dirs: dict[int, Path], size_mb: int = 256) -> None:
        if os.geteuid() != 0:
            raise NemesisError("disk needs root (it mounts a tmpfs per broker)")
        self.dirs = dict(dirs)
        self.size_mb = size_mb
        self.mounted: list[Path] = []
        self.filled: set[int] = set()
        #: Every broker whose disk was ever filled: the final heal may restart these.
        self.victims: set[int] = set()

    def set_up(self) -> None:
        """Before the cluster is created: the log dirs must be empty mount points."""
        for path in self.dirs.values():
            path.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(path)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise NemesisError(f"mount tmpfs on {path}: {done.stderr.strip()}")
            self.mounted.append(path)

    def fill(self, node_id: int) -> int:
        """Fill node_id's disk to the last byte; the bytes written."""
        written = 0
        fd = os.open(self.dirs[node_id] / FILL_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 4096, 1):  # big chunks, then the crumbs a page at a time, then bytes
                chunk = bytes(size)
                while True:
                    try:
                        written += os.write(fd, chunk)
                    except OSError:
                        break
        finally:
            os.close(fd)
        self.filled.add(node_id)
        self.victims.add(node_id)
        return written

    def heal(self) -> None:
        for node_id in sorted(self.filled):
            try:
                (self.dirs[node_id] / FILL_FILE).unlink()
            except FileNotFoundError:
                pass
        self.filled.clear()

    def tear_down(self) -> None:
        """After every broker stopped (the data is copied out first by the caller if wanted)."""
        for path in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self.mounted.clear()


def start_full(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    if nemesis.disks is None:
        raise NemesisError("disk needs the brokers' log dirs on tmpfs (Disks)")
    node = nemesis.resolve(fault.target)
    return {"nodes": [node], "filled_bytes": nemesis.disks.fill(node)}


def heal_full(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    disks = nemesis.disks
    if disks is None:
        return {}
    filled = sorted(disks.filled)
    disks.heal()
    # A broker the full disk stopped is started again on its (now roomy) disk.
    restarted = [n for n in filled if not nemesis.cluster.nodes[n].is_running()]
    for n in restarted:
        nemesis.cluster.start(n)
    return {"restarted": restarted}


def restart_stopped_on_full_disk(nemesis: Nemesis) -> list[int]:
    """The brokers started again because they stopped on their full disk
    after that disk's heal (their shutdown takes a while): at the next heal,
    their disk roomy again."""
    disks = nemesis.disks
    late = [n for n in sorted(nemesis.stopped_on_full_disk) if disks is not None
            and n not in disks.filled and not nemesis.cluster.nodes[n].is_running()]
    for n in late:
        nemesis.cluster.start(n)
    nemesis.stopped_on_full_disk.clear()
    return late


def start_eio(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    disk_faults = nemesis.disk_faults
    if disk_faults is None:
        raise NemesisError("eio needs the brokers started with raftka.test.disk.fault.file (DiskFaults)")
    node = nemesis.resolve_among(fault.target, sorted(disk_faults.dirs))  # only brokers have partition logs
    disk_faults.set(node, "eio")
    return {"nodes": [node]}


def heal_eio(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    disk_faults = nemesis.disk_faults
    if disk_faults is None:
        return {}
    cluster = nemesis.cluster
    failing = sorted(disk_faults.failing)
    disk_faults.heal()
    # The broker keeps running through the fault; should it have stopped
    # (a crash, reported), it is started again on its healed disk. A
    # log dir taken offline comes back only with a restart.
    if disk_faults.failing_dir:
        for n in failing:
            if cluster.nodes[n].is_running():
                cluster.stop(n)
        restarted = failing
    else:
        restarted = [n for n in failing if not cluster.nodes[n].is_running()]
    for n in restarted:
        cluster.start(n)
    return {"nodes": failing, "restarted": restarted}
