"""A broker in ZooKeeper mode (I/O shell): metadata from a controller elected in ZooKeeper.

Theory of operation
-------------------
Everything but the metadata source is the KRaft broker's: the same `Broker`
(replication, storage, handlers), the same `on_metadata_update(image)` door.
`run_zk_broker` (chosen by `broker.shell.process.run_broker` when the config has
`zookeeper.connect` and no `process.roles`) assembles, in one nursery:

- a kazoo session (`zookeeper.session.timeout.ms`, connected within
  `zookeeper.connection.timeout.ms`); the persistent paths and `/cluster/id`;
  each log dir's `meta.properties` in Kafka's ZooKeeper-mode form
  (`version=0`, `broker.id`, `cluster.id`), written on first start;
- the `Broker`, whose `ControllerChannel` is `ZkBrokerChannel`: admin requests
  and its leaders' ISR changes become znode writes, as a Kafka ZooKeeper-mode
  broker does them;
- `BrokerZkLink`: the control-plane listener, where the controller's
  LeaderAndIsr / StopReplica / UpdateMetadata (api 4/5/6) arrive. kio has no
  schemas for them, so they get their own small listener (`CONTROL_PLANE`,
  the name of Kafka's KIP-291 control-plane listener, on an ephemeral port
  unless `listeners` names one), registered in `/brokers/ids/<id>` next to
  the client listener. Each request goes to `ZkMetadataCache`; the images
  it builds are published to the broker once the cache lists this broker as
  live (the controller's first UpdateMetadata to it lists every partition,
  so the first image is complete, as `LogManager.load` needs);
- the registration (`/brokers/ids/<id>`, ephemeral) and this broker's
  `ZkController` candidate (elected through `/controller`, fenced by
  `/controller_epoch`; its requests go out on the brokers' `CONTROL_PLANE`).

Topic configs are not in controller requests: the link reads
`/config/topics/<t>` before publishing an image with a new topic, and again
for the topics each `/config/changes` notification names.

**Controlled shutdown** (SIGTERM): the broker deletes its own registration.
The controller (itself, if it holds `/controller`) treats that as the
broker leaving: leaders move to other ISR members and the broker leaves the
ISRs, without waiting for the session to expire (what Kafka's
ControlledShutdown request asks for). The broker keeps serving until
ZooKeeper shows none of its partitions led by it while another ISR member
could lead (bounded by `raftka.controlled.shutdown.timeout.ms`, default
`zookeeper.session.timeout.ms`), then resigns `/controller` if it held it,
closes its logs and ends its session.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from broker.shell.broker import Broker
from common.clock import node_wall_clock
from broker.config import BrokerConfig
from broker.shell.controller_channel import ControllerUnavailableError
from broker.core.lifecycle import ListenerSpec
from broker.shell.process import NodeReady, advertised_listener, controlled_shutdown_on_signal, start_metrics
from quorum.controller.config import ControllerConfig
from quorum.metadata.records import Endpoint
from quorum.zookeeper import messages as m
from quorum.zookeeper import store
from quorum.zookeeper.broker_channel import ZkBrokerChannel
from quorum.zookeeper.broker_metadata import ZkMetadataCache
from quorum.zookeeper.broker_side import (
    BrokerIdInUseError,
    ZkBrokerRegistration,
    ensure_cluster_paths,
    get_or_create_cluster_id,
)
from quorum.zookeeper.channel import ControllerChannelManager
from quorum.node.metrics import zk_controller_collector
from quorum.zookeeper.controller import ZkController
from quorum.zookeeper.decisions import ZkControllerConfig
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition
from common.config import NodeConfig, int_property, parse_listener
from common.errors import ConfigError, RaftkaError
from common.meta_properties import META_PROPERTIES, read_meta, write_meta
from broker.shell.authorizer import CLUSTER
from common.security.acl import Operation, ResourceType
from common.security.tls import subject_dn
from common.wire.connection import ConnectionContext
from common.wire.authenticate import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY, SaslGate
from common.wire.codec import decode_request
from common.wire.errors import RemoteProtocolError
from common.wire.framing import FrameBuffer
from common.wire.listeners import listen_tcp

_log = logging.getLogger("broker.zk_link")


def _sasl_api(api_key: int, version: int) -> bool:
    """What an unauthenticated control-plane connection may send: SaslHandshake v1 and
    SaslAuthenticate (the raw tokens of SaslHandshake v0 are not served here)."""
    return (api_key, version) in ((SASL_HANDSHAKE_KEY, 1), (SASL_AUTHENTICATE_KEY, 0), (SASL_AUTHENTICATE_KEY, 1),
                                  (SASL_AUTHENTICATE_KEY, 2))


def _cluster_authorization_failed(request: m.ControllerRequest) -> m.ControllerResponse:
    error = ErrorCode.cluster_authorization_failed
    if isinstance(request, m.LeaderAndIsrRequest):
        return m.LeaderAndIsrResponse(error_code=error, topics=())
    if isinstance(request, m.StopReplicaRequest):
        return m.StopReplicaResponse(error_code=error, partition_errors=())
    return m.UpdateMetadataResponse(error_code=error)


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"

CONTROL_PLANE_LISTENER = "CONTROL_PLANE"
#: How often the `/config/changes` watch is re-armed even without a firing.
CONFIG_RECHECK_S = 5.0


class _ZkControllerChannel:
    """`ZkBrokerChannel` with ZooKeeper outages reported the way the broker's handlers expect."""

    def __init__(self, channel: ZkBrokerChannel) -> None:
        self.channel = channel

    async def send(self, request: Any) -> Any:
        try:
            return await self.channel.send(request)
        except KazooException as exc:
            raise ControllerUnavailableError(f"ZooKeeper did not answer: {type(exc).__name__}") from exc


