"""One broker process: `process.roles=broker` or the combined `broker,controller`.

`run_broker(config)` checks the log dirs (`meta.properties` must name one
cluster and this node: `raftka storage format` writes it), then starts, in
one nursery:

- the `RaftNode` of `__cluster_metadata` in `<log.dirs[0]>/__cluster_metadata-0`:
  an observer on a broker-only node, a voter on a combined one (with the
  `ControllerService` and the controller listener at this node's address in
  `controller.quorum.voters`, as `raftka controller` runs them);
- the `Broker` on `listeners`, with a `QuorumControllerChannel` to the
  active controller; it registers `advertised.listeners` (default: the
  listener, a wildcard host replaced by this machine's name), which is
  where clients are sent;
- the `BrokerQuorumLink`: first image once caught up, registration,
  heartbeats.

The controller listener opens at once: the quorum elects through it and the
broker registers through it. The Kafka listener is bound at once (its port
is registered) but listens only once the controller has unfenced the broker
and the broker's own image lists it, as Kafka opens its client listeners
only once the broker has caught up and is unfenced: until then a client's
connect is refused and it retries, and the first connection that is
accepted gets a Metadata answer that names this broker. The node then
prints `READY node=<id> broker=<host>:<port>` (plus ` controller=<host>:<port>`
on a combined node).

SIGTERM or SIGINT stop it cleanly: controlled shutdown (bounded by
`raftka.controlled.shutdown.timeout.ms`; unset, by `broker.session.timeout.ms`
counted from the last time leaderships moved off the broker, so that a move
of 100,000 partitions in batches finishes), the logs closed
with their checkpoints and clean-shutdown marker, then a leading voter
hands over (EndQuorumEpoch) and the node stops.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import signal
import socket
from collections.abc import Callable, Sequence
from typing import Any

import trio

from broker.shell.broker import Broker
from broker.config import BrokerConfig
from broker.core.lifecycle import ListenerSpec
from broker.shell.metrics import BrokerMetrics
from broker.shell.quorum_link import BrokerQuorumLink, QuorumControllerChannel
from common.security.acl import authorizer_config
from common.metrics import metrics_endpoint, new_registry, serve_metrics
from quorum.node.metrics import controller_collector, raft_collector
from quorum.controller import ControllerConfig
from quorum.node.controller_client import ControllerClient
from quorum.metadata import features
from quorum.node.controller_service import ControllerService
from quorum.node.bootstrap import read_bootstrap
from quorum.node.driver import RaftNode
from quorum.node.syncobj_node import PysyncobjNode
from quorum.process import dynamic_quorum, make_quorum_node, quorum_engine
from quorum.node.handler import QuorumRequestHandler
from quorum.node.metadata_log import DEFAULT_SEGMENT_BYTES
from quorum.process import RESIGN_GRACE_S, check_log_dirs, quorum_config, scram_lookup
from common.clock import node_wall_clock
from common.security import controller_listener_security
from common.security.client import controller_client_security
from common.config import (SECURITY_PROTOCOLS, NodeConfig, broker_listeners, int_property, parse_listeners,
                           warn_unread_keys)
from common.errors import ConfigError
from common.wire import ConnectionPool, serve

_log = logging.getLogger("broker.process")


def advertised_listeners(config: NodeConfig, bound_ports: dict[str, int]) -> tuple[ListenerSpec, ...]:
    """The endpoints registered for clients, one per broker listener (the
    first is the inter-broker and READY one unless `inter.broker.listener.name`
    says otherwise): its entry in `advertised.listeners` if there is one,
    else the listener itself. A wildcard host becomes this machine's name,
    as Kafka advertises it; port 0 the bound port."""
    advertised = {name: (host, port) for name, host, port
                  in parse_listeners(config.raw.get("advertised.listeners") or ",".join(
                      f"{name}://:0" for name in bound_ports), "advertised.listeners")}
    unknown = sorted(set(advertised) - set(bound_ports))
    if unknown and config.raw.get("advertised.listeners"):
        raise ConfigError(f"advertised.listeners names {', '.join(unknown)}, which is not a broker listener in "
                          f"listeners ({', '.join(bound_ports)}): advertise only listeners the broker has")
    listeners = {listener.name: listener for listener in broker_listeners(config.raw)}
    out = []
    for name, bound_port in bound_ports.items():
        host, port = advertised.get(name, ("", 0))
        if not host and name in listeners:
            host = listeners[name].host
        if host in ("", "0.0.0.0", "::"):
            host = socket.getfqdn()
        protocol = SECURITY_PROTOCOLS[listeners[name].security_protocol] if name in listeners else 0
        out.append(ListenerSpec(name, host, port or bound_port, protocol))
    return tuple(out)


def advertised_listener(config: NodeConfig, bound_port: int) -> ListenerSpec:
    """The first broker listener's advertised endpoint (ZooKeeper mode registers one)."""
    assert config.listener is not None
    return advertised_listeners(config, {config.listener[0]: bound_port})[0]


