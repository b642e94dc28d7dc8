"""Broker settings, with Apache Kafka's key names and defaults.

`BrokerConfig.from_properties` reads the keys a broker needs from a
properties map (the same map `common.config.NodeConfig` reads; keys it does
not know are left alone). raftka's own knobs carry a `raftka.` prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from broker.core.group import GroupCoordinatorConfig
from broker.core.txn import TransactionCoordinatorConfig
from broker.core.replication import ReplicationConfig
from quorum.metadata.broker_configs import topic_defaults
from common.config import ListenerAddress, bool_property, broker_listeners, float_property, int_property
from common.errors import ConfigError
from common.security import ListenerSecurity
from common.security.client import ClientSecurity, inter_broker_client_security
from common.security.acl import AuthorizerConfig, authorizer_config
from storage.cleaner_config import CleanerConfig

_FILE_TRANSFERS = ("auto", "sendfile", "pread")


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    node_id: int
    log_dirs: tuple[str, ...]
    cluster_id: str
    host: str = "127.0.0.1"
    port: int = 9092
    #: The name of the listener clients use (matched against registered endpoints).
    listener_name: str = "PLAINTEXT"
    #: Every client listener of `listeners` (those not named in
    #: `controller.listener.names`); empty: the one at host/port above.
    listeners: tuple[ListenerAddress, ...] = ()
    #: `inter.broker.listener.name`: the endpoint followers fetch from and
    #: coordinators reach other brokers on; empty: the first listener.
    inter_broker_listener_name: str = ""
    #: Each listener's TLS and SASL settings, by name (PLAINTEXT ones may be missing).
    listener_security: Mapping[str, ListenerSecurity] = dataclasses.field(default_factory=dict, compare=False)
    #: TLS and SASL of this broker's connections to others' inter-broker listener.
    inter_broker_security: ClientSecurity | None = dataclasses.field(default=None, compare=False)
    #: `authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`.
    authorizer: AuthorizerConfig = dataclasses.field(default_factory=AuthorizerConfig)
    rack: str | None = None
    auto_create_topics_enable: bool = False
    num_partitions: int = 1
    default_replication_factor: int = 1
    #: `message.max.bytes`: the broker default of the topic config `max.message.bytes`.
    message_max_bytes: int = 1048588
    socket_request_max_bytes: int = 104857600
    connections_max_idle_ms: int = 600000
    #: `socket.send.buffer.bytes` / `socket.receive.buffer.bytes`: SO_SNDBUF /
    #: SO_RCVBUF of client connections, -1 for the kernel's default with its
    #: autotuning. Kafka's default is 102400; raftka's is -1 because fixed
    #: 100 KB buffers make a 1 MB Fetch's sendfile wait for the socket several
    #: times: 20-50% more broker CPU per GB served on a 2-core VM (`python
    #: docs/hot_path_bench.py --phases fetch,consumer`, with and without
    #: `--set socket.send.buffer.bytes=102400 --set socket.receive.buffer.bytes=102400`).
    socket_send_buffer_bytes: int = -1
    socket_receive_buffer_bytes: int = -1
    #: `queued.max.requests` is per broker in Kafka; raftka bounds in-flight
    #: requests per connection instead.
    max_in_flight_requests_per_connection: int = 16
    #: `replica.high.watermark.checkpoint.interval.ms`
    replica_high_watermark_checkpoint_interval_ms: int = 5000
    #: `log.flush.offset.checkpoint.interval.ms` (recovery points)
    log_flush_offset_checkpoint_interval_ms: int = 60000
    #: `log.flush.start.offset.checkpoint.interval.ms`
    log_flush_start_offset_checkpoint_interval_ms: int = 60000
    #: `log.retention.check.interval.ms`
    log_retention_check_interval_ms: int = 300000
    #: `log.segment.bytes`, `log.retention.ms`, ...: broker defaults of topic configs.
    log_defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The properties this config was read from: the STATIC_BROKER_CONFIG
    #: values DescribeConfigs reports, under the dynamic ones of the metadata log.
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    #: How Fetch responses send record bytes: "auto" (sendfile, but slices
    #: of at most 64 KiB read into the surrounding sendmsg), "sendfile"
    #: (every slice), or "pread" (read and copy; for benchmarks).
    fetch_file_transfer: str = "auto"
    #: Bound on the wait of admin requests for this broker's image to show
    #: the change when the request carries no timeout (Metadata auto-create).
    metadata_wait_ms: int = 1000
    #: `group.*`, `offsets.*`: the group coordinator and `__consumer_offsets`.
    group_coordinator: GroupCoordinatorConfig = dataclasses.field(default_factory=GroupCoordinatorConfig)
    #: `transaction.*`, `transactional.id.expiration.ms`: the transaction
    #: coordinator and `__transaction_state`.
    txn_coordinator: TransactionCoordinatorConfig = dataclasses.field(
        default_factory=TransactionCoordinatorConfig)
    #: `log.cleaner.enable` and the `log.cleaner.*` keys: log compaction.
    log_cleaner_enable: bool = True
    #: `log.max.open.files`: segment files open at once (`storage.fs.OpenFileCache`);
    #: 0 derives it from the open-files limit, leaving room for sockets.
    log_max_open_files: int = 0
    #: `replica.alter.log.dirs.io.max.bytes.per.second`: how fast a replica
    #: moving between log dirs is copied (0: as fast as the event loop allows).
    replica_alter_log_dirs_io_max_bytes_per_second: int = 0
    #: `raftka.test.disk.fault.file` (tests only, `storage.fault_fs.FaultSwitchFileSystem`):
    #: while this file (relative to the first log dir) says `eio`, the
    #: partition logs' writes fail with EIO. Empty: the plain file system.
    test_disk_fault_file: str = ""
    log_cleaner: CleanerConfig = dataclasses.field(default_factory=CleanerConfig)
    #: `raftka.log.cleaner.cpu.fraction`: the share of one core the cleaner
    #: may use (it sleeps between steps to stay under it), on top of
    #: `log.cleaner.io.max.bytes.per.second`, which Kafka leaves unlimited.
    log_cleaner_cpu_fraction: float = 0.25
    #: `producer.id.expiration.ms` and `producer.id.expiration.check.interval.ms`.
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    #: `max.incremental.fetch.session.cache.slots`,
    #: `min.incremental.fetch.session.eviction.ms`: follower fetch sessions (KIP-227).
    max_incremental_fetch_session_cache_slots: int = 1000
    min_incremental_fetch_session_eviction_ms: int = 120_000
    #: `replica.lag.time.max.ms`, `replica.fetch.*`: replication of data partitions.
    replication: ReplicationConfig = dataclasses.field(default_factory=ReplicationConfig)

    @property
    def client_listeners(self) -> tuple[ListenerAddress, ...]:
        """The listeners this broker serves, the first at host/port."""
        return self.listeners or (ListenerAddress(self.listener_name, self.host, self.port),)

    @property
    def inter_broker_listener(self) -> str:
        return self.inter_broker_listener_name or self.listener_name

    def __post_init__(self) -> None:
        names = [listener.name for listener in self.client_listeners]
        if self.inter_broker_listener_name and self.inter_broker_listener_name not in names:
            raise ConfigError(f"inter.broker.listener.name={self.inter_broker_listener_name} is not one of the "
                              f"broker's listeners ({', '.join(names)}): name one of them")
        if self.fetch_file_transfer not in _FILE_TRANSFERS:
            raise ConfigError(
                f"raftka.fetch.file.transfer={self.fetch_file_transfer!r}: use one of "
                f"{', '.join(_FILE_TRANSFERS)}"
            )
        if not self.log_dirs:
            raise ConfigError("log.dirs is empty: give the broker a directory for its partitions")
        if not 0 < self.log_cleaner_cpu_fraction <= 1:
            raise ConfigError(f"raftka.log.cleaner.cpu.fraction={self.log_cleaner_cpu_fraction} must be a "
                              "fraction above 0 and at most 1")

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, cluster_id: str) -> BrokerConfig:
        """The broker settings in a Kafka-style properties map."""
        if "node.id" not in props:
            raise ConfigError("node.id is required: give every broker a unique integer id")
        dirs = props.get("log.dirs") or props.get("log.dir")
        if not dirs:
            raise ConfigError("log.dirs is required: the directory this broker keeps partitions in")
        listeners = broker_listeners({"listeners": "PLAINTEXT://127.0.0.1:9092", **props})
        if not listeners:
            raise ConfigError("listeners has no broker listener: add one, e.g. listeners=PLAINTEXT://127.0.0.1:9092")
        name, host, port = listeners[0].name, listeners[0].host, listeners[0].port
        # log.retention.hours/.minutes/.ms and the other broker defaults of
        # topic configs, with Kafka's precedence between the time units.
        for key in ("log.retention.minutes", "log.retention.hours", "log.roll.hours"):
            int_property(props, key, 0, -1)
        log_defaults = {k: v for k, v in topic_defaults(props).items() if k != "max.message.bytes"}
        # Compaction keys the cleaner reads (not topic configs raftka validates).
        for broker_key, topic_key in (("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
                                      ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio")):
            if broker_key in props:
                log_defaults[topic_key] = props[broker_key]
        return cls(
            node_id=int_property(props, "node.id", 0, 0),
            log_dirs=tuple(d.strip() for d in dirs.split(",") if d.strip()),
            cluster_id=cluster_id,
            host=host,
            port=port,
            listener_name=name,
            listeners=listeners,
            listener_security={listener.name: ListenerSecurity.from_properties(props, listener)
                               for listener in listeners},
            authorizer=authorizer_config(props),
            inter_broker_listener_name=props.get("inter.broker.listener.name", "").strip().upper(),
            inter_broker_security=inter_broker_client_security(
                props, props.get("inter.broker.listener.name", "").strip().upper() or name),
            rack=props.get("broker.rack"),
            auto_create_topics_enable=bool_property(props, "auto.create.topics.enable", False),
            num_partitions=int_property(props, "num.partitions", 1, 1),
            default_replication_factor=int_property(props, "default.replication.factor", 1, 1),
            message_max_bytes=int_property(props, "message.max.bytes", 1048588, 0),
            socket_request_max_bytes=int_property(props, "socket.request.max.bytes", 104857600, 1),
            connections_max_idle_ms=int_property(props, "connections.max.idle.ms", 600000, 1),
            socket_send_buffer_bytes=int_property(props, "socket.send.buffer.bytes", -1, -1),
            socket_receive_buffer_bytes=int_property(props, "socket.receive.buffer.bytes", -1, -1),
            replica_high_watermark_checkpoint_interval_ms=int_property(
                props, "replica.high.watermark.checkpoint.interval.ms", 5000, 1),
            log_flush_offset_checkpoint_interval_ms=int_property(
                props, "log.flush.offset.checkpoint.interval.ms", 60000, 1),
            log_flush_start_offset_checkpoint_interval_ms=int_property(
                props, "log.flush.start.offset.checkpoint.interval.ms", 60000, 1),
            log_retention_check_interval_ms=int_property(props, "log.retention.check.interval.ms", 300000, 1),
            log_defaults=log_defaults,
            properties=dict(props),
            fetch_file_transfer=props.get("raftka.fetch.file.transfer", "auto"),
            group_coordinator=GroupCoordinatorConfig.from_properties(props),
            txn_coordinator=TransactionCoordinatorConfig.from_properties(props),
            log_cleaner_enable=bool_property(props, "log.cleaner.enable", True),
            log_max_open_files=int_property(props, "log.max.open.files", 0, 0),
            replica_alter_log_dirs_io_max_bytes_per_second=int_property(
                props, "replica.alter.log.dirs.io.max.bytes.per.second", 0, 0),
            test_disk_fault_file=props.get("raftka.test.disk.fault.file", "").strip(),
            log_cleaner=CleanerConfig.from_properties(props),
            log_cleaner_cpu_fraction=float_property(props, "raftka.log.cleaner.cpu.fraction", 0.25),
            producer_id_expiration_ms=int_property(props, "producer.id.expiration.ms", 86_400_000, 1),
            producer_id_expiration_check_interval_ms=int_property(
                props, "producer.id.expiration.check.interval.ms", 600_000, 1),
            max_incremental_fetch_session_cache_slots=int_property(
                props, "max.incremental.fetch.session.cache.slots", 1000, 0),
            min_incremental_fetch_session_eviction_ms=int_property(
                props, "min.incremental.fetch.session.eviction.ms", 120_000, 0),
            replication=ReplicationConfig(
                replica_lag_time_max_ms=int_property(props, "replica.lag.time.max.ms", 30000, 1),
                replica_fetch_backoff_ms=int_property(props, "replica.fetch.backoff.ms", 1000, 0),
                replica_fetch_wait_max_ms=int_property(props, "replica.fetch.wait.max.ms", 500, 0),
                replica_fetch_min_bytes=int_property(props, "replica.fetch.min.bytes", 1, 0),
                replica_fetch_max_bytes=int_property(props, "replica.fetch.max.bytes", 1048576, 1),
                replica_fetch_response_max_bytes=int_property(props, "replica.fetch.response.max.bytes", 10485760, 1),
            ),
        )
