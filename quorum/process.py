"""One controller process: a quorum voter serving the controller listener.

`run_controller(config)` checks the log dir (`meta.properties` must name
this cluster's id and this node's id: `raftka storage format` writes it),
starts the `RaftNode` on `<log.dirs[0]>/__cluster_metadata-0`, the
`ControllerService`, and the Kafka-protocol server on this node's address
in `controller.quorum.voters`. It prints one line
`READY node=<id> controller=<host>:<port>` once it serves, for scripts and
tests. SIGTERM or SIGINT stop it gracefully: a leader first hands over
with EndQuorumEpoch.

Quorum keys read besides `NodeConfig`'s: `controller.quorum.request.timeout.ms`,
`controller.quorum.retry.backoff.ms`, `metadata.log.segment.bytes`, `quorum.engine` (raftka|pysyncobj) and
`quorum.pysyncobj.port` (default: the controller port + 100); with
`zookeeper.metadata.migration.enable=true` also `zookeeper.connect` and the
rest of `quorum.migration.MigrationConfig` (a migration from ZooKeeper mode).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import signal

import trio

from quorum.controller import ControllerConfig
from quorum.migration import MigrationConfig, MigrationDriver, MigrationFinalizer
from quorum.node.controller_service import ControllerService
from quorum.node.driver import RaftNode
from quorum.node.handler import QuorumRequestHandler
from quorum.node.metadata_log import DEFAULT_SEGMENT_BYTES
from quorum.node.syncobj_node import PysyncobjNode
from quorum.raft import QuorumConfig
from common.security.acl import authorizer_config
from common.config import NodeConfig, Properties, int_property, warn_unread_keys
from common.errors import ConfigError
from common.meta_properties import check_log_dir, format_log_dir, read_meta
from common.metrics import metrics_endpoint, new_registry, serve_metrics
from common.security import controller_listener_security
from common.security.client import controller_client_security
from common.wire import serve
from quorum.node.bootstrap import read_bootstrap
from quorum.node.metrics import controller_collector, raft_collector

RESIGN_GRACE_S = 0.5
#: `quorum.engine`: raftka's own KIP-595 Raft, or pysyncobj's Raft (quorum.node.syncobj_node).
ENGINES = ("raftka", "pysyncobj")

_log = logging.getLogger("quorum.node.process")


def quorum_config(config: NodeConfig) -> QuorumConfig:
    """The Raft timeouts from a node's properties (Kafka's keys and defaults)."""
    defaults = QuorumConfig()
    return QuorumConfig.from_node_config(
        config,
        controller_quorum_request_timeout_ms=int_property(
            config.raw, "controller.quorum.request.timeout.ms", defaults.controller_quorum_request_timeout_ms, 1),
        controller_quorum_retry_backoff_ms=int_property(
            config.raw, "controller.quorum.retry.backoff.ms", defaults.controller_quorum_retry_backoff_ms, 0),
    )


def quorum_engine(config: NodeConfig) -> str:
    engine = config.raw.get("quorum.engine", "raftka").strip()
    if engine not in ENGINES:
        raise ConfigError(f"quorum.engine={engine}: expected one of {', '.join(ENGINES)}")
    return engine


def make_quorum_node(config: NodeConfig, cluster_id: str) -> RaftNode | PysyncobjNode:
    """The quorum member `quorum.engine` names: raftka's own Raft (the default) or pysyncobj's."""
    segment_bytes = int_property(config.raw, "metadata.log.segment.bytes", DEFAULT_SEGMENT_BYTES, 1024)
    if quorum_engine(config) == "pysyncobj":
        return PysyncobjNode(
            node_id=config.node_id, voters=config.controller_quorum_voters, log_dir=config.log_dirs[0],
            cluster_id=cluster_id,
            pysyncobj_port=config.raw.get("quorum.pysyncobj.port"),
            election_timeout_ms=quorum_config(config).controller_quorum_election_timeout_ms,
            segment_bytes=segment_bytes)
    return RaftNode(node_id=config.node_id, voters=config.controller_quorum_voters, log_dir=config.log_dirs[0],
                    cluster_id=cluster_id, config=quorum_config(config), segment_bytes=segment_bytes,
                    client_security=controller_client_security(config.raw),
                    bootstrap_servers=config.controller_quorum_bootstrap_servers)


def dynamic_quorum(config: NodeConfig, node: RaftNode | PysyncobjNode) -> bool:
    """A KIP-853 quorum (kraft.version 1): found through
    controller.quorum.bootstrap.servers, or with voters in its log."""
    if config.controller_quorum_bootstrap_servers:
        return True
    log = getattr(node, "log", None)
    return isinstance(node, RaftNode) and log is not None and log.latest_voters() is not None


def scram_lookup(node):
    """SCRAM credentials from the node's committed metadata image (for a SASL controller listener)."""
    return lambda mechanism, user: node.image.scram_credentials.get((mechanism, user))