@dataclasses.dataclass(frozen=True)
class NodeReady:
    """What a node says once it serves: its broker address (and controller's)."""

    node_id: int
    host: str
    port: int
    controller: str | None = None

    @property
    def line(self) -> str:
        line = f"READY node={self.node_id} broker={self.host}:{self.port}"
        return line if self.controller is None else f"{line} controller={self.controller}"


async def run_broker(
    config: NodeConfig,
    *,
    handle_signals: bool = True,
    on_ready: Callable[[NodeReady], None] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker (or combined) node until SIGTERM/SIGINT, or until cancelled
    (an abrupt stop: no controlled shutdown). Starts with the bound broker port."""
    if config.zk_mode:
        # ZooKeeper mode: the same broker, its metadata from a ZooKeeper-elected controller.
        from broker.shell.zk_link import run_zk_broker

        await run_zk_broker(config, handle_signals=handle_signals, on_ready=on_ready, task_status=task_status)
        return
    if not config.is_broker:
        raise ConfigError(f"process.roles={','.join(sorted(config.process_roles))}: `raftka broker` needs "
                          "process.roles=broker or broker,controller; run controllers with `raftka controller`")
    cluster_id = check_log_dirs(config)
    broker_config = BrokerConfig.from_properties(config.raw, cluster_id=cluster_id)
    quorum = quorum_config(config)
    heartbeat_interval_ms = config.broker_heartbeat_interval_ms
    if heartbeat_interval_ms >= config.broker_session_timeout_ms:
        raise ConfigError(f"broker.heartbeat.interval.ms={heartbeat_interval_ms} must be below "
                          f"broker.session.timeout.ms={config.broker_session_timeout_ms}, or the controller "
                          "fences the broker between two heartbeats")
    shutdown_timeout_ms = int_property(config.raw, "raftka.controlled.shutdown.timeout.ms",
                                       config.broker_session_timeout_ms, 0)
    # Unset, the timeout counts from the last leadership moved off, so a
    # broker leading 100,000 partitions waits for every batch of the move.
    extend_shutdown = "raftka.controlled.shutdown.timeout.ms" not in config.raw
    # TLS and SASL of this node's links to the controllers (the controller listener's protocol).
    client_security = controller_client_security(config.raw)
    node: RaftNode | PysyncobjNode
    if config.is_controller and quorum_engine(config) == "pysyncobj":  # a combined node on pysyncobj's Raft
        node = make_quorum_node(config, cluster_id)
    else:
        node = RaftNode(node_id=config.node_id, voters=config.controller_quorum_voters, log_dir=config.log_dirs[0],
                        cluster_id=cluster_id, config=quorum, client_security=client_security,
                        bootstrap_servers=config.controller_quorum_bootstrap_servers,
                        segment_bytes=int_property(config.raw, "metadata.log.segment.bytes", DEFAULT_SEGMENT_BYTES,
                                                   1024))

    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        controller_port = None
        if config.is_controller:
            controller = ControllerService(node, ControllerConfig.from_node_config(config, cluster_id),
                                           random.Random(), read_bootstrap(config.log_dirs[0]))
            await nursery.start(controller.run)
            handler = QuorumRequestHandler(node, controller, authorizer_config(config.raw))
            assert config.controller_listener is not None
            _name, host, port = config.controller_listener
            controller_server = await nursery.start(functools.partial(
                serve, handler, host, port, apis=handler.apis,
                request_max_bytes=config.socket_request_max_bytes,
                connections_max_idle_ms=config.connections_max_idle_ms,
                log=logging.getLogger("quorum.server"), listener_name=config.controller_listener[0],
                security=controller_listener_security(config.raw, config.controller_listener),
                scram_lookup=scram_lookup(node)))
            controller_port = controller_server.port

        pool = ConnectionPool(nursery, client_id=f"raftka-broker-{config.node_id}",
                              connect_timeout_ms=quorum.controller_quorum_request_timeout_ms,
                              security=client_security)
        client = ControllerClient(pool, node.voter_addresses,
                                  voter_addresses=lambda: node.voter_addresses,
                                  leader_hint=lambda: node.leader.leader_id,
                                  request_timeout_ms=quorum.controller_quorum_request_timeout_ms,
                                  retry_backoff_ms=quorum.controller_quorum_retry_backoff_ms)
        broker = Broker(broker_config, QuorumControllerChannel(client),
                        clock_ms=node_wall_clock(config.raw, config.log_dirs[0]))
        def follow_kraft_version(_image=None, _delta=None) -> None:
            # KIP-853: ApiVersions says kraft.version 1 once the quorum is dynamic
            # (from the start, or after `raftka features upgrade --feature kraft.version=1`).
            if dynamic_quorum(config, node) and broker.apis.finalized_features != dynamic_features:
                broker.apis.finalized_features = dynamic_features

        dynamic_features = features.finalized_features(features.KRAFT_VERSION_DYNAMIC)
        follow_kraft_version()
        node.subscribe(follow_kraft_version)
        await start_metrics(nursery, config, broker=broker, node=node)
        link = BrokerQuorumLink(node, broker, client, cluster_id=cluster_id,
                                heartbeat_interval_ms=heartbeat_interval_ms,
                                heartbeat_timeout_ms=max(heartbeat_interval_ms,
                                                         quorum.controller_quorum_request_timeout_ms))
        link.extend_shutdown_while_moving = extend_shutdown
        broker_scope = trio.CancelScope()
        broker_stopped = trio.Event()

        async def serve_broker(task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with broker_scope:
                    await broker.run(listen=False, task_status=task_status)
            finally:
                broker_stopped.set()

        server = await nursery.start(serve_broker)
        all_advertised = advertised_listeners(config, {name: s.port for name, s in broker.servers.items()})
        advertised = next(a for a in all_advertised if a.name == broker_config.inter_broker_listener)
        link_scope = trio.CancelScope()

        async def run_link(task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
            with link_scope:
                await link.run(all_advertised, task_status=task_status)

        await nursery.start(run_link)
        if handle_signals:
            nursery.start_soon(_stop_on_signals, nursery.cancel_scope, link, broker_scope, broker_stopped,
                               link_scope, node, shutdown_timeout_ms / 1000)
        await link.wait_serving()
        # Only now: a client that connected earlier would get a Metadata answer
        # without this broker or a controller, which librdkafka's AdminClient
        # waits on for its whole request timeout before asking again.
        for listener_server in broker.servers.values():
            listener_server.open()
        controller_host = (config.controller_quorum_voters.get(config.node_id, (config.controller_listener[1],))[0]
                           if config.is_controller and config.controller_listener is not None else "")
        ready = NodeReady(config.node_id, advertised.host, advertised.port,
                          None if controller_port is None else f"{controller_host}:{controller_port}")
        _log.info("%s (cluster %s)", ready.line, cluster_id)
        # Every component has read its keys by now: the rest are typos or
        # keys raftka does not implement.
        warn_unread_keys(config.raw)
        if on_ready is not None:
            on_ready(ready)
        task_status.started(server.port)


async def start_metrics(nursery: trio.Nursery, config: NodeConfig, *, broker: Broker | None = None,
                        node: Any = None, collectors: Sequence[Any] = ()) -> int | None:
    """Serve this node's metrics on `metrics.port` (when set): the broker's,
    the Raft node's, the controller's on a voter, and `collectors` (a
    ZooKeeper-mode broker's controller). The bound port, or None."""
    endpoint = metrics_endpoint(config.raw)
    if endpoint is None:
        return None
    registry = new_registry()
    if broker is not None:
        metrics = BrokerMetrics(broker)
        # The instance attribute shadows the method: `Broker.run` serves this one.
        broker.handle = metrics.instrument(broker.handle)
        registry.register(metrics.collector())
    if node is not None:
        registry.register(raft_collector(node))
        if config.is_controller:
            registry.register(controller_collector(node))
    for collector in collectors:
        registry.register(collector)
    return await nursery.start(functools.partial(serve_metrics, registry, *endpoint))


async def controlled_shutdown_on_signal(link: Any, shutdown_timeout_s: float,
                                        stop: trio.Event | None = None) -> None:
    """Wait for SIGTERM or SIGINT (or `stop`: every log dir failed), then run
    `link.controlled_shutdown`; a second signal cuts it short. Shared by
    both metadata modes' brokers."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as waiting:
            async def on_signal() -> None:
                async for signum in signals:
                    _log.info("received %s: shutting down", signal.Signals(signum).name)
                    break
                waiting.cancel_scope.cancel()

            async def on_stop() -> None:
                if stop is not None:
                    await stop.wait()
                    _log.info("every log dir is offline: shutting down")
                    waiting.cancel_scope.cancel()

            waiting.start_soon(on_signal)
            waiting.start_soon(on_stop)
        async with trio.open_nursery() as nursery:
            async def second_signal() -> None:
                async for signum in signals:
                    _log.warning("received %s again: stopping without waiting", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(second_signal)
            await link.controlled_shutdown(shutdown_timeout_s)
            nursery.cancel_scope.cancel()


async def _stop_on_signals(cancel_scope: trio.CancelScope, link: BrokerQuorumLink, broker_scope: trio.CancelScope,
                           broker_stopped: trio.Event, link_scope: trio.CancelScope, node: RaftNode,
                           shutdown_timeout_s: float) -> None:
    await controlled_shutdown_on_signal(link, shutdown_timeout_s, link.broker.all_dirs_offline)
    # Stop serving and close the logs cleanly (Broker.run does on cancel),
    # then stop heartbeating, then leave the quorum.
    broker_scope.cancel()
    await broker_stopped.wait()
    link_scope.cancel()
    if node.is_leader:
        with trio.move_on_after(RESIGN_GRACE_S):
            await node.resign()
            await trio.sleep(0.1)  # let the EndQuorumEpoch requests leave
    cancel_scope.cancel()