class ZooKeeperUnreachableError(RaftkaError):
    """No ZooKeeper server of `zookeeper.connect` answered within `zookeeper.connection.timeout.ms`.
    Start the ensemble (or fix the address) and start the broker again."""


# --- meta.properties ------------------------------------------------------------------------


def check_zk_log_dirs(config: NodeConfig, cluster_id: str) -> None:
    """Each log dir's `meta.properties` in Kafka's ZooKeeper-mode form, written if missing.

    Kafka's ZooKeeper-mode broker writes `version=0`, `broker.id` and the
    cluster id it found in ZooKeeper; a KRaft `version=1` file (`node.id`) is
    accepted too, so a migrated broker can be rolled back. A file for another
    broker or cluster is refused."""
    for d in config.log_dirs:
        path = Path(d) / META_PROPERTIES
        meta = read_meta(d)
        if meta is None:
            write_meta(d, f"version=0\nbroker.id={config.node_id}\ncluster.id={cluster_id}\n")
            continue
        owner = meta.get("broker.id", meta.get("node.id"))
        if owner != str(config.node_id):
            raise ConfigError(f"{path} belongs to broker {owner}, but this is broker.id={config.node_id}: point "
                              "log.dirs at this broker's own directory, or fix broker.id")
        if meta.get("cluster.id") not in (None, cluster_id):
            raise ConfigError(f"{path} says cluster.id={meta.get('cluster.id')} but ZooKeeper "
                              f"({config.zookeeper_connect}) holds cluster {cluster_id}: the dir belongs to "
                              "another cluster; use an empty dir or the right zookeeper.connect")


# --- the control plane ----------------------------------------------------------------------


