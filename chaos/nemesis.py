"""The nemeses: faults applied to the real processes of a LocalCluster.

- `kill`: SIGKILL, then a restart on the same data dir at the heal.
- `pause`: SIGSTOP, then SIGCONT at the heal (the process wakes up with
  the state it had: a paused leader must not act on it).
- `partition`: links between nodes cut, one-way or two-way, by `LinkCutter`.
- `disk`: a broker's disk full, by `Disks`: every broker's log dir is a
  small tmpfs of its own, and the fault fills it to the last byte with a
  file the broker does not read (`chaos-disk-fill`); the heal deletes the
  file, and restarts the broker if the full disk stopped it.

How links are cut, and why this way. Every node of a LocalCluster listens on
127.0.0.1 with a port of its own, and its outgoing connections leave from
127.0.0.1 too (the kernel picks the loopback route's source address), so no
address or port tells which node opened a connection. Per-node loopback
addresses (127.0.0.x) would only help if every outgoing socket bound its
source address, which the nodes do not do; network namespaces with veth
links would need the launcher to start each node in a namespace and the
clients to route into each; a TCP proxy per link would need a different
peer address per node in the configuration, which `controller.quorum.voters`
(one value for all) and the brokers' advertised listeners (one each, learned
from the metadata) cannot express. What works unchanged on this kernel:

- every node runs in a cgroup (v2) of its own, entered before exec (the
  launcher's `preexec` hook), so every socket it ever opens belongs to it;
- an nftables table of this run tags each new connection's conntrack entry
  with the node that opened it (`socket cgroupv2 ... ct mark set`);
- cutting the link src -> dst drops, in the output hook, the packets of
  connections src opened to dst's port (original direction) and of the
  connections dst opened to src's port (reply direction): exactly the
  packets src sends to dst. Two-way is both directions.

Clients of the workload run in no node's cgroup: their connections are never
tagged, so "isolate the leader from the other brokers while its clients
still reach it" is the natural case. The ZooKeeper servers are not tagged
either (zk mode partitions brokers from each other, not from ZooKeeper).

- `clock`: a broker's wall clock jumps by the fault's offset (forward or
  back) through the test-only `raftka.test.clock.offset.file` every broker
  of the run is started with (common.clock); the heal writes 0.

- `eio`: a broker's partition logs fail every write with EIO, through the
  test-only `raftka.test.disk.fault.file` every broker of the run is started
  with (storage.fault_fs.FaultSwitchFileSystem); the heal empties the file. The
  broker answers KAFKA_STORAGE_ERROR to what it cannot write and serves
  reads; it needs no restart (the heal restarts it only if it stopped).
  With several log dirs per broker (`raftka chaos run --log-dirs 2`), only
  the broker's last dir fails (`eio <dir>`): the broker takes it offline,
  the controller moves its partitions' leadership, and the broker serves on
  from its other dirs; the heal restarts the broker, which is how an
  offline dir comes back.

`partition` needs root, a cgroup2 mount and the `nft` command (the Debian
`nftables` package; `make sysdeps` installs it); `disk` needs root (its
mounts); `eio`, `kill`, `pause` and `clock` need nothing. The table and the cgroups carry the
run's pid in their name and are removed at the end.

Not built: `membership` (the quorum has no voter changes yet).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from chaos.history import HistoryWriter
from chaos.schedule import Fault
from cluster.launcher import LocalCluster
from common.errors import RaftkaError

#: Conntrack marks of this harness: the high half says "raftka chaos", the low the node id.
MARK_BASE = 0x52430000
NFT_CGROUP_ROOT = Path("/sys/fs/cgroup")  # nft resolves `socket cgroupv2` paths under this


class NemesisError(RaftkaError):
    """A fault could not be applied or healed; the message says which and why."""


def cgroup2_mount() -> Path | None:
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    except OSError:
        pass
    return None


def link_cutting_unavailable() -> str | None:
    """Why links cannot be cut here, or None when they can."""
    if os.geteuid() != 0:
        return "partition needs root (nftables and cgroups)"
    if shutil.which("nft") is None:
        return "partition needs the nft command (apt-get install -y nftables, or make sysdeps)"
    mount = cgroup2_mount()
    if mount is None:
        return "partition needs a cgroup2 mount"
    try:
        mount.relative_to(NFT_CGROUP_ROOT)
    except ValueError:
        if mount != NFT_CGROUP_ROOT:
            return f"partition needs the cgroup2 mount under {NFT_CGROUP_ROOT} (found {mount})"
    return None


class LinkCutter:
    """Cuts TCP links between the nodes of one cluster (see the module docstring)."""

    def __init__(self, ports: Mapping[int, int | tuple[int, ...]], tag: str | None = None) -> None:
        reason = link_cutting_unavailable()
        if reason:
            raise NemesisError(reason)
        #: node id -> the ports it listens on (a broker may have more than one listener).
        self.ports = {node: (p,) if isinstance(p, int) else tuple(p) for node, p in ports.items()}
        tag = tag or str(os.getpid())
        self.table = f"raftka_chaos_{tag}"
        self.mount = cgroup2_mount()
        assert self.mount is not None
        self.group = self.mount / f"raftka-chaos-{tag}"
        self.cuts: set[tuple[int, int]] = set()
        self._set_up = False

    def _cgroup(self, node_id: int) -> Path:
        return self.group / f"node-{node_id}"

    def _level(self, node_id: int) -> int:
        return len(self._cgroup(node_id).relative_to(self.mount).parts)

    def set_up(self) -> None:
        """The cgroups and the tagging rules; before any node starts."""
        for node_id in self.ports:
            self._cgroup(node_id).mkdir(parents=True, exist_ok=True)
        rules = [f"add table inet {self.table}",
                 f"add chain inet {self.table} tag {{ type filter hook output priority -10; }}",
                 f"add chain inet {self.table} cut {{ type filter hook output priority 0; }}"]
        for node_id in self.ports:
            path = self._cgroup(node_id).relative_to(NFT_CGROUP_ROOT)
            rules.append(f'add rule inet {self.table} tag ct state new socket cgroupv2 level {self._level(node_id)} '
                         f'"{path}" ct mark set {MARK_BASE + node_id}')
        self._nft("\n".join(rules))
        self._set_up = True

    def preexec(self, node_id: int) -> None:
        """In the child before exec: enter the node's cgroup."""
        if node_id in self.ports:
            with open(self._cgroup(node_id) / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def cut(self, links: list[tuple[int, int]]) -> None:
        """Drop the packets `src` sends to `dst` for each (src, dst)."""
        rules = []
        for src, dst in links:
            if src == dst or (src, dst) in self.cuts:
                continue
            self.cuts.add((src, dst))
            for port in self.ports[dst]:
                rules.append(f"add rule inet {self.table} cut meta l4proto tcp ct mark {MARK_BASE + src} "
                             f"ct direction original ct original proto-dst {port} counter drop")
            for port in self.ports[src]:
                rules.append(f"add rule inet {self.table} cut meta l4proto tcp ct mark {MARK_BASE + dst} "
                             f"ct direction reply ct original proto-dst {port} counter drop")
        if rules:
            self._nft("\n".join(rules))

    def heal(self) -> int:
        """Restore every link; the number of packets the cuts dropped."""
        if not self.cuts:
            return 0
        listing = subprocess.run(["nft", "list", "chain", "inet", self.table, "cut"], capture_output=True, text=True)
        dropped = sum(int(m) for m in re.findall(r"counter packets (\d+)", listing.stdout))
        self._nft(f"flush chain inet {self.table} cut")
        self.cuts.clear()
        return dropped

    def tear_down(self) -> None:
        """The table and the (empty) cgroups; call after every node has exited."""
        if self._set_up:
            subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True)
            self._set_up = False
        for node_id in self.ports:
            try:
                self._cgroup(node_id).rmdir()
            except OSError:
                pass
        try:
            self.group.rmdir()
        except OSError:
            pass

    @staticmethod
    def _nft(script: str) -> None:
        done = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
        if done.returncode != 0:
            raise NemesisError(f"nft failed: {done.stderr.strip()}\n{script}")


