"""LocalCluster: controllers and brokers as separate processes on one host.

The one way raftka starts a multi-process cluster: `raftka cluster up`,
`raftka demo`, the benches and the tests all use it.

Layout under `base_dir` (every path absolute):

    cluster.id                    the cluster id, reused when the dir is reused
    cluster.json                  node ids, roles, ports, pids (rewritten on every start/stop)
    controller-<id>.properties    Kafka-style configs; node ids 1..N are controllers,
    broker-<id>.properties        N+1..N+M brokers (as Kafka's examples number them)
    controller-<id>/, broker-<id>/   each node's log dir (formatted: meta.properties)
    controller-<id>.log, broker-<id>.log   each process's stdout and stderr

Ports: with `base_port=P`, broker i (0-based) listens on P+i and
controller j on P+100+j; with `base_port=0` every port is a free one.
With `metrics=True` node k (0-based, controllers first) serves its
Prometheus metrics (`metrics.port`) on P+400+k (`LocalNode.metrics_port`).

`start` runs `python -m raftka.cli controller|broker --config F`, each in a
session of its own, so that a terminal's Ctrl-C reaches only the launcher,
which then stops the cluster in order: `stop_all` sends SIGTERM to every
broker first (their controlled shutdown needs the controllers), then to
the controllers, and SIGKILLs whoever has not exited within the timeout.
With `die_with_parent` (the `cluster up` command) every child also gets
SIGTERM from the kernel if the launcher itself dies (PR_SET_PDEATHSIG).

`wait_ready` returns once every running node printed its READY line,
every voter's log has reached the quorum's high watermark, and every
running broker's Metadata lists every running broker (all are unfenced,
and each knows it).

`mode="zk"` runs the same brokers (same ids, ports and configs) in
ZooKeeper mode instead: `controllers` is then the size of a ZooKeeper
ensemble (1 or 3; the Debian `zookeeper` package, started from a generated
`zoo.cfg` under `zookeeper/`, client ports P+100.. for `base_port=P`), no
controller process runs, and each broker has `zookeeper.connect` instead of
`process.roles` and the quorum keys. The controller is whichever broker
ZooKeeper elects. `start_all` starts the ensemble first, `stop_all` stops it
last; `zookeeper` is the `ZooKeeperEnsemble` (for fault injection).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from cluster.probes import ProbeFailed, live_broker_ids, quorum_caught_up
from common.errors import RaftkaError
from common.meta_properties import format_log_dir, random_cluster_id, read_meta
from common.wire.ports import free_ports

CONTROLLER_PORT_OFFSET = 100
#: With --secure, the brokers' SASL_SSL listeners: base port + 500, +501, ...
SECURE_PORT_OFFSET = 500
METRICS_PORT_OFFSET = 400
DEFAULT_STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


class ClusterError(RaftkaError):
    """A node of the local cluster failed to start or exited; the message has its log's tail."""


@dataclasses.dataclass
class LocalNode:
    node_id: int
    role: str  # "controller" or "broker"
    host: str
    port: int
    log_dir: Path
    config_path: Path
    output_path: Path
    #: Where the node serves its metrics (`metrics.port`), when it does.
    metrics_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    #: Size of the output file when the process started: its READY line comes after.
    output_start: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output_since_start(self) -> str:
        try:
            with open(self.output_path, "rb") as f:
                f.seek(self.output_start)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return self.output_since_start()[-chars:]