def check_log_dirs(config: NodeConfig) -> str:
    """The cluster id every log dir agrees on; ConfigError naming the file otherwise.

    A log dir that is empty or missing while another of `log.dirs` is
    formatted is formatted with that one's cluster id, as Kafka's start
    formats the empty dirs of a formatted node: a failed disk replaced by
    an empty one needs no separate format step."""
    formatted = [d for d in config.log_dirs if read_meta(d) is not None]
    if formatted and len(formatted) < len(config.log_dirs):
        cluster_id = check_log_dir(formatted[0], None, config.node_id)
        for d in config.log_dirs:
            if d not in formatted and (not os.path.isdir(d) or not os.listdir(d)):
                format_log_dir(d, cluster_id, config.node_id)
                _log.warning("log dir %s was empty: formatted it for cluster %s, node %d (as %s is); its "
                             "replicas are copied from their leaders", d, cluster_id, config.node_id, formatted[0])
    cluster_ids = {d: check_log_dir(d, None, config.node_id) for d in config.log_dirs}
    if len(set(cluster_ids.values())) != 1:
        listing = ", ".join(f"{d}/meta.properties: {c}" for d, c in cluster_ids.items())
        raise ConfigError(f"log dirs belong to different clusters ({listing}): format them with one cluster id")
    return next(iter(cluster_ids.values()))

#: Key families only brokers read (Kafka's broker-side config names).
BROKER_KEY_PREFIXES = ("log.", "group.", "offsets.", "transaction", "replica.", "num.", "socket.", "message.",
                       "auto.", "default.", "producer.", "compression.", "queued.", "fetch.", "broker.rack",
                       "advertised.", "listeners", "inter.broker.", "min.insync", "max.", "connections.",
                       "delete.topic", "unclean.", "metrics.", "quota.", "client.quota", "raftka.")


async def run_controller(config: NodeConfig, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    if not config.is_controller:
        raise ConfigError(f"process.roles={','.join(sorted(config.process_roles))}: `raftka controller` needs "
                          "process.roles=controller")
    cluster_id = check_log_dirs(config)
    # Bound where `listeners` puts the controller listener (an empty host:
    # every interface); `host` stays the address the voters know it by.
    assert config.controller_listener is not None
    _name, bind_host, port = config.controller_listener
    host, port = config.controller_quorum_voters.get(config.node_id, (bind_host or "127.0.0.1", port))
    node = make_quorum_node(config, cluster_id)
    if isinstance(node, PysyncobjNode):
        node.check_bindable()
    controller = ControllerService(node, ControllerConfig.from_node_config(config, cluster_id), random.Random(),
                                   read_bootstrap(config.log_dirs[0]))
    migration = MigrationConfig.from_node_config(config)
    if migration is not None and not isinstance(node, RaftNode):
        raise ConfigError("zookeeper.metadata.migration.enable=true needs quorum.engine=raftka")
    handler = QuorumRequestHandler(node, controller, authorizer_config(config.raw))
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        await nursery.start(controller.run)
        if migration is not None:  # KIP-866: this controller migrates a ZooKeeper-mode cluster
            await nursery.start(MigrationDriver(node, controller, migration).run)
        elif isinstance(node, RaftNode):  # finalizes a migration, if the log is in one
            nursery.start_soon(MigrationFinalizer(node, controller).run)
        server = await nursery.start(functools.partial(
            serve, handler, bind_host, port, apis=handler.apis,
            request_max_bytes=config.socket_request_max_bytes,
            connections_max_idle_ms=config.connections_max_idle_ms,
            listener_name=config.controller_listener[0],
            security=controller_listener_security(config.raw, config.controller_listener),
            scram_lookup=scram_lookup(node)))
        endpoint = metrics_endpoint(config.raw)
        if endpoint is not None:
            registry = new_registry()
            registry.register(raft_collector(node))
            registry.register(controller_collector(node))
            await nursery.start(functools.partial(serve_metrics, registry, *endpoint))
        nursery.start_soon(_stop_on_signals, nursery.cancel_scope, node)
        _log.info("controller %d of cluster %s serving on %s:%d", config.node_id, cluster_id, host, server.port)
        # A controller-only node reads no broker keys; those in a file
        # shared with brokers are not typos.
        if isinstance(config.raw, Properties):
            config.raw.read_keys.update(k for k in config.raw.keys() if k.startswith(BROKER_KEY_PREFIXES))
        warn_unread_keys(config.raw)
        print(f"READY node={config.node_id} controller={host}:{server.port}", flush=True)
        task_status.started(server.port)


async def _stop_on_signals(cancel_scope: trio.CancelScope, node: RaftNode | PysyncobjNode) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            _log.info("received %s: shutting down", signal.Signals(signum).name)
            if node.is_leader:
                with trio.move_on_after(RESIGN_GRACE_S):
                    await node.resign()
                    await trio.sleep(0.1)  # let the EndQuorumEpoch requests leave
            cancel_scope.cancel()
            return