FILL_FILE = "chaos-disk-fill"
#: What a node that stops because its metadata log's disk is full says (quorum.node.driver).
STOPPED_ON_FULL_DISK = "cannot be written (ENOSPC"
#: In each broker's log dir: its wall clock's offset in ms (`raftka.test.clock.offset.file`).
CLOCK_FILE = "chaos-clock-offset-ms"


class Clocks:
    """Each broker's clock offset, written where the broker reads it (common.clock)."""

    def __init__(self, dirs: dict[int, Path]) -> None:
        self.dirs = dict(dirs)
        self.skewed: dict[int, int] = {}

    def set(self, node_id: int, offset_ms: int) -> None:
        path = self.dirs[node_id] / CLOCK_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{offset_ms}\n")
        tmp.replace(path)  # the broker never reads half a number
        if offset_ms:
            self.skewed[node_id] = offset_ms
        else:
            self.skewed.pop(node_id, None)

    def heal(self) -> None:
        for node_id in sorted(self.skewed):
            self.set(node_id, 0)


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


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def two_way(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    return [(x, y) for x in a for y in b] + [(y, x) for x in a for y in b]


class Nemesis:
    """Applies and heals the faults of a schedule on `cluster`, recording each in the history.

    `leader_of(partition)` and `active_controller()` answer at the moment of
    the fault (None when nobody knows; the fault then picks a node by `rng`).
    """

    def __init__(self, cluster: LocalCluster, history: HistoryWriter, rng: random.Random,
                 leader_of: Callable[[int], int | None], active_controller: Callable[[], int | None],
                 cutter: LinkCutter | None = None, disks: Disks | None = None,
                 clocks: Clocks | None = None, disk_faults: DiskFaults | None = None) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.leader_of = leader_of
        self.active_controller = active_controller
        self.cutter = cutter
        self.disks = disks
        self.clocks = clocks
        self.disk_faults = disk_faults
        self.killed: set[int] = set()
        self.paused: set[int] = set()
        #: Pids seen dead without the nemesis killing them (each reported once).
        self.crashed: set[int] = set()
        #: Brokers seen stopped by their full disk, to start again once it has room.
        self.stopped_on_full_disk: set[int] = set()
        self.applied: list[dict[str, Any]] = []
        #: Controllers the voters nemesis took out of a dynamic quorum's voter set.
        self.removed_voters: set[int] = set()
        #: Controllers the replace nemesis wiped and reformatted whose old
        #: (node id, directory id) is still to be removed from the voters.
        self.old_identities: dict[int, str | None] = {}
        #: Targets nobody could name at the moment of the fault, so drawn at random instead.
        self.guessed: list[str] = []

    def _node_ids(self) -> list[int]:
        return sorted(self.cluster.nodes)

    def resolve(self, target: str) -> int:
        if target.startswith(("broker:", "controller:")):
            return int(target.split(":")[1])
        found: int | None = None
        if target == "active-controller":
            found = self.active_controller()
        elif target.startswith("leader:"):
            found = self.leader_of(int(target.split(":")[1]))
        if found is None or found not in self.cluster.nodes:
            self.guessed.append(target)
            pool = [b.node_id for b in self.cluster.brokers] if target.startswith("leader:") else (
                [c.node_id for c in self.cluster.controllers] or [b.node_id for b in self.cluster.brokers])
            found = self.rng.choice(pool)
        return found

    def start(self, fault: Fault) -> dict[str, Any]:
        record: dict[str, Any] = {"fault": fault.index, "kind": fault.kind, "target": fault.target,
                                  "shape": fault.shape}
        guessed_before = len(self.guessed)
        if fault.kind in ("kill", "pause"):
            node = self.resolve(fault.target)
            record["nodes"] = [node]
            if fault.kind == "kill":
                self.cluster.kill(node, signal.SIGKILL)
                self.killed.add(node)
            else:
                self.cluster.kill(node, signal.SIGSTOP)
                self.paused.add(node)
        elif fault.kind == "partition":
            if self.cutter is None:
                raise NemesisError("partition needs a LinkCutter")
            links, sides = self._links(fault)
            record["nodes"] = sides
            self.cutter.cut(links)
            record["links"] = len(links)
        elif fault.kind == "disk":
            if self.disks is None:
                raise NemesisError("disk needs the brokers' log dirs on tmpfs (Disks)")
            node = self.resolve(fault.target)
            record["nodes"] = [node]
            record["filled_bytes"] = self.disks.fill(node)
        elif fault.kind == "clock":
            if self.clocks is None:
                raise NemesisError("clock needs the brokers started with raftka.test.clock.offset.file (Clocks)")
            node = self.resolve(fault.target)
            if node not in self.clocks.dirs:  # a controller: only the brokers read the offset
                node = self.rng.choice(sorted(self.clocks.dirs))
            record["nodes"] = [node]
            record["offset_ms"] = fault.offset_ms
            self.clocks.set(node, fault.offset_ms)
        elif fault.kind == "eio":
            if self.disk_faults is None:
                raise NemesisError("eio needs the brokers started with raftka.test.disk.fault.file (DiskFaults)")
            node = self.resolve(fault.target)
            if node not in self.disk_faults.dirs:  # only brokers have partition logs
                node = self.rng.choice(sorted(self.disk_faults.dirs))
            record["nodes"] = [node]
            self.disk_faults.set(node, "eio")
        elif fault.kind in ("voters", "replace"):
            node = self.resolve(fault.target)
            if node not in {c.node_id for c in self.cluster.controllers}:
                node = self.rng.choice([c.node_id for c in self.cluster.controllers])
            record["nodes"] = [node]
            if fault.kind == "replace":
                record["old_directory_id"] = self._wipe_and_reformat(node)
                self.old_identities[node] = record["old_directory_id"]
                record["error"] = self._remove_old_identities().get(node)
            else:
                record["error"] = change_voter(self.cluster, node, add=False)
                if record["error"] is None:
                    self.removed_voters.add(node)
        else:
            raise NemesisError(f"no nemesis {fault.kind!r}")
        if len(self.guessed) > guessed_before:
            record["target_guessed"] = True  # the cluster could not say who it was: a random node instead
        desc = fault.describe() + f" -> {record['nodes']}"
        self.history.record("nemesis", "info", fault.kind, value=desc, extra={"phase": "start", **record})
        self.applied.append(record)
        return record

    def _links(self, fault: Fault) -> tuple[list[tuple[int, int]], list[Any]]:
        everyone = self._node_ids()
        if fault.shape == "majority-minority":
            a, b = (list(g) for g in fault.groups)
            return two_way(a, b), [a, b]
        node = self.resolve(fault.target)
        if fault.shape == "isolate-leader":
            # From the other brokers and from the controllers: it can neither
            # replicate nor heartbeat; the clients still reach it.
            rest = [n for n in everyone if n != node]
            return two_way([node], rest), [[node], rest]
        if fault.shape == "isolate-controller":
            rest = [n for n in everyone if n != node]
            return two_way([node], rest), [[node], rest]
        if fault.shape == "one-way-leader":
            rest = [n for n in everyone if n != node]
            return [(node, n) for n in rest], [[node], rest]
        raise NemesisError(f"no partition shape {fault.shape!r}")

    def check_crashes(self) -> list[int]:
        """Nodes that exited though the nemesis did not kill them: each recorded as a `crash`."""
        found = []
        for node in self.cluster.nodes.values():
            process = node.process
            if process is None or node.is_running() or node.node_id in self.killed or process.pid in self.crashed:
                continue
            self.crashed.add(process.pid)
            found.append(node.node_id)
            lines = [line.strip(" |") for line in node.tail(8000).splitlines() if line.strip(" |^")]
            # The exception and where it was raised, not the traceback's decoration.
            last = [line for line in lines if "Error" in line or "Exception" in line or 'File "' in line][-4:]
            # A broker whose full disk (this nemesis filled it) stopped it, saying so: what a
            # Kafka broker whose metadata log dir fails does; the heal starts it again.
            disk_full = (self.disks is not None and node.node_id in self.disks.victims
                         and any(STOPPED_ON_FULL_DISK in line for line in lines))
            if disk_full:
                last = [line for line in lines if STOPPED_ON_FULL_DISK in line][-1:]
                self.stopped_on_full_disk.add(node.node_id)
            self.history.record("nemesis", "info", "crash", value=f"{node.role} {node.node_id} exited with code "
                                f"{process.returncode}", extra={"node": node.node_id, "log": last,
                                                                "output": str(node.output_path),
                                                                "disk_full": disk_full})
        return found

    def stop(self, fault: Fault) -> None:
        """Heal `fault` (every fault of its kind: one runs at a time)."""
        self.check_crashes()
        extra: dict[str, Any] = {"phase": "stop", "fault": fault.index}
        if fault.kind == "kill":
            self._restart_killed()
        elif fault.kind == "pause":
            self._resume_paused()
        elif fault.kind == "partition" and self.cutter is not None:
            extra["dropped_packets"] = self.cutter.heal()
        elif fault.kind == "disk" and self.disks is not None:
            filled = sorted(self.disks.filled)
            self.disks.heal()
            # A broker the full disk stopped is started again on its (now roomy) disk.
            extra["restarted"] = [n for n in filled if not self.cluster.nodes[n].is_running()]
            for n in extra["restarted"]:
                self.cluster.start(n)
        elif fault.kind == "clock" and self.clocks is not None:
            extra["nodes"] = sorted(self.clocks.skewed)
            self.clocks.heal()
        elif fault.kind in ("voters", "replace"):
            extra["nodes"] = sorted(self.removed_voters | set(self.old_identities))
            extra["errors"] = self._add_removed_voters()
        elif fault.kind == "eio" and self.disk_faults is not None:
            failing = sorted(self.disk_faults.failing)
            extra["nodes"] = failing
            self.disk_faults.heal()
            # The broker keeps running through the fault; should it have stopped
            # (a crash, reported), it is started again on its healed disk. A
            # log dir taken offline comes back only with a restart.
            if self.disk_faults.failing_dir:
                for n in failing:
                    if self.cluster.nodes[n].is_running():
                        self.cluster.stop(n)
                extra["restarted"] = failing
            else:
                extra["restarted"] = [n for n in failing if not self.cluster.nodes[n].is_running()]
            for n in extra["restarted"]:
                self.cluster.start(n)
        # A broker that stopped on its full disk after that disk's heal (its shutdown
        # takes a while) is started again at the next heal, its disk roomy again.
        late = [n for n in sorted(self.stopped_on_full_disk) if self.disks is not None
                and n not in self.disks.filled and not self.cluster.nodes[n].is_running()]
        for n in late:
            self.cluster.start(n)
        self.stopped_on_full_disk.clear()
        if late:
            extra["restarted"] = sorted(set(extra.get("restarted", [])) | set(late))
        self.history.record("nemesis", "info", fault.kind, value=f"heal {fault.describe()}", extra=extra)

    def heal_all(self) -> None:
        """Links restored, disks emptied, processes resumed; killed and crashed nodes started again."""
        for node in self.check_crashes():
            self.killed.add(node)  # started again below, as a killed one
        if self.cutter is not None:
            self.cutter.heal()
        if self.disks is not None:
            self.disks.heal()
        if self.clocks is not None:
            self.clocks.heal()
        if self.disk_faults is not None:
            self.disk_faults.heal()
        self._resume_paused()
        self._restart_killed()
        for node in self.cluster.nodes.values():  # any node down, whatever stopped it, runs again
            if not node.is_running():
                self.cluster.start(node.node_id)
        self._add_removed_voters()

    def _wipe_and_reformat(self, node_id: int) -> str | None:
        """A controller's disk lost: SIGKILL, its data dir wiped, formatted
        again as `raftka storage format --no-initial-controllers` does (the
        same node id, a new directory id), started again: it follows the
        quorum as an observer. Its old directory id."""
        from common.meta_properties import format_log_dir, read_directory_id

        node = self.cluster.nodes[node_id]
        old = read_directory_id(node.log_dir)
        self.cluster.kill(node_id, signal.SIGKILL)
        shutil.rmtree(node.log_dir)
        format_log_dir(node.log_dir, self.cluster.cluster_id, node_id)
        self.cluster.start(node_id)
        return old

    def _remove_old_identities(self) -> dict[int, str]:
        """RemoveRaftVoter of each wiped controller's old (id, directory id);
        once done, it is added back with its new one at the heal."""
        errors = {}
        for node, old in sorted(self.old_identities.items()):
            error = change_voter(self.cluster, node, add=False, directory_id=old)
            if error is None:
                del self.old_identities[node]
                self.removed_voters.add(node)
            else:
                errors[node] = error
        return errors

    def _add_removed_voters(self) -> dict[int, str]:
        """Every controller the voters nemesis removed is added back (AddRaftVoter)."""
        errors = self._remove_old_identities()
        for node in sorted(self.removed_voters):
            error = change_voter(self.cluster, node, add=True)
            if error is None:
                self.removed_voters.discard(node)
            else:
                errors[node] = error
        return errors

    def _restart_killed(self) -> None:
        for node in sorted(self.killed):
            if not self.cluster.nodes[node].is_running():
                self.cluster.start(node)
        self.killed.clear()

    def _resume_paused(self) -> None:
        for node in sorted(self.paused):
            self.cluster.kill(node, signal.SIGCONT)
        self.paused.clear()


def sleep_until(deadline: float, stop: Callable[[], bool] = lambda: False) -> bool:
    """Sleep until time.monotonic() reaches `deadline`; False if `stop()` became true first."""
    while True:
        left = deadline - time.monotonic()
        if stop():
            return False
        if left <= 0:
            return True
        time.sleep(min(left, 0.1))


def change_voter(cluster: LocalCluster, node_id: int, *, add: bool, timeout_s: float = 40.0,
                 directory_id: str | None = None) -> str | None:
    """Remove controller `node_id` from a dynamic quorum's voters, or add it
    back (with its directory id and endpoint), asking the leader as
    `raftka quorum remove-controller / add-controller` do; retried through
    leader changes until `timeout_s`. None when done, else why not. The
    directory id is its data dir's, or `directory_id` (the one a wiped
    disk had)."""
    import datetime

    import trio
    from kio.schema.add_raft_voter.v1.request import AddRaftVoterRequest, Listener
    from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
    from kio.static.primitive import i32, i32Timedelta, u16

    from common.meta_properties import read_directory_id
    from common.wire import open_connection
    from quorum.node.describe_quorum import describe_quorum
    from quorum.node.voter_config import parse_directory_id

    node = cluster.nodes[node_id]
    directory = directory_id or read_directory_id(node.log_dir)
    voter_directory_id = parse_directory_id(directory) if directory else None
    if add:
        request: Any = AddRaftVoterRequest(
            cluster_id=None, timeout=i32Timedelta.parse(datetime.timedelta(seconds=15)), voter_id=i32(node_id),
            voter_directory_id=voter_directory_id, listeners=(Listener(name="CONTROLLER", host=node.host,
                                                                 port=u16(node.port)),), ack_when_committed=True)
    else:
        request = RemoveRaftVoterRequest(cluster_id=None, voter_id=i32(node_id),
                                         voter_directory_id=voter_directory_id)

    async def attempt() -> str | None:
        last = "no controller answered"
        with trio.move_on_after(timeout_s):
            while True:
                for controller in cluster.controllers:
                    if not controller.is_running():
                        continue
                    try:
                        d = await describe_quorum(controller.host, controller.port, 2000)
                        if d.leader_id not in d.nodes:
                            continue
                        host, port = d.nodes[d.leader_id]
                        async with open_connection(host, port, connect_timeout_ms=2000) as conn:
                            answer = await conn.request(request, timeout_ms=20000)
                    except Exception as exc:  # noqa: BLE001 (a fault may be on: any failure is retried)
                        last = f"{type(exc).__name__}: {exc}"
                        continue
                    code = int(answer.error_code)
                    if code == 0 or (add and code == 126) or (not add and code == 127):
                        return None  # done, or already so (duplicate voter / voter not found)
                    last = f"error {code}: {answer.error_message}"
                await trio.sleep(0.5)
        return last

    return trio.run(attempt)