class BrokerZkLink:
    """Controller requests in, images out; registration and the controller candidate."""

    def __init__(self, zk: KazooClient, broker: Broker, config: NodeConfig) -> None:
        self.zk = zk
        self.broker = broker
        self.config = config
        self.cache = ZkMetadataCache(broker.node_id)
        self.registration: ZkBrokerRegistration | None = None
        self.controller: ZkController | None = None
        self.published = False
        self._configs_loaded: set[str] = set()
        self._progress = trio.Event()
        self._config_change = trio.Event()
        self._controller_scope = trio.CancelScope()
        self._token: trio.lowlevel.TrioToken | None = None

    def _control_plane_bind(self) -> tuple[str, int]:
        for item in self.config.raw.get("listeners", "").split(","):
            if item.strip().startswith(f"{CONTROL_PLANE_LISTENER}://"):
                _name, host, port = parse_listener(item.strip())
                return host, port
        return self.broker.config.host, 0

    async def run(self, advertised: ListenerSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        self._token = trio.lowlevel.current_trio_token()
        host, port = self._control_plane_bind()
        async with trio.open_nursery() as nursery:
            listeners = await listen_tcp(port, host)
            await nursery.start(trio.serve_listeners, self._serve_connection, listeners)
            control_port = listeners[0].socket.getsockname()[1]
            info = BrokerInfo(self.broker.node_id, (
                Endpoint(advertised.name, advertised.host, advertised.port, 0),
                Endpoint(CONTROL_PLANE_LISTENER, advertised.host, control_port, 0)), self.broker.config.rack)
            self.registration = ZkBrokerRegistration(self.zk, info, on_epoch=self._on_epoch)
            await self._register(self.registration)
            # The controller may have answered the registration before `on_epoch` ran.
            await self._publish()
            # The controller's requests travel as the inter-broker listener says (TLS, SASL login),
            # as this broker's replica fetchers do; each broker's control plane checks the same way.
            sender = ControllerChannelManager(nursery, CONTROL_PLANE_LISTENER,
                                              client_id=f"raftka-controller-{self.broker.node_id}",
                                              security=self.broker.config.inter_broker_security)
            unclean = self.config.raw.get("unclean.leader.election.enable", "false").lower() == "true"

            def on_change(active: bool, epoch: int) -> None:
                if not active:  # a resigned controller's queued requests are stale: drop them
                    sender.close()

            self.controller = ZkController(self.zk, ZkControllerConfig(
                self.broker.node_id, inter_broker_listener_name=advertised.name,
                unclean_leader_election_enable=unclean), sender, on_change=on_change)
            await nursery.start(self._run_controller)
            nursery.start_soon(self._watch_config_changes)
            task_status.started()

    async def _register(self, registration: ZkBrokerRegistration) -> None:
        """Register; while a previous process of this broker (killed, its session not yet
        expired) still holds the id, retry until its session must have expired."""
        deadline = trio.current_time() + 2 * self.config.zookeeper_session_timeout_ms / 1000
        while True:
            try:
                await trio.to_thread.run_sync(registration.start)
                return
            except BrokerIdInUseError as exc:
                if trio.current_time() > deadline:
                    raise
                _log.info("broker %d: %s; retrying until that session expires", self.broker.node_id, exc)
                await trio.sleep(0.25)

    def _on_epoch(self, epoch: int) -> None:
        # kazoo's thread, on every (re-)registration; an int store is atomic.
        self.cache.broker_epoch = epoch

    async def _run_controller(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.controller is not None
        with self._controller_scope:
            await self.controller.run(task_status=task_status)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        """One controller connection: requests in, answered in order. It is secured as the
        inter-broker listener is (TLS handshake, then SaslHandshake and SaslAuthenticate
        before any controller request), so only a node with that listener's credentials
        can move this broker's leaders."""
        frames = FrameBuffer(self.config.socket_request_max_bytes)
        security = self.broker.config.listener_security.get(self.broker.config.inter_broker_listener)
        peer = _peer(stream)
        conn: trio.abc.Stream = stream
        gate: SaslGate | None = None
        principal = "User:ANONYMOUS"
        allowed: bool | None = None  # asked of the authorizer at the first controller request
        # An unauthenticated connection gets connections.max.idle.ms to finish its handshakes.
        login_deadline = trio.current_time() + self.broker.config.connections_max_idle_ms / 1000
        try:
            if security is not None and security.tls is not None:
                conn = trio.SSLStream(stream, security.tls, server_side=True)
                with trio.move_on_at(login_deadline) as login_scope:
                    try:
                        await conn.do_handshake()
                    except trio.BrokenResourceError as exc:
                        _log.warning("broker %d: control-plane TLS handshake from %s failed: %s",
                                     self.broker.node_id, peer, exc.__cause__ or exc)
                        return
                if login_scope.cancelled_caught:
                    _log.warning("broker %d: control-plane TLS handshake from %s did not finish within "
                                 "connections.max.idle.ms; closed", self.broker.node_id, peer)
                    return
                cert = conn.getpeercert()
                if cert:  # mutual TLS names the principal, as on the broker's listeners
                    principal = "User:" + security.principal_mapper.name(subject_dn(cert))
            if security is not None and security.sasl is not None:
                gate = SaslGate(security.sasl, self.broker.scram_credential, peer, _log)
            while True:
                logging_in = gate is not None and gate.state != "done"
                with trio.move_on_at(login_deadline if logging_in else math.inf) as login_scope:
                    data = await conn.receive_some(65536)
                if login_scope.cancelled_caught:
                    _log.warning("broker %d: control-plane connection from %s did not log in within "
                                 "connections.max.idle.ms; closed", self.broker.node_id, peer)
                    return
                if not data:
                    return
                for frame in frames.feed(data):
                    if gate is not None and gate.state != "done":
                        # SaslHandshake v1 and SaslAuthenticate only; anything else closes the connection.
                        await conn.send_all(gate.answer(decode_request(frame, _sasl_api)))
                        continue
                    header, request = m.decode_request(frame)
                    if allowed is None:
                        allowed = self._may_control(gate.principal if gate is not None and gate.principal
                                                    else principal, peer)
                    if not allowed:
                        await conn.send_all(m.encode_response(header.correlation_id, _cluster_authorization_failed(
                            request)))
                        continue
                    response = self.cache.handle(request)
                    await self._publish()
                    await conn.send_all(m.encode_response(header.correlation_id, response))
        except RemoteProtocolError as exc:
            _log.warning("broker %d: closing a control-plane connection from %s: %s", self.broker.node_id, peer,
                         exc)
        except KazooException as exc:
            # Unanswered: the controller sends the request again on a new connection.
            _log.info("broker %d: ZooKeeper unavailable while applying a controller request (%s)",
                      self.broker.node_id, type(exc).__name__)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(conn)

    def _may_control(self, principal: str, peer: str) -> bool:
        """ClusterAction on the cluster, as Kafka checks for LeaderAndIsr, StopReplica and
        UpdateMetadata (always, without an authorizer); a denial is logged by the authorizer."""
        ctx = ConnectionContext(0, peer, CONTROL_PLANE_LISTENER, principal)
        if self.broker.authorizer.allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER):
            return True
        _log.warning("broker %d: refusing controller requests from %s (%s): it lacks ClusterAction on the cluster; "
                     "make the brokers' principal a super user (super.users) or grant it ClusterAction",
                     self.broker.node_id, peer, principal)
        return False

    # --- metadata in -------------------------------------------------------------------------

    def _listed_live(self) -> bool:
        me = self.cache.image.brokers.get(self.broker.node_id)
        return me is not None and not me.fenced and self.cache.broker_epoch >= 0

    async def _publish(self) -> None:
        """Hand the cache's image to the broker (once it is complete), new topics' configs first."""
        new_topics = set(self.cache.image.topic_ids_by_name) - self._configs_loaded
        if new_topics:
            configs = await trio.to_thread.run_sync(store.read_topic_configs, self.zk, new_topics)
            self.cache.apply_topic_configs(configs)
            self._configs_loaded |= new_topics
        self._configs_loaded &= set(self.cache.image.topic_ids_by_name)
        if not self.published and not self._listed_live():
            return
        if self.cache.image.offset > self.broker.image.offset or not self.published:
            if not self.published:
                _log.info("broker %d: first image from controller epoch %d: %r", self.broker.node_id,
                          self.cache.controller_epoch, self.cache.image)
            self.broker.on_metadata_update(self.cache.image)
            self.published = True
        self._progress.set()
        self._progress = trio.Event()

    def _config_watch(self, _event: object) -> None:
        try:
            trio.from_thread.run_sync(self._config_change.set, trio_token=self._token)
        except trio.RunFinishedError:
            pass

    async def _watch_config_changes(self) -> None:
        """Re-read the configs each `/config/changes` notification names. A watch set in a
        session that expired is gone, so the children are also re-read (re-arming the
        watch) every CONFIG_RECHECK_S, and after any ZooKeeper error."""
        last: str | None = None
        first = True
        while True:
            try:
                last, topics = await trio.to_thread.run_sync(store.read_config_changes, self.zk, last,
                                                             self._config_watch)
                topics &= self._configs_loaded
                if topics and not first:
                    self.cache.apply_topic_configs(await trio.to_thread.run_sync(
                        store.read_topic_configs, self.zk, topics))
                    await self._publish()
                first = False
            except KazooException as exc:
                _log.info("broker %d: reading /config/changes failed (%s); retrying", self.broker.node_id,
                          type(exc).__name__)
                await trio.sleep(0.5)
                continue
            with trio.move_on_after(CONFIG_RECHECK_S):
                await self._config_change.wait()
            self._config_change = trio.Event()

    # --- waiting and leaving -------------------------------------------------------------------

    def is_serving(self) -> bool:
        """Published, and this broker's own image lists it live (its Metadata names it)."""
        me = self.broker.image.brokers.get(self.broker.node_id)
        return self.published and me is not None and not me.fenced

    async def wait_serving(self) -> None:
        while not self.is_serving():
            with trio.move_on_after(0.05):
                await self._progress.wait()

    def _led_here(self) -> list[NamedPartition]:
        """Partitions this broker leads (in its image) that another ISR member could lead."""
        image = self.broker.image
        return [NamedPartition(image.topics_by_id[tp.topic_id].name, tp.partition)
                for tp, reg in image.partitions_of_broker(self.broker.node_id)
                if tp.topic_id in image.topics_by_id and reg.leader == self.broker.node_id and len(reg.isr) > 1]

    def _still_leading(self, tps: list[NamedPartition]) -> list[NamedPartition]:
        """Those of `tps` ZooKeeper says this broker still leads while another ISR member could."""
        states = store.read_partition_states(self.zk, tps)
        return [tp for tp, s in states.items() if s.leader == self.broker.node_id and len(s.isr) > 1]

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Leave the cluster before stopping (see the module docstring); whether the leaders moved in time."""
        registration = self.registration
        if registration is None:
            return True
        _log.info("broker %d: controlled shutdown: deregistering", self.broker.node_id)
        moved = False
        start = trio.current_time()
        with trio.move_on_after(timeout_s):
            try:
                await trio.to_thread.run_sync(registration.stop)
            except KazooException as exc:  # the session is gone, and the registration with it
                _log.info("broker %d: deregistering failed (%s)", self.broker.node_id, type(exc).__name__)
            leading = self._led_here()
            while True:
                try:
                    leading = await trio.to_thread.run_sync(self._still_leading, leading)
                except KazooException as exc:
                    _log.info("broker %d: controlled shutdown: ZooKeeper unavailable (%s)", self.broker.node_id,
                              type(exc).__name__)
                if not leading:
                    moved = True
                    _log.info("broker %d: controlled shutdown: leaders moved in %.2f s", self.broker.node_id,
                              trio.current_time() - start)
                    break
                await trio.sleep(0.05)
        if not moved:
            _log.warning("broker %d: controlled shutdown: leaders not moved after %.1f s; stopping anyway",
                         self.broker.node_id, timeout_s)
        self._controller_scope.cancel()
        return moved


# --- the process ------------------------------------------------------------------------------


async def run_zk_broker(
    config: NodeConfig,
    *,
    handle_signals: bool = True,
    on_ready: Callable[[NodeReady], None] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`run_broker` for a ZooKeeper-mode config: serve until SIGTERM/SIGINT (controlled
    shutdown) or cancellation (abrupt). Starts with the bound broker port."""
    assert config.zk_mode and config.zookeeper_connect is not None
    zk = KazooClient(config.zookeeper_connect, timeout=config.zookeeper_session_timeout_ms / 1000)
    try:
        await trio.to_thread.run_sync(zk.start, config.zookeeper_connection_timeout_ms / 1000)
    except KazooTimeoutError:
        raise ZooKeeperUnreachableError(
            f"no ZooKeeper server at zookeeper.connect={config.zookeeper_connect} answered within "
            f"zookeeper.connection.timeout.ms={config.zookeeper_connection_timeout_ms}: start ZooKeeper or fix "
            "the address") from None
    try:
        await trio.to_thread.run_sync(ensure_cluster_paths, zk)
        cluster_id = await trio.to_thread.run_sync(get_or_create_cluster_id, zk)
        check_zk_log_dirs(config, cluster_id)
        await _serve(zk, config, cluster_id, handle_signals, on_ready, task_status)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(zk.stop)
            await trio.to_thread.run_sync(zk.close)


async def _serve(zk: KazooClient, config: NodeConfig, cluster_id: str, handle_signals: bool,
                 on_ready: Callable[[NodeReady], None] | None, task_status: trio.TaskStatus[int]) -> None:
    broker_config = BrokerConfig.from_properties(config.raw, cluster_id=cluster_id)
    shutdown_timeout_ms = int_property(config.raw, "raftka.controlled.shutdown.timeout.ms",
                                       config.zookeeper_session_timeout_ms, 0)
    controller_config = ControllerConfig.from_node_config(config, cluster_id)
    broker: Broker

    def image():
        return broker.image

    broker = Broker(broker_config, _ZkControllerChannel(ZkBrokerChannel(zk, config.node_id, image,
                                                                        controller_config)),
                    clock_ms=node_wall_clock(config.raw, config.log_dirs[0]))
    link = BrokerZkLink(zk, broker, config)
    async with trio.open_nursery() as nursery:
        broker_scope = trio.CancelScope()
        broker_stopped = trio.Event()

        async def serve_broker(task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with broker_scope:
                    await broker.run(listen=False, task_status=task_status)
            finally:
                broker_stopped.set()

        await start_metrics(nursery, config, broker=broker, collectors=[zk_controller_collector(link)])
        server = await nursery.start(serve_broker)
        advertised = advertised_listener(config, server.port)
        await nursery.start(link.run, advertised)
        if handle_signals:
            nursery.start_soon(_stop_on_signals, nursery.cancel_scope, link, broker_scope, broker_stopped,
                               shutdown_timeout_ms / 1000)
        await link.wait_serving()
        # The client listener opens only now, as on a KRaft broker (broker.process):
        # the controller's requests come on the control-plane listener, open since `link.run`.
        server.open()
        ready = NodeReady(config.node_id, advertised.host, advertised.port)
        _log.info("%s (ZooKeeper mode, cluster %s)", ready.line, cluster_id)
        if on_ready is not None:
            on_ready(ready)
        task_status.started(server.port)


async def _stop_on_signals(cancel_scope: trio.CancelScope, link: BrokerZkLink, broker_scope: trio.CancelScope,
                           broker_stopped: trio.Event, shutdown_timeout_s: float) -> None:
    await controlled_shutdown_on_signal(link, shutdown_timeout_s)
    broker_scope.cancel()
    await broker_stopped.wait()
    cancel_scope.cancel()
