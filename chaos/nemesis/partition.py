"""The `partition` fault: links between nodes cut, one-way or two-way, by `LinkCutter`.

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

`partition` needs root, a cgroup2 mount and the `nft` command (the Debian
`nftables` package; `make sysdeps` installs it). The table and the cgroups
carry the run's pid in their name and are removed at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.nemesis.errors import NemesisError
from chaos.schedule import Fault

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis

#: Conntrack marks of this harness: the high half says "raftka chaos", the low the node id.
MARK_BASE = 0x52430000
NFT_CGROUP_ROOT = Path("/sys/fs/cgroup")  # nft resolves `socket cgroupv2` paths under this


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


def two_way(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    return [(x, y) for x in a for y in b] + [(y, x) for x in a for y in b]


def start(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    if nemesis.cutter is None:
        raise NemesisError("partition needs a LinkCutter")
    links, sides = _links(nemesis, fault)
    nemesis.cutter.cut(links)
    return {"nodes": sides, "links": len(links)}


def heal(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    if nemesis.cutter is None:
        return {}
    return {"dropped_packets": nemesis.cutter.heal()}


def _links(nemesis: Nemesis, fault: Fault) -> tuple[list[tuple[int, int]], list[Any]]:
    """The links to cut for the fault's shape, and the sides they separate."""
    everyone = sorted(nemesis.cluster.nodes)
    if fault.shape == "majority-minority":
        a, b = (list(g) for g in fault.groups)
        return two_way(a, b), [a, b]
    node = nemesis.resolve(fault.target)
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
