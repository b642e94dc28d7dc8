"""The broker process's core object: metadata in, Kafka protocol out.

Theory of operation
-------------------
A `Broker` serves the Kafka protocol on one listener (`common.wire.serve`)
and hosts partition replicas (`ReplicaManager` over `LogManager`). It has
exactly two doors to the rest of the cluster:

- **metadata in**: `on_metadata_update(image, delta)`. Whoever follows the
  metadata log (the Raft observer, once wired; `LocalController` in tests)
  calls it with each new immutable `MetadataImage`. The broker swaps its
  image, opens/deletes logs and changes replica roles as the delta says,
  and wakes requests waiting for the image (admin requests waiting to see
  their change; parked fetches and produces). `await publish_metadata(image)`
  is the same door in slices of the event loop's time, for a follower of
  the metadata log that must keep heartbeating through a delta of
  thousands of partitions (`broker.shell.quorum_link`).
- **controller out**: `ControllerChannel.send(request)`, for client admin
  requests (forwarded) and the broker's own AllocateProducerIds.

Request handlers live in `broker.api.produce`, `broker.api.fetch`,
`broker.api.list_offsets`, `broker.api.metadata`, `broker.api.admin`,
`broker.api.find_coordinator`, `broker.shell.coordinator_runtime` (the group
APIs) and `broker.api.txn` (the transaction coordinator's APIs); each is
`async def handle_x(broker, ctx, request)`, except the hot path's
`handle_produce` and `handle_fetch`, which answer at once when they can and
return a coroutine only when they must wait. Beside serving, `run` keeps
the group coordinator (`GroupCoordinatorRuntime`: shards of the
`__consumer_offsets` partitions led here, loaded and unloaded as metadata
changes leadership), the transaction coordinator
(`TransactionCoordinatorRuntime`: shards of the `__transaction_state`
partitions led here, and the sender of transaction markers), the log
cleaner (`broker.shell.cleaner_runtime`) and the periodic passes over the
logs (`broker.shell.log_passes`: checkpoints, retention) going. `run` serves until
cancelled and then shuts down cleanly (checkpoints, `.kafka_cleanshutdown`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator

import trio

from broker.api import (admin, describe_topic_partitions, fetch, find_coordinator, list_offsets,
                        log_admin, offset_topic_ids, produce, txn_markers)
from broker.api import metadata as metadata_api
from broker.shell.cleaner_runtime import run_log_cleaner
from broker.shell.log_passes import run_log_passes
from broker.api.codec import FETCH_MAX_VERSION, FETCH_MIN_VERSION, PRODUCE_MAX_VERSION, PRODUCE_MIN_VERSION
from broker.config import BrokerConfig
from broker.shell.controller_channel import ControllerChannel
from broker.shell.fetch_session import FetchSessionCache
from broker.shell.coordinator_runtime import GroupCoordinatorRuntime, handle_group_request
from broker.core.group import GROUP_API_VERSIONS
from broker.shell.log_dir_mover import LogDirMover
from broker.shell.log_manager import LogManager
from broker.api.metadata_codec import METADATA_MAX_VERSION, METADATA_MIN_VERSION, MetadataEncoder
from broker.shell.replica_fetcher import IsrSender, ReplicaFetchers
from broker.shell.replica_manager import ReplicaManager
from broker.shell.txn_runtime import TransactionCoordinatorRuntime
from broker.api import broker_logger, quorum_admin, quotas, security, txn, txn_verification
from broker.core.client_quotas import ConnectionRateQuota, QuotaEnforcer, connection_quota_for, enforcer_for
from broker.core.replication_quota import (FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS,
                                           ReplicationQuota, replication_quota)
from broker.shell import request_quota
from quorum.metadata.client_quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from broker.shell.authorizer import BrokerAuthorizer, finished
from quorum.metadata import MetadataDelta, MetadataImage, features, image_delta
from quorum.metadata.broker_configs import topic_defaults
from quorum.metadata.image import ConfigResource
from quorum.metadata.records import ConfigResourceType
from common.wire import ConnectionContext, DecodedRequest, Server, SupportedApis, serve
from common.wire.authenticate import (
    SASL_AUTHENTICATE_KEY,
    SASL_AUTHENTICATE_VERSIONS,
    SASL_HANDSHAKE_KEY,
    SASL_HANDSHAKE_VERSIONS,
    answer_without_sasl,
)

_log = logging.getLogger("broker")

#: How long `publish_metadata` works on a delta before it lets the event loop run.
PUBLISH_SLICE_S = 0.02
#: APIs whose v10 names topics by id, served as their v9 twin (broker.api.offset_topic_ids).
TOPIC_ID_APIS = (offset_topic_ids.OFFSET_COMMIT, offset_topic_ids.OFFSET_FETCH)

# api_key: (min version, max version, handler). What the clients negotiate
# (tests/broker/test_kafka4_clients.py): librdkafka 2.16 Produce v10, Fetch
# v16, ListOffsets v7, Metadata v13; kafka-python 3.0 Produce v9, Fetch v12,
# ListOffsets v9, Metadata v13, InitProducerId v4; aiokafka 0.14 Produce v7,
# Fetch v11, ListOffsets v3, Metadata v5, CreateTopics v3. The table of
# docs/architecture.md "Protocol versions" lists them all.
_APIS = {
    0: (PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION, produce.handle_produce),
    1: (FETCH_MIN_VERSION, FETCH_MAX_VERSION, fetch.handle_fetch),
    2: (list_offsets.LIST_OFFSETS_MIN_VERSION, list_offsets.LIST_OFFSETS_MAX_VERSION, list_offsets.handle_list_offsets),
    # librdkafka 2.16 writes its Metadata v9+ "all topics" request with a
    # 4-byte placeholder where a 1-byte null count belongs; the wire layer
    # ignores the trailing bytes, as Kafka does.
    3: (METADATA_MIN_VERSION, METADATA_MAX_VERSION, metadata_api.handle_metadata),
    10: (find_coordinator.FIND_COORDINATOR_MIN_VERSION, find_coordinator.FIND_COORDINATOR_MAX_VERSION,
         find_coordinator.handle_find_coordinator),
    19: (2, 7, admin.handle_create_topics),
    20: (1, 6, admin.handle_delete_topics),
    23: (2, 4, list_offsets.handle_offset_for_leader_epoch),
    32: (1, 4, admin.handle_describe_configs),
    37: (0, 3, admin.handle_create_partitions),
    43: (0, 2, admin.handle_elect_leaders),
    33: (0, 2, admin.handle_alter_configs),
    44: (0, 1, admin.handle_incremental_alter_configs),
    21: (0, 2, log_admin.handle_delete_records),
    34: (1, 2, log_admin.handle_alter_replica_log_dirs),
    35: (1, 4, log_admin.handle_describe_log_dirs),
    45: (0, 0, admin.handle_alter_partition_reassignments),
    46: (0, 0, admin.handle_list_partition_reassignments),
    60: (0, 2, metadata_api.handle_describe_cluster),
    64: (0, 0, admin.handle_unregister_broker),
    55: (0, 2, quorum_admin.handle_describe_quorum),  # forwarded to the active controller, as Kafka's brokers do
    80: (0, 1, quorum_admin.handle_raft_voter_change),  # AddRaftVoter, forwarded (KIP-853)
    81: (0, 0, quorum_admin.handle_raft_voter_change),  # RemoveRaftVoter
    82: (0, 0, quorum_admin.handle_raft_voter_change),  # UpdateRaftVoter
    75: (0, 0, describe_topic_partitions.handle_describe_topic_partitions),
    # SCRAM credentials and ACLs (KIP-554, KIP-801).
    29: (1, 3, security.handle_describe_acls),
    30: (1, 3, security.handle_create_acls),
    31: (1, 3, security.handle_delete_acls),
    50: (0, 0, security.handle_describe_user_scram_credentials),
    51: (0, 0, security.handle_alter_user_scram_credentials),
    # Client quotas (KIP-546).
    48: (0, 1, quotas.handle_describe_client_quotas),
    49: (0, 1, quotas.handle_alter_client_quotas),
    # Answered by the wire server's SASL gate on SASL listeners; here on the others.
    SASL_HANDSHAKE_KEY: (*SASL_HANDSHAKE_VERSIONS, lambda _broker, _ctx, request: answer_without_sasl(request)),
    SASL_AUTHENTICATE_KEY: (*SASL_AUTHENTICATE_VERSIONS,
                            lambda _broker, _ctx, request: answer_without_sasl(request)),
    # The partition side of transactions: markers, producers.
    27: (1, 2, txn_markers.handle_write_txn_markers),
    61: (0, 0, txn_markers.handle_describe_producers),
    # JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
    # DescribeGroups, ListGroups, DeleteGroups, OffsetDelete.
    **{api_key: (lo, hi, handle_group_request) for api_key, (lo, hi) in GROUP_API_VERSIONS.items()},
    # TxnOffsetCommit v4+: verified with (v5: added to) the transaction first.
    28: (*GROUP_API_VERSIONS[28], txn_verification.handle_txn_offset_commit),
    # v10 (topic ids) is served as v9 by the coordinator (broker.api.offset_topic_ids).
    **{api_key: (GROUP_API_VERSIONS[api_key][0], offset_topic_ids.TOPIC_ID_VERSION, handle_group_request)
       for api_key in (offset_topic_ids.OFFSET_COMMIT, offset_topic_ids.OFFSET_FETCH)},
    # InitProducerId (22, with or without a transactional id), AddPartitionsToTxn,
    # AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions.
    **{api_key: (lo, hi, txn.HANDLERS[api_key]) for api_key, (lo, hi) in txn.TXN_API_VERSIONS.items()},
}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        controller: ControllerChannel,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self.controller = controller
        self.clock_ms = clock_ms
        self.image = MetadataImage()
        #: Byte-rate quota enforcers, None while no quota sets their key: the
        #: produce and fetch paths look at one attribute when no quota is set.
        self.produce_quotas: QuotaEnforcer | None = None
        self.fetch_quotas: QuotaEnforcer | None = None
        #: The `request_percentage` enforcer, None while no quota sets it.
        self.request_quotas: QuotaEnforcer | None = None
        #: connection_creation_rate per IP (KIP-612), None while no ip quota is set.
        self.connection_quotas: ConnectionRateQuota | None = None
        #: Replication throttles (leader side, follower side), None while off.
        self.leader_throttle: ReplicationQuota | None = None
        self.follower_throttle: ReplicationQuota | None = None
        self.log_manager = LogManager(config.log_dirs, clock_ms, cleaner_config=config.log_cleaner,
                                      producer_id_expiration_ms=config.producer_id_expiration_ms,
                                      max_open_files=config.log_max_open_files,
                                      disk_fault_file=config.test_disk_fault_file)
        log_defaults = {"max.message.bytes": str(config.message_max_bytes), **config.log_defaults}
        self.replicas = ReplicaManager(config.node_id, self.log_manager, clock_ms, log_defaults,
                                       config.replication)
        #: Replication: follower fetchers, and the leaders' ISR changes to the controller.
        self.fetchers = ReplicaFetchers(self)
        #: Replicas moving between this broker's log dirs (AlterReplicaLogDirs).
        self.log_mover = LogDirMover(self)
        self.metadata_encoder = MetadataEncoder()
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots,
                                                config.min_incremental_fetch_session_eviction_ms)
        self.replicas.on_follow = self.fetchers.follow
        self.isr_sender = IsrSender(self)
        self.apis = SupportedApis()
        for api_key, (lo, hi, _handler) in _APIS.items():
            self.apis.declare(api_key, lo, hi)
        # KIP-584 features in ApiVersions v3+ (`quorum.metadata.features`); the
        # epoch follows the metadata image.
        self.apis.supported_features = features.SUPPORTED_FEATURES
        self.apis.finalized_features = features.FINALIZED_FEATURES
        self.apis.finalized_features_epoch = features.finalized_features_epoch(self.image.offset)
        self._handlers = {api_key: handler for api_key, (_lo, _hi, handler) in _APIS.items()}
        broker_logger.install(self._handlers, config.node_id)  # BROKER_LOGGER configs: answered here
        self._image_changed = trio.Event()
        self._loaded = False
        self._closed = False
        #: The first listener's server; `servers` has every listener's, by name.
        self.server: Server | None = None
        self.servers: dict[str, Server] = {}
        #: Producer ids handed out from the current controller-allocated block.
        self.producer_ids = admin.ProducerIdBlock()
        self.coordinator = GroupCoordinatorRuntime(self, config.group_coordinator)
        self.txn_coordinator = TransactionCoordinatorRuntime(self, config.txn_coordinator)
        self.authorizer = BrokerAuthorizer(self, config.authorizer)
        #: Set once every log dir is offline: the process stops the broker (`broker.shell.process`).
        self.all_dirs_offline = trio.Event()

    # --- metadata in ---------------------------------------------------

    def on_metadata_update(self, image: MetadataImage, delta: MetadataDelta | None = None) -> None:
        """Publish a new metadata image to this broker (the one metadata door).

        `delta` is `image_delta(previous image, image, node_id)`; it is
        computed here when not given. The first call must carry an image
        caught up with the metadata log (as Kafka's broker waits for before
        its first publish): logs of partitions it does not host here are
        moved aside as strays. Must be called from the trio thread.
        """
        steps = self._publish_steps(image, delta)
        if steps is not None:
            for _ in steps:
                pass

    async def publish_metadata(self, image: MetadataImage, slice_s: float = PUBLISH_SLICE_S) -> None:
        """`on_metadata_update`, letting the event loop run every `slice_s`
        of work: heartbeats, the metadata fetch and client requests go on
        while thousands of replicas are created or change role. Replicas not
        reached yet answer as before (NOT_LEADER_OR_FOLLOWER: retriable).
        The caller publishes one image at a time (the quorum link's task)."""
        if not self._loaded and image.offset >= self.image.offset:
            # The log dirs' reads before the first publish, off the event
            # loop and many at once (`LogManager.scan`).
            await trio.to_thread.run_sync(self.log_manager.scan)
        steps = self._publish_steps(image, None)
        if steps is None:
            return
        started = time.monotonic()
        for _ in steps:
            if time.monotonic() - started >= slice_s:
                await trio.sleep(0)
                started = time.monotonic()

    def _publish_steps(self, image: MetadataImage, delta: MetadataDelta | None) -> Iterator[None] | None:
        if image.offset < self.image.offset:
            _log.warning("ignoring metadata image at offset %d older than the current %d",
                         image.offset, self.image.offset)
            return None
        if not self._loaded:
            self.log_manager.load(image, self.node_id)
            self._loaded = True
        if delta is None:
            delta = image_delta(self.image, image, self.node_id)
        configs_changed = image.configs is not self.image.configs
        if image.client_quotas is not self.image.client_quotas:
            self.produce_quotas = enforcer_for(PRODUCER_BYTE_RATE, image.client_quotas, self.produce_quotas)
            self.fetch_quotas = enforcer_for(CONSUMER_BYTE_RATE, image.client_quotas, self.fetch_quotas)
            self.request_quotas = enforcer_for(REQUEST_PERCENTAGE, image.client_quotas, self.request_quotas)
            self.connection_quotas = connection_quota_for(image.client_quotas, self.connection_quotas)
            # A changed or lifted quota holds from the next request on: muted
            # connections read again, and are muted anew if still over.
            for server in self.servers.values():
                for ctx in server.connections.values():
                    ctx.unmute()
        self.image = image
        self.apis.finalized_features_epoch = features.finalized_features_epoch(image.offset)
        return self._publish(image, delta, configs_changed)

    def _publish(self, image: MetadataImage, delta: MetadataDelta, configs_changed: bool) -> Iterator[None]:
        yield from self.replicas.delta_steps(image, delta)
        if configs_changed:
            self.replicas.log_defaults = self.effective_log_defaults(image)
            self.replicas.refresh_topic_configs(image)
            self._refresh_throttles(image)
        self.coordinator.on_metadata_update()
        self.txn_coordinator.on_metadata_update()
        self._image_changed.set()
        self._image_changed = trio.Event()

    def _refresh_throttles(self, image: MetadataImage) -> None:
        """The replication throttles of the image's broker and topic configs."""
        props = self.effective_properties(image)
        topic_configs = {res.name: configs for res, configs in image.configs.items()
                         if res.type == ConfigResourceType.TOPIC}
        leader, follower = self.leader_throttle, self.follower_throttle
        self.leader_throttle = replication_quota(LEADER_RATE, LEADER_REPLICAS, props, topic_configs,
                                                 self.node_id, self.leader_throttle)
        self.follower_throttle = replication_quota(FOLLOWER_RATE, FOLLOWER_REPLICAS, props, topic_configs,
                                                   self.node_id, self.follower_throttle)
        for side, before, after in (("leader", leader, self.leader_throttle),
                                    ("follower", follower, self.follower_throttle)):
            if (before is None) != (after is None) or (after is not None and (
                    after.rate, after.partitions) != (before.rate, before.partitions)):
                _log.info("%s replication throttle: %s", side, "off" if after is None else
                          f"{after.rate} B/s on {dict(after.partitions)} (None: every partition)")

    def effective_properties(self, image: MetadataImage | None = None) -> dict[str, str]:
        """This broker's properties with the dynamic broker configs of the
        metadata log over them: the cluster default, then this broker's (KIP-226)."""
        image = image or self.image
        return {**self.config.properties,
                **image.configs.get(ConfigResource(ConfigResourceType.BROKER, ""), {}),
                **image.configs.get(ConfigResource(ConfigResourceType.BROKER, str(self.node_id)), {})}

    def effective_log_defaults(self, image: MetadataImage) -> dict[str, str]:
        """The broker defaults of topic configs, dynamic broker configs included."""
        props = self.effective_properties(image)
        return {"max.message.bytes": str(self.config.message_max_bytes), **self.config.log_defaults,
                **topic_defaults(props)}

    @property
    def loaded(self) -> bool:
        """Whether the first metadata image arrived (the logs are ready)."""
        return self._loaded and not self._closed

    async def wait_for_image(self, predicate: Callable[[MetadataImage], bool], deadline: float) -> bool:
        """Wait until `predicate(self.image)` holds or trio time `deadline`; whether it holds."""
        while not predicate(self.image):
            if trio.current_time() >= deadline:
                return False
            with trio.move_on_at(deadline):
                await self._image_changed.wait()
        return True

    # --- serving -------------------------------------------------------

    def scram_credential(self, mechanism: str, user: str):
        """A user's SCRAM credential in this broker's image (KIP-554), or None."""
        return self.image.scram_credentials.get((mechanism, user))

    def handle(self, ctx: ConnectionContext, request: DecodedRequest):
        """The wire server's handler: one request in, its response (or an
        awaitable of it: most handlers are coroutines) out."""
        if self.request_quotas is not None and not request_quota.exempt(request):
            return self._handle_charged(ctx, request)
        return self._handle(ctx, request)

    def _admit_connection(self, address: str) -> str | None:
        """The wire server's question for each new connection (ip quotas)."""
        quotas = self.connection_quotas
        if quotas is None:
            return None
        return quotas.admit(address, trio.current_time())

    def _handle_charged(self, ctx: ConnectionContext, request: DecodedRequest):
        """`_handle`, its loop time charged to the client's request quota."""
        started = time.perf_counter()
        result = self._handle(ctx, request)
        spent = time.perf_counter() - started
        if inspect.isawaitable(result):
            return self._finish_charged(ctx, request, result, spent)
        return self._throttled(ctx, request, result, spent)

    async def _finish_charged(self, ctx, request, awaitable, spent: float):
        steps = [spent]
        coro = awaitable if inspect.iscoroutine(awaitable) else awaitable.__await__()
        result = await request_quota.timed(coro, steps)
        return self._throttled(ctx, request, result, steps[0])

    def _throttled(self, ctx, request, result, spent: float):
        quotas = self.request_quotas
        if quotas is None:  # lifted while the request ran
            return result
        # The server's decoding and sending for this connection counts too,
        # as Kafka charges network-thread time.
        ctx.metered = True
        throttle_ms = request_quota.charge(quotas, ctx, request, spent + ctx.take_network_time())
        if not throttle_ms:
            return result
        ctx.mute(throttle_ms / 1000)
        return request_quota.with_throttle(request, result, throttle_ms)

    def _handle(self, ctx: ConnectionContext, request: DecodedRequest):
        if request.header.api_key in TOPIC_ID_APIS and request.header.api_version >= offset_topic_ids.TOPIC_ID_VERSION:
            # OffsetCommit/OffsetFetch v10 name topics by id: answered as their v9 twin.
            return offset_topic_ids.serve(self, ctx, request, self._handle_by_name)
        return self._handle_by_name(ctx, request)

    def _handle_by_name(self, ctx: ConnectionContext, request: DecodedRequest):
        if self.authorizer.enabled:
            refused = self.authorizer.refuse(ctx, request)
            if refused is not None:
                return refused
            narrowed = self.authorizer.narrow(ctx, request)
            if narrowed is not None:
                replacement, finish = narrowed
                if replacement is not request:
                    ctx.stand_in(request, replacement)
                return finished(ctx, replacement,
                                self._handlers[request.header.api_key](self, ctx, replacement), finish)
        return self._handlers[request.header.api_key](self, ctx, request)

    async def run(self, *, listen: bool = True,
                  task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; then shut down cleanly. Starts with the
        bound `Server` (its `port` is the real one when config.port is 0).
        With `listen=False` the port only listens once the caller calls
        `server.open()`: a node opens it when it can serve (`broker.shell.process`)."""
        config = self.config
        clean = False
        try:
            async with trio.open_nursery() as nursery:
                for listener in config.client_listeners:
                    server = await nursery.start(functools.partial(
                        serve, self.handle, listener.host, listener.port, apis=self.apis,
                        max_in_flight=config.max_in_flight_requests_per_connection,
                        request_max_bytes=config.socket_request_max_bytes,
                        connections_max_idle_ms=config.connections_max_idle_ms,
                        send_buffer_bytes=config.socket_send_buffer_bytes,
                        receive_buffer_bytes=config.socket_receive_buffer_bytes,
                        file_transfer=config.fetch_file_transfer,
                        log=logging.getLogger("broker.server"),
                        listen=listen,
                        listener_name=listener.name,
                        security=config.listener_security.get(listener.name),
                        scram_lookup=self.scram_credential,
                    ))
                    self.servers[listener.name] = server
                    server.admit = self._admit_connection
                    if self.server is None:
                        self.server = server
                    _log.info("broker %d %s %s on %s:%d", self.node_id,
                              "listening" if listen else "bound (listens once it serves)", listener.name,
                              listener.host or "*", server.port)
                nursery.start_soon(run_log_passes, self)
                nursery.start_soon(self._fail_log_dirs)
                await nursery.start(self.fetchers.run)
                await nursery.start(self.isr_sender.run)
                await nursery.start(self.coordinator.run)
                await nursery.start(self.txn_coordinator.run)
                await nursery.start(self.log_mover.run)
                if config.log_cleaner_enable:
                    nursery.start_soon(run_log_cleaner, self)
                task_status.started(self.server)
            clean = True
        except BaseException as exc:
            # Cancellation (SIGTERM, Ctrl-C, the caller's scope) is a clean
            # stop; a crash leaves no marker, so the next start recovers.
            clean = _is_stop(exc)
            raise
        finally:
            if clean:
                self.shutdown()

    def shutdown(self) -> None:
        """Close every log cleanly and write the clean-shutdown marker."""
        if self._closed:
            return
        self._closed = True
        if self._loaded:
            self.log_manager.shutdown(self.replicas.high_watermarks())
        offline = self.log_manager.offline_dirs
        if offline:
            _log.info("broker %d shut down; the logs of its offline log dir(s) %s are recovered at the next start",
                      self.node_id, ", ".join(offline))
        else:
            _log.info("broker %d shut down cleanly", self.node_id)

    async def _fail_log_dirs(self) -> None:
        """Take offline the log dirs a request or pass found failed
        (`ReplicaManager.disk_error`); once none is left, ask the process
        to stop (Kafka's broker halts when its last log dir fails)."""
        while True:
            await self.replicas.dir_failed.wait()
            self.replicas.fail_pending_dirs()
            # Coordinator shards on the failed dir's partitions stop at once,
            # not at the next metadata delta.
            self.coordinator.on_metadata_update()
            self.txn_coordinator.on_metadata_update()
            if not self.log_manager.online_dirs:
                _log.error("broker %d: every log dir is offline (%s): the broker stops. Fix: check the disks "
                           "(dmesg), replace or remount them and start the broker again; its replicas are "
                           "recovered from their files or copied back from their leaders", self.node_id,
                           "; ".join(f"{d}: {why}" for d, why in self.log_manager.offline_dirs.items()))
                self.all_dirs_offline.set()
                return


def _is_stop(exc: BaseException) -> bool:
    if isinstance(exc, (trio.Cancelled, KeyboardInterrupt)):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_stop(e) for e in exc.exceptions)
    return False