class LocalCluster:
    def __init__(
        self,
        base_dir: str | Path,
        *,
        controllers: int = 3,
        brokers: int = 3,
        base_port: int = 0,
        host: str = "127.0.0.1",
        overrides: Mapping[str, str] | None = None,
        broker_overrides: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
        mode: str = "kraft",
        zookeeper_tick_time_ms: int = 2000,
        preexec: Callable[[int], None] | None = None,
        secure: bool = False,
        metrics: bool = False,
        log_dirs_per_broker: int = 1,
        secure_protocol: str = "SASL_SSL",
        dynamic_quorum: bool = False,
        secure_links: bool = True,
    ) -> None:
        if mode not in ("kraft", "zk"):
            raise ClusterError(f"mode={mode!r}: use kraft or zk")
        if secure_protocol not in ("SSL", "SASL_SSL"):
            raise ClusterError(f"secure_protocol={secure_protocol!r}: use SSL or SASL_SSL")
        if mode == "zk" and controllers not in (1, 3, 5):
            raise ClusterError(f"--controllers {controllers}: in zk mode it is the ZooKeeper ensemble size, "
                               "1, 3 or 5")
        if dynamic_quorum and mode != "kraft":
            raise ClusterError("a dynamic quorum (KIP-853) needs --mode kraft")
        if controllers < 1 or brokers < 1:
            raise ClusterError(f"--controllers {controllers} --brokers {brokers}: a cluster needs at least "
                               "one of each")
        self.base_dir = Path(base_dir).resolve()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.die_with_parent = die_with_parent
        #: Run in each child, with its node id, before exec (the chaos harness
        #: puts every node in a cgroup of its own there, so that its sockets are
        #: tagged from the first one on).
        self.preexec = preexec
        self.mode = mode
        self.cluster_id = self._cluster_id()
        overrides = dict(overrides or {})
        # quorum.engine=pysyncobj listens on a second port per controller; with free
        # ports, the default (controller port + 100) might be another node's, so pick them too.
        pysyncobj_ports = (overrides.get("quorum.engine") == "pysyncobj" and base_port == 0
                           and "quorum.pysyncobj.port" not in overrides)
        nodes = controllers + brokers
        # Metrics (`metrics.port`) on P+400+i with --base-port P: clear of the
        # brokers (P..), the controllers or ZooKeeper's client ports (P+100..),
        # pysyncobj or ZooKeeper's peer ports (P+200..) and ZooKeeper's
        # election ports (P+300..); --secure listeners are on P+500...
        # Free ports are drawn in one call, so that none is drawn twice.
        ports = free_ports(controllers * (2 if pysyncobj_ports else 1) + brokers + (nodes if metrics else 0),
                           host) if base_port == 0 else (
            [base_port + CONTROLLER_PORT_OFFSET + j for j in range(controllers)]
            + [base_port + i for i in range(brokers)]
            + ([base_port + METRICS_PORT_OFFSET + k for k in range(nodes)] if metrics else []))
        metrics_ports: list[int | None] = [None] * nodes
        if metrics:
            metrics_ports, ports = ports[-nodes:], ports[:-nodes]
        if pysyncobj_ports:
            extra, ports = ports[controllers + brokers:], ports[:controllers + brokers]
            overrides["quorum.pysyncobj.port"] = ",".join(f"{j + 1}@{p}" for j, p in enumerate(extra))
        self.zookeeper = None
        if mode == "zk":
            from quorum.zookeeper.ensemble import ZooKeeperEnsemble

            self.zookeeper = ZooKeeperEnsemble(
                self.base_dir / "zookeeper", controllers, tick_time_ms=zookeeper_tick_time_ms, host=host,
                base_port=None if base_port == 0 else base_port + CONTROLLER_PORT_OFFSET)
        #: With `secure`: each broker's SASL_SSL listener (clients log in as the
        #: admin with SCRAM), or SSL one with `secure_protocol="SSL"`, which is
        #: also the inter-broker listener; the controllers' listener uses the
        #: same protocol, so every node-to-node link (Raft, broker to controller,
        #: replication) is secured; the nodes log in as the admin with PLAIN. The
        #: brokers' PLAINTEXT listeners stay for local tools. In zk mode a broker
        #: registers one listener, so its only listener is the secure one and
        #: clients log in with PLAIN (SCRAM credentials live in the KRaft metadata log).
        #: `secure_links=False` (kraft) keeps the nodes' own links PLAINTEXT, so that
        #: only the clients' path pays for TLS (the bench's security cost).
        self.secure_links = secure_links or mode == "zk"
        self.secure_protocol = secure_protocol
        self.security = None
        self.secure_ports: dict[int, int] = {}
        if secure:
            from common.security.dev import DevSecurity

            self.security = DevSecurity.ensure(self.base_dir / "secure", (host,))
            if mode == "zk":
                self.secure_ports = {controllers + i + 1: ports[controllers + i] for i in range(brokers)}
            else:
                extra = free_ports(brokers, host) if base_port == 0 else [base_port + SECURE_PORT_OFFSET + i
                                                                          for i in range(brokers)]
                self.secure_ports = {controllers + i + 1: port for i, port in enumerate(extra)}
        self.nodes: dict[int, LocalNode] = {}
        for index in range(controllers + brokers):
            node_id = index + 1
            role = "controller" if index < controllers else "broker"
            if mode == "zk" and role == "controller":
                continue  # node ids stay as in kraft mode: brokers are N+1..N+M
            name = f"{role}-{node_id}"
            self.nodes[node_id] = LocalNode(node_id, role, host, ports[index], self.base_dir / name,
                                            self.base_dir / f"{name}.properties", self.base_dir / f"{name}.log",
                                            metrics_ports[index])
        voters = ",".join(f"{n.node_id}@{n.address}" for n in self.controllers)
        directory_ids: dict[int, str] = {}
        newly_formatted: list[LocalNode] = []
        for node in self.nodes.values():
            if self.zookeeper is not None:
                # Kafka's ZooKeeper-mode keys; the broker writes its own meta.properties (version=0).
                props = {"broker.id": str(node.node_id), "zookeeper.connect": self.zookeeper.connect_string,
                         "log.dirs": str(node.log_dir)}
            elif dynamic_quorum:
                # KIP-853: every node finds the quorum through the bootstrap servers;
                # the controllers' first voter set is written at format time (below).
                props = {"node.id": str(node.node_id), "process.roles": node.role,
                         "controller.quorum.bootstrap.servers": ",".join(n.address for n in self.controllers),
                         "controller.listener.names": "CONTROLLER", "log.dirs": str(node.log_dir)}
                if node.role == "controller":
                    props["listeners"] = f"CONTROLLER://{node.address}"
            else:
                props = {"node.id": str(node.node_id), "process.roles": node.role,
                         "controller.quorum.voters": voters, "log.dirs": str(node.log_dir)}
            if node.role == "broker" and log_dirs_per_broker > 1 and self.zookeeper is None:
                # More log dirs beside the node's own (the metadata log stays in the first).
                props["log.dirs"] = ",".join(str(d) for d in self.broker_log_dirs(node, log_dirs_per_broker))
            if node.role == "broker":
                props["listeners"] = f"PLAINTEXT://{node.address}"
                if self.security is not None and self.zookeeper is not None:
                    props["listeners"] = f"{secure_protocol}://{node.address}"
                elif self.security is not None:
                    props["listeners"] += f",{secure_protocol}://{host}:{self.secure_ports[node.node_id]}"
            if self.security is not None and self.secure_links:
                props.update(self._node_link_properties(secure_protocol))
            elif self.security is not None and node.role == "broker":
                props["inter.broker.listener.name"] = "PLAINTEXT"
                props.update(self.security.listener_properties(secure_protocol))
            if node.metrics_port is not None:
                props["metrics.host"] = host
                props["metrics.port"] = str(node.metrics_port)
            props.update(overrides or {})
            if node.role == "broker":
                props.update(broker_overrides or {})
            node.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            if self.zookeeper is None:
                first_format = read_meta(str(node.log_dir)) is None
                directory_ids[node.node_id] = format_log_dir(node.log_dir, self.cluster_id, node.node_id)
                if node.role == "broker":
                    for extra in self.broker_log_dirs(node, log_dirs_per_broker)[1:]:
                        format_log_dir(extra, self.cluster_id, node.node_id)
                if first_format and node.role == "controller":
                    newly_formatted.append(node)
                if self.security is not None and node.role == "controller" and first_format:
                    from quorum.node.bootstrap import parse_add_scram, write_bootstrap

                    write_bootstrap(str(node.log_dir), [parse_add_scram(v) for v in self.security.scram_bootstrap()])
        if dynamic_quorum and newly_formatted:
            # As `raftka storage format --initial-controllers` with every controller.
            from quorum.node.metadata_log import write_bootstrap_voters
            from quorum.node.voter_config import parse_directory_id
            from quorum.raft.voters import VoterInfo

            initial = tuple(VoterInfo(n.node_id, parse_directory_id(directory_ids[n.node_id]),
                                      (("CONTROLLER", n.host, n.port),)) for n in self.controllers)
            for node in newly_formatted:
                write_bootstrap_voters(str(node.log_dir), initial)
        self._write_state()

    def _node_link_properties(self, protocol: str) -> dict[str, str]:
        """Every node's keys for links on `protocol`: its brokers' secure listener is the
        inter-broker one and the controllers' listener uses the same protocol (in kraft mode)."""
        assert self.security is not None
        props = {"inter.broker.listener.name": protocol, **self.security.listener_properties(protocol)}
        if self.zookeeper is None:
            props["controller.listener.names"] = "CONTROLLER"
            props["listener.security.protocol.map"] = (f"CONTROLLER:{protocol},PLAINTEXT:PLAINTEXT,"
                                                       f"{protocol}:{protocol}")
            props.update(self.security.listener_properties("CONTROLLER"))
        return props

    def node_link_security(self):
        """How a local tool reaches the controllers' listener and (in zk mode) the brokers'
        (`common.security.client.ClientSecurity`); None when they are PLAINTEXT."""
        if self.security is None or not self.secure_links:
            return None
        from common.security.client import listener_client_security

        props = self._node_link_properties(self.secure_protocol)
        if self.zookeeper is not None:
            return listener_client_security(props, self.secure_protocol, "sasl.mechanism.inter.broker.protocol")
        return listener_client_security(props, "CONTROLLER", "sasl.mechanism.controller.protocol")

    def broker_log_dirs(self, node: LocalNode, count: int) -> list[Path]:
        """A broker's `count` log dirs: its own, then `<name>-dir2`, ... beside it."""
        return [node.log_dir] + [self.base_dir / f"{node.log_dir.name}-dir{k}" for k in range(2, count + 1)]

    def _cluster_id(self) -> str:
        path = self.base_dir / "cluster.id"
        if path.exists():
            return path.read_text().strip()
        cluster_id = random_cluster_id()
        path.write_text(cluster_id + "\n")
        return cluster_id

    # --- views ----------------------------------------------------------------

    @property
    def controllers(self) -> list[LocalNode]:
        return [n for n in self.nodes.values() if n.role == "controller"]

    @property
    def brokers(self) -> list[LocalNode]:
        return [n for n in self.nodes.values() if n.role == "broker"]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers)

    @property
    def secure_bootstrap(self) -> str:
        """The brokers' SASL_SSL (or SSL) listeners (with `secure`)."""
        return ",".join(f"{self.host}:{port}" for port in self.secure_ports.values())

    def secure_client_config(self) -> dict[str, str]:
        """librdkafka's keys for the `secure` listeners (admin SCRAM login for SASL_SSL)."""
        assert self.security is not None, "the cluster was made without secure=True"
        if self.secure_protocol == "SSL":
            return {"bootstrap.servers": self.secure_bootstrap, "security.protocol": "SSL",
                    "ssl.ca.location": str(self.security.ca_path)}
        settings = dict(line.split("=", 1) for line in self.security.client_settings(self.secure_bootstrap))
        if self.zookeeper is not None:
            settings["sasl.mechanism"] = "PLAIN"  # no SCRAM credentials without the KRaft metadata log
        return settings

    def node(self, node_id: int) -> LocalNode:
        return self.nodes[node_id]

    def pids(self) -> dict[int, int]:
        return {n.node_id: n.pid for n in self.nodes.values() if n.is_running() and n.pid is not None}

    def _write_state(self) -> None:
        state = {"cluster_id": self.cluster_id, "mode": self.mode, "bootstrap": self.bootstrap,
                 "launcher_pid": os.getpid(),
                 "zookeeper_connect": None if self.zookeeper is None else self.zookeeper.connect_string,
                 "nodes": [{"node_id": n.node_id, "role": n.role, "address": n.address, "log_dir": str(n.log_dir),
                            "config": str(n.config_path), "output": str(n.output_path),
                            "metrics": None if n.metrics_port is None else f"{n.host}:{n.metrics_port}",
                            "pid": n.pid if n.is_running() else None} for n in self.nodes.values()]}
        tmp = self.base_dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.base_dir / "cluster.json")

    # --- processes ----------------------------------------------------------------

    def start(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.is_running():
            raise ClusterError(f"{node.role} {node_id} is already running (pid {node.pid})")
        node.output_start = node.output_path.stat().st_size if node.output_path.exists() else 0
        with open(node.output_path, "ab") as out:
            node.process = subprocess.Popen(
                [sys.executable, "-m", "raftka.cli", node.role, "--config", str(node.config_path)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=self._child_setup(node_id))
        self._write_state()

    def _child_setup(self, node_id: int) -> Callable[[], None] | None:
        steps: list[Callable[[], None]] = []
        if self.die_with_parent:
            steps.append(_die_with_parent)
        if self.preexec is not None:
            steps.append(functools.partial(self.preexec, node_id))
        if not steps:
            return None

        def setup() -> None:
            for step in steps:
                step()

        return setup

    def start_zookeeper(self, timeout_s: float = 60.0) -> None:
        """zk mode: start the ensemble (if not running) and record the cluster id in `/cluster/id`."""
        assert self.zookeeper is not None, "start_zookeeper is for mode='zk'"
        if all(s.running for s in self.zookeeper.servers):
            return
        from kazoo.client import KazooClient

        from quorum.zookeeper.broker_side import ensure_cluster_paths, get_or_create_cluster_id

        self.zookeeper.start(timeout_s)
        zk = KazooClient(self.zookeeper.connect_string)
        try:
            zk.start(timeout_s)
            ensure_cluster_paths(zk)
            found = get_or_create_cluster_id(zk, self.cluster_id)
        finally:
            zk.stop()
            zk.close()
        if found != self.cluster_id:
            raise ClusterError(f"ZooKeeper at {self.zookeeper.connect_string} holds cluster {found}, not "
                               f"{self.cluster_id} of {self.base_dir}: use another --data-dir")

    def zookeeper_controller(self, timeout_s: float = 10.0) -> tuple[int | None, int]:
        """zk mode: (the broker holding `/controller` or None, the controller epoch)."""
        assert self.zookeeper is not None, "zookeeper_controller is for mode='zk'"
        from kazoo.client import KazooClient

        from quorum.zookeeper import store

        zk = KazooClient(self.zookeeper.connect_string)
        try:
            zk.start(timeout_s)
            return store.active_controller(zk), store.read_controller_epoch(zk)[0]
        finally:
            zk.stop()
            zk.close()

    def start_all(self) -> None:
        if self.zookeeper is not None:
            self.start_zookeeper()
        for node in (*self.controllers, *self.brokers):
            if not node.is_running():
                self.start(node.node_id)

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig`; for SIGKILL, wait until the process is gone."""
        node = self.nodes[node_id]
        if node.is_running():
            assert node.process is not None
            node.process.send_signal(sig)
            if sig == signal.SIGKILL:
                node.process.wait()
        self._write_state()

    def stop(self, node_id: int, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """SIGTERM, then SIGKILL after `timeout_s`; whether it exited by itself."""
        return self._stop_group([self.nodes[node_id]], timeout_s)

    def stop_all(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """Brokers first, then controllers; whether every process exited by itself."""
        clean = self._stop_group(self.brokers, timeout_s)
        clean = self._stop_group(self.controllers, timeout_s) and clean
        if self.zookeeper is not None:
            self.zookeeper.stop()
        return clean

    def _stop_group(self, nodes: list[LocalNode], timeout_s: float) -> bool:
        running = [n for n in nodes if n.is_running()]
        for n in running:
            assert n.process is not None
            n.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        clean = True
        for n in running:
            assert n.process is not None
            try:
                n.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                clean = False
                n.process.kill()
                n.process.wait()
        self._write_state()
        return clean

    def exited(self) -> list[LocalNode]:
        """Nodes that were started and are no longer running."""
        return [n for n in self.nodes.values() if n.process is not None and not n.is_running()]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_all(timeout_s=10.0)

    # --- readiness ------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = 120.0, *, progress: Any = None) -> None:
        """See the module docstring. Raises ClusterError naming what is not ready.
        `progress(text)` is told what is awaited."""
        deadline = time.monotonic() + timeout_s
        running = [n for n in self.nodes.values() if n.process is not None]
        say = progress or (lambda text: None)
        waiting = list(running)
        while waiting:
            say(f"waiting for {', '.join(f'{n.role} {n.node_id}' for n in waiting)} to start")
            for n in running:
                self._check_alive(n)
            for n in list(waiting):
                if any(line.startswith("READY ") for line in n.output_since_start().splitlines()):
                    waiting.remove(n)
            self._check_deadline(deadline, "nodes did not print READY: "
                                 + ", ".join(f"{n.role} {n.node_id} (see {n.output_path})" for n in waiting))
            if waiting:
                time.sleep(0.05)
        say("waiting for the controllers to catch up and every broker to be unfenced")
        controllers = [(n.host, n.port) for n in self.controllers if n in running]
        voter_ids = {n.node_id for n in self.controllers}
        brokers = [n for n in self.brokers if n in running]
        expected = {b.node_id for b in brokers}
        links = self.node_link_security()
        while True:
            for n in running:
                self._check_alive(n)
            try:
                trio.run(self._probe, controllers, voter_ids, brokers, expected, links)
                return
            except ProbeFailed as exc:
                self._check_deadline(deadline, f"the cluster is not ready: {exc}")
                time.sleep(0.1)

    @staticmethod
    async def _probe(controllers: list[tuple[str, int]], voter_ids: set[int], brokers: list[LocalNode],
                     expected: set[int], links: Any) -> None:
        # With `secure`, `links` logs in on the controllers' listener (kraft) or on the
        # brokers' only listener (zk: no controller process runs); a kraft broker's
        # PLAINTEXT listener needs nothing.
        if controllers:
            await quorum_caught_up(controllers, voter_ids, links)
        for b in brokers:
            listed = await live_broker_ids(b.host, b.port, None if controllers else links)
            if not expected <= listed:
                raise ProbeFailed(f"broker {b.node_id} lists live brokers {sorted(listed)}, "
                                  f"not yet all of {sorted(expected)}")

    def _check_alive(self, node: LocalNode) -> None:
        if not node.is_running():
            assert node.process is not None
            raise ClusterError(f"{node.role} {node.node_id} exited with code {node.process.returncode}; "
                               f"the end of {node.output_path}:\n{node.tail()}")

    @staticmethod
    def _check_deadline(deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise ClusterError(what)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass
