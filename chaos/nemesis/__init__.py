"""The nemeses: faults applied to the real processes of a LocalCluster.

`Nemesis` applies and heals the faults of a schedule; `FAULTS` names, for
each kind of fault, the family module that applies and heals it:

- process (`kill`, `pause`): SIGKILL and a restart, SIGSTOP and SIGCONT;
- partition (`partition`): links between nodes cut by nftables;
- disk (`disk`, `eio`): a broker's disk full, or its writes failing with EIO;
- clock (`clock`): a broker's wall clock jumped forward or back;
- voters (`voters`, `replace`, a dynamic quorum only): a controller out of
  the voter set, or its disk wiped and the controller replaced.

`partition` needs root, a cgroup2 mount and the `nft` command; `disk` needs
root (its mounts); `eio`, `kill`, `pause`, `clock`, `voters` and `replace` need nothing.
Each family's module says how its fault is made and why that way.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from chaos.history import HistoryWriter
from chaos.nemesis import clock, disk, partition, process, voters
from chaos.nemesis.clock import CLOCK_FILE, Clocks
from chaos.nemesis.disk import DISK_FAULT_FILE, FILL_FILE, STOPPED_ON_FULL_DISK, DiskFaults, Disks
from chaos.nemesis.errors import NemesisError
from chaos.nemesis.partition import LinkCutter, link_cutting_unavailable
from chaos.schedule import ALL_NEMESES, Fault
from cluster.launcher import LocalCluster

__all__ = [
    "CLOCK_FILE",
    "DISK_FAULT_FILE",
    "FAULTS",
    "FILL_FILE",
    "Clocks",
    "DiskFaults",
    "Disks",
    "LinkCutter",
    "Nemesis",
    "NemesisError",
    "link_cutting_unavailable",
    "sleep_until",
]


class FaultFamily(NamedTuple):
    """How one kind of fault is applied (the fields it adds to the fault's
    record: the nodes it hit first) and healed (what the heal did)."""

    start: Callable[[Nemesis, Fault], dict[str, Any]]
    heal: Callable[[Nemesis, Fault], dict[str, Any]]


#: Every kind of fault a schedule may hold, and its family.
FAULTS: dict[str, FaultFamily] = {
    "kill": FaultFamily(process.start, process.heal_kill),
    "pause": FaultFamily(process.start, process.heal_pause),
    "partition": FaultFamily(partition.start, partition.heal),
    "disk": FaultFamily(disk.start_full, disk.heal_full),
    "eio": FaultFamily(disk.start_eio, disk.heal_eio),
    "clock": FaultFamily(clock.start, clock.heal),
    "voters": FaultFamily(voters.start, voters.heal),
    "replace": FaultFamily(voters.start_replace, voters.heal),
}
# The schedule draws only faults a nemesis can apply.
assert set(FAULTS) == set(ALL_NEMESES), (sorted(FAULTS), ALL_NEMESES)


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

    def resolve_among(self, target: str, nodes: list[int]) -> int:
        """`resolve(target)` if that is one of `nodes` (a fault only some
        nodes can take), else one of them drawn by `rng`."""
        node = self.resolve(target)
        return node if node in nodes else self.rng.choice(nodes)

    def start(self, fault: Fault) -> dict[str, Any]:
        record: dict[str, Any] = {"fault": fault.index, "kind": fault.kind, "target": fault.target,
                                  "shape": fault.shape}
        guessed_before = len(self.guessed)
        family = FAULTS.get(fault.kind)
        if family is None:
            raise NemesisError(f"no nemesis {fault.kind!r}")
        record.update(family.start(self, fault))
        if len(self.guessed) > guessed_before:
            record["target_guessed"] = True  # the cluster could not say who it was: a random node instead
        desc = fault.describe() + f" -> {record['nodes']}"
        self.history.record("nemesis", "info", fault.kind, value=desc, extra={"phase": "start", **record})
        self.applied.append(record)
        return record

    def check_crashes(self) -> list[int]:
        """Nodes that exited though the nemesis did not kill them: each recorded as a `crash`."""
        found = []
        for node in self.cluster.nodes.values():
            proc = node.process
            if proc is None or node.is_running() or node.node_id in self.killed or proc.pid in self.crashed:
                continue
            self.crashed.add(proc.pid)
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
                                f"{proc.returncode}", extra={"node": node.node_id, "log": last,
                                                             "output": str(node.output_path),
                                                             "disk_full": disk_full})
        return found

    def stop(self, fault: Fault) -> None:
        """Heal `fault` (every fault of its kind: one runs at a time)."""
        self.check_crashes()
        extra: dict[str, Any] = {"phase": "stop", "fault": fault.index}
        family = FAULTS.get(fault.kind)
        if family is not None:
            extra.update(family.heal(self, fault))
        late = disk.restart_stopped_on_full_disk(self)
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
        process.resume_paused(self)
        process.restart_killed(self)
        for node in self.cluster.nodes.values():  # any node down, whatever stopped it, runs again
            if not node.is_running():
                self.cluster.start(node.node_id)
        voters.add_removed_voters(self)


def sleep_until(deadline: float, stop: Callable[[], bool] = lambda: False) -> bool:
    """Sleep until time.monotonic() reaches `deadline`; False if `stop()` became true first."""
    while True:
        left = deadline - time.monotonic()
        if stop():
            return False
        if left <= 0:
            return True
        time.sleep(min(left, 0.1))
