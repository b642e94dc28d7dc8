"""Migrating a ZooKeeper-mode `LocalCluster` to KRaft (I/O shell: processes, files, ZooKeeper).

Theory of operation
-------------------
`LocalMigration(cluster)` takes a running `LocalCluster(mode="zk")` through
KIP-866's steps; `raftka migrate` and the tests drive it:

1. `start_controllers()`: one KRaft controller per ZooKeeper server, with
   the node ids ZooKeeper mode leaves free (1..N; brokers are N+1..N+M),
   log dirs formatted with the cluster id ZooKeeper holds, and
   `zookeeper.metadata.migration.enable=true`; `wait_copied()` returns once
   `/migration` exists, i.e. the copy batch is committed.
2. `move_broker(id)` for each broker in turn: SIGTERM (a ZooKeeper-mode
   controlled shutdown: the driver fences it and moves its leaders), keep
   its ZooKeeper config as `broker-<id>.zk.properties`, rewrite each log
   dir's meta.properties as v1 (`meta_properties.to_kraft`), start it with
   `process.roles=broker` and the voters, and wait until it is unfenced
   and back in the ISR of every partition it hosts (`wait_in_sync`).
3. `finalize()`: the controllers restarted one at a time without the
   migration keys; the active one appends POST_MIGRATION
   (`MigrationFinalizer`). `rollback()` instead (before finalize): stop the
   controllers (and delete their metadata logs: a later migration starts
   from a fresh quorum), delete the KRaft `/controller` and `/migration` so a
   ZooKeeper-mode broker is elected controller and loads the (dual-written,
   current) state, then restart every KRaft-mode broker with its saved
   ZooKeeper config.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient

from quorum.migration import zk_io
from quorum.migration.meta_properties import render, to_kraft
from quorum.migration.znode import MIGRATION_PATH
from cluster.launcher import ClusterError, LocalCluster, LocalNode
from common.config import read_properties
from common.meta_properties import META_PROPERTIES, format_log_dir, read_meta
from common.wire.ports import free_ports

MIGRATION_KEYS = ("zookeeper.metadata.migration.enable", "zookeeper.metadata.migration.broker.ids",
                  "zookeeper.connect", "zookeeper.session.timeout.ms")
#: ZooKeeper-mode keys a KRaft broker must not have
_ZK_BROKER_KEYS = ("broker.id", "zookeeper.connect", "zookeeper.session.timeout.ms",
                   "zookeeper.connection.timeout.ms")


def _write_properties(path: Path, props: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


class LocalMigration:
    def __init__(self, cluster: LocalCluster, *, controller_overrides: dict[str, str] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        if cluster.mode != "zk" or cluster.zookeeper is None:
            raise ClusterError("raftka migrate moves a ZooKeeper-mode cluster (cluster up --mode zk) to KRaft; "
                               f"{cluster.base_dir} runs in {cluster.mode} mode")
        self.cluster = cluster
        self.zookeeper_connect = cluster.zookeeper.connect_string
        self.controller_overrides = dict(controller_overrides or {})
        self.say = say or (lambda text: None)
        self.broker_ids = sorted(b.node_id for b in cluster.brokers)

    # --- ZooKeeper ---------------------------------------------------------------------

    def _zk(self, fn, *args):
        zk = KazooClient(self.zookeeper_connect)
        zk.start(30)
        try:
            return fn(zk, *args)
        finally:
            zk.stop()
            zk.close()

    # --- 1. controllers in migration mode ---------------------------------------------------

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@{n.address}" for n in self.cluster.controllers)

    def start_controllers(self, timeout_s: float = 60.0) -> None:
        cluster = self.cluster
        ids = [i for i in range(1, len(cluster.zookeeper.servers) + 1) if i not in cluster.nodes]
        if not cluster.controllers:
            ports = free_ports(len(ids), cluster.host)
            for node_id, port in zip(ids, ports):
                name = f"controller-{node_id}"
                cluster.nodes[node_id] = LocalNode(node_id, "controller", cluster.host, port, cluster.base_dir / name,
                                                   cluster.base_dir / f"{name}.properties",
                                                   cluster.base_dir / f"{name}.log")
        for node in cluster.controllers:
            props = {"node.id": str(node.node_id), "process.roles": "controller",
                     "controller.quorum.voters": self.voters, "log.dirs": str(node.log_dir),
                     "zookeeper.connect": self.zookeeper_connect,
                     "zookeeper.metadata.migration.enable": "true",
                     "zookeeper.metadata.migration.broker.ids": ",".join(map(str, self.broker_ids)),
                     **self.controller_overrides}
            _write_properties(node.config_path, props)
            format_log_dir(node.log_dir, cluster.cluster_id, node.node_id)
        for node in cluster.controllers:
            if not node.is_running():
                self.say(f"starting KRaft controller {node.node_id} in migration mode")
                cluster.start(node.node_id)
        self._wait_ready_lines(cluster.controllers, timeout_s)

    def _wait_ready_lines(self, nodes: list[LocalNode], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            while not any(line.startswith("READY ") for line in node.output_since_start().splitlines()):
                if not node.is_running():
                    raise ClusterError(f"{node.role} {node.node_id} exited; the end of {node.output_path}:\n"
                                       f"{node.tail()}")
                if time.monotonic() > deadline:
                    raise ClusterError(f"{node.role} {node.node_id} did not start within {timeout_s:.0f} s; "
                                       f"see {node.output_path}")
                time.sleep(0.05)

    def wait_copied(self, timeout_s: float = 60.0) -> None:
        """Until the copy batch is committed (the driver then writes `/migration`)."""
        self.say("waiting for the ZooKeeper metadata to be copied into the quorum")
        deadline = time.monotonic() + timeout_s
        while self._zk(zk_io.read_migration) is None:
            for node in self.cluster.controllers:
                if not node.is_running():
                    raise ClusterError(f"controller {node.node_id} exited:\n{node.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"the metadata copy did not finish within {timeout_s:.0f} s; see the controller "
                                   f"logs in {self.cluster.base_dir}")
            time.sleep(0.2)

    # --- 2. brokers, one at a time --------------------------------------------------------------

    def _zk_config_path(self, node: LocalNode) -> Path:
        return node.config_path.with_suffix(".zk.properties")

    def move_broker(self, node_id: int, timeout_s: float = 120.0) -> None:
        node = self.cluster.node(node_id)
        props = read_properties(node.config_path)
        if props.get("process.roles") == "broker":
            return  # already moved
        saved = self._zk_config_path(node)
        if not saved.exists():
            saved.write_text(node.config_path.read_text())
        self.say(f"broker {node_id}: stopping in ZooKeeper mode")
        if not self.cluster.stop(node_id, timeout_s):
            self.say(f"broker {node_id}: did not stop within {timeout_s:.0f} s and was killed")
        for log_dir in props.get("log.dirs", str(node.log_dir)).split(","):
            meta = read_meta(log_dir) or {}
            path = Path(log_dir) / META_PROPERTIES
            tmp = path.with_suffix(".tmp")
            tmp.write_text(render(to_kraft(meta, self.cluster.cluster_id, node_id)))
            tmp.replace(path)
        kraft = {k: v for k, v in props.items() if k not in _ZK_BROKER_KEYS}
        kraft = {"node.id": str(node_id), "process.roles": "broker", "controller.quorum.voters": self.voters,
                 **kraft}
        _write_properties(node.config_path, kraft)
        self.say(f"broker {node_id}: starting in KRaft mode on the same log dirs")
        self.cluster.start(node_id)
        self._wait_ready_lines([node], timeout_s)
        self.wait_in_sync(node_id, timeout_s)

    def wait_in_sync(self, node_id: int, timeout_s: float = 120.0) -> None:
        """Until `node_id` is listed live and is in the ISR of every partition it hosts."""
        from confluent_kafka.admin import AdminClient

        self.say(f"broker {node_id}: waiting until it is unfenced and back in every ISR")
        node = self.cluster.node(node_id)
        admin = AdminClient({"bootstrap.servers": node.address})
        deadline = time.monotonic() + timeout_s
        while True:
            lagging = None
            try:
                md = admin.list_topics(timeout=5)
                if node_id not in md.brokers:
                    lagging = "not listed live"
                else:
                    for t in md.topics.values():
                        for p in t.partitions.values():
                            if node_id in p.replicas and node_id not in p.isrs:
                                lagging = f"not in the ISR of {t.topic}-{p.id}"
            except Exception as e:  # librdkafka's KafkaException while the broker starts
                lagging = f"metadata not available ({e})"
            if lagging is None:
                return
            if not node.is_running():
                raise ClusterError(f"broker {node_id} exited:\n{node.tail()}")
            if time.monotonic() > deadline:
                raise ClusterError(f"broker {node_id} is {lagging} after {timeout_s:.0f} s; see {node.output_path}")
            time.sleep(0.3)

    def move_brokers(self, timeout_s: float = 120.0) -> None:
        for b in self.broker_ids:
            self.move_broker(b, timeout_s)
        self.cluster.mode = "kraft"

    # --- 3. finalize or roll back ---------------------------------------------------------------------

    def finalize(self, timeout_s: float = 60.0) -> None:
        """Restart the controllers one at a time without the migration keys (KIP-866's finalize)."""
        for node in self.cluster.controllers:
            props = {k: v for k, v in read_properties(node.config_path).items() if k not in MIGRATION_KEYS}
            _write_properties(node.config_path, props)
        for node in self.cluster.controllers:
            self.say(f"controller {node.node_id}: restarting out of migration mode")
            self.cluster.stop(node.node_id, timeout_s)
            self.cluster.start(node.node_id)
            self._wait_ready_lines([node], timeout_s)
        self.cluster.mode = "kraft"

    def rollback(self, timeout_s: float = 120.0) -> None:
        """Back to ZooKeeper mode (only before finalize: ZooKeeper is current thanks to dual write)."""
        for node in self.cluster.controllers:
            props = read_properties(node.config_path)
            if props.get("zookeeper.metadata.migration.enable") != "true":
                raise ClusterError("the migration was finalized: ZooKeeper is no longer current; a rollback would "
                                   "lose every change since")
        self.say("stopping the KRaft controllers")
        for node in self.cluster.controllers:
            self.cluster.stop(node.node_id, timeout_s)
        for node in self.cluster.controllers:
            # Their metadata log describes a migration that no longer happens: a later migration
            # needs a freshly formatted quorum (the copy refuses a non-empty log), as in Kafka.
            shutil.rmtree(node.log_dir, ignore_errors=True)
            node.config_path.unlink(missing_ok=True)
            del self.cluster.nodes[node.node_id]
        self.say("handing /controller back to ZooKeeper mode")
        self._zk(zk_io.release)
        self.cluster.mode = "zk"
        for b in self.broker_ids:
            node = self.cluster.node(b)
            saved = self._zk_config_path(node)
            if not saved.exists():
                continue  # never moved
            self.say(f"broker {b}: restarting in ZooKeeper mode")
            self.cluster.stop(b, timeout_s)
            node.config_path.write_text(saved.read_text())
            saved.unlink()
            self.cluster.start(b)
            self._wait_ready_lines([node], timeout_s)
        self.cluster.wait_ready(timeout_s, progress=self.say)

    def migrated_znode_exists(self) -> bool:
        return self._zk(lambda zk: zk.exists(MIGRATION_PATH) is not None)
