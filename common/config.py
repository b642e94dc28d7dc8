"""Node configuration with Apache Kafka's key names.

A config is a properties file (`key=value` lines, `#` comments), exactly the
format Kafka's `server.properties` uses, so a Kafka operator can read ours.
`NodeConfig.from_properties` checks every key it knows and refuses a bad
value with a `ConfigError` that names the key, the value and what is allowed.
Unknown keys are kept (Kafka warns and ignores them): `NodeConfig.raw` is
a `Properties` map that remembers which keys were read, and the node logs
the keys nobody read once it has started (`warn_unread_keys`), one warning
per key, as Kafka's `AbstractConfig.logUnused` does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
import re
from pathlib import Path

from common.errors import ConfigError

_VOTER = re.compile(r"^(\d+)@([^:]+):(\d+)$")
_ZK_CONNECT = re.compile(r"^[^,:/\s]+:\d+(,[^,:/\s]+:\d+)*(/[^\s]*)?$")
_LISTENER = re.compile(r"^(?:([A-Za-z_]+)://)?([^:]*):(\d+)$")
MAX_PORT = 65535


class Properties(dict):
    """A properties map that remembers the keys read through `get`, `[]` and `in`.

    Keys under `IGNORED_PREFIXES` are families read by iterating (e.g. a
    per-logger level), so they are never reported as unread."""

    __slots__ = ("read_keys",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_keys: set[str] = set()

    def get(self, key, default=None):
        self.read_keys.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read_keys.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.read_keys.add(key)
        return super().__contains__(key)

    def unread_keys(self) -> list[str]:
        return sorted(k for k in self.keys() if k not in self.read_keys
                      and not any(k.startswith(p) for p in IGNORED_PREFIXES))


#: Key families that are read by iterating over the map, or that Kafka
#: passes through to other components (listener-specific and client keys).
IGNORED_PREFIXES = ("log.level", "listener.name.", "raftka.test.")

_warned: set[str] = set()


def warn_unread_keys(props: Mapping[str, str], log: logging.Logger | None = None) -> list[str]:
    """Log one warning per config key that nothing has read (a typo, or a
    Kafka key raftka does not implement); the keys warned about."""
    if not isinstance(props, Properties):
        return []
    log = log or logging.getLogger("config")
    fresh = [k for k in props.unread_keys() if k not in _warned]
    for key in fresh:
        _warned.add(key)
        log.warning("config key %s=%s is not a known configuration and is ignored; check its spelling "
                    "(docs/operations.md lists every key raftka reads)", key, dict.get(props, key))
    return fresh


def _with(props: Properties, key: str, value: str) -> Properties:
    out = Properties({**dict(props), key: value})
    out.read_keys = props.read_keys
    return out


def read_properties(path: str | Path) -> dict[str, str]:
    """Parse a Java-style properties file (the subset Kafka configs use)."""
    props: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}; pass an existing file") from e
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"{path}:{lineno}: expected key=value, got {raw!r}")
        props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def parse_bootstrap_servers(value: str) -> tuple[tuple[str, int], ...]:
    """`controller.quorum.bootstrap.servers`: `host:port,host:port,...` (KIP-853)."""
    servers = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"controller.quorum.bootstrap.servers: {item!r} is not of the form host:port "
                              "(e.g. 127.0.0.1:9093)")
        servers.append((host, _port(int(port), "controller.quorum.bootstrap.servers", item, lowest=1)))
    return tuple(servers)


def parse_voters(value: str, *, allow_empty: bool = False) -> dict[int, tuple[str, int]]:
    """`controller.quorum.voters`: `1@host:port,2@host:port,...`."""
    voters: dict[int, tuple[str, int]] = {}
    if not value.strip() and allow_empty:
        return voters
    for item in filter(None, (v.strip() for v in value.split(","))):
        m = _VOTER.match(item)
        if not m:
            raise ConfigError(
                f"controller.quorum.voters: {item!r} is not of the form id@host:port "
                f"(e.g. 1@127.0.0.1:9093)"
            )
        voters[int(m.group(1))] = (m.group(2), _port(int(m.group(3)), "controller.quorum.voters", item, lowest=1))
    if not voters:
        raise ConfigError("controller.quorum.voters is empty: list the voters as id@host:port,...")
    return voters


def parse_listener(value: str, key: str = "listeners") -> tuple[str, str, int]:
    """The first `NAME://host:port` of a listener list -> (name, host, port).
    An empty host is kept empty: it binds every interface, as in Kafka."""
    return parse_listeners(value, key)[0]


def parse_listeners(value: str, key: str = "listeners") -> list[tuple[str, str, int]]:
    """`NAME://host:port,NAME://host:port,...` -> [(name, host, port), ...];
    names are upper-cased and must be unique (Kafka's rule)."""
    out: list[tuple[str, str, int]] = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        m = _LISTENER.match(item)
        if not m:
            raise ConfigError(f"{key}: {item!r} is not of the form NAME://host:port "
                              "(e.g. PLAINTEXT://127.0.0.1:9092, or PLAINTEXT://:9092 for every interface)")
        host = m.group(2)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        out.append(((m.group(1) or "PLAINTEXT").upper(), host, _port(int(m.group(3)), key, item, lowest=0)))
    if not out:
        raise ConfigError(f"{key} is empty: give at least one NAME://host:port")
    names = [name for name, _h, _p in out]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"{key}: listener name {name} appears twice; each listener needs its own name")
    return out


#: Kafka's `SecurityProtocol` ids, as RegisterBrokerRecord carries them.
SECURITY_PROTOCOLS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}


def security_protocol_map(props: Mapping[str, str]) -> dict[str, str]:
    """`listener.security.protocol.map` (`NAME:PROTOCOL,...`); a listener
    named after a protocol needs no entry (Kafka's default map)."""
    mapping = {name: name for name in SECURITY_PROTOCOLS}
    raw = props.get("listener.security.protocol.map", "")
    for item in filter(None, (v.strip() for v in raw.split(","))):
        name, sep, protocol = item.partition(":")
        protocol = protocol.strip().upper()
        if not sep or not name.strip() or protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL with PROTOCOL one of "
                              f"{', '.join(SECURITY_PROTOCOLS)} (e.g. CONTROLLER:PLAINTEXT)")
        mapping[name.strip().upper()] = protocol
    return mapping


@dataclasses.dataclass(frozen=True)
class ListenerAddress:
    """One entry of `listeners`: where it binds and its security protocol."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


def node_listeners(props: Mapping[str, str]) -> tuple[ListenerAddress, ...]:
    """Every entry of `listeners`, each with its protocol from
    `listener.security.protocol.map`; a name without one is refused."""
    if "listeners" not in props:
        return ()
    mapping = security_protocol_map(props)
    # Controller and control-plane listeners left out of the map are
    # PLAINTEXT, as Kafka defaults them when the map is not set.
    internal = {*controller_listener_names(props), props.get("control.plane.listener.name", "CONTROL_PLANE").upper()}
    out = []
    for name, host, port in parse_listeners(props["listeners"]):
        if name not in mapping and name in internal:
            mapping[name] = "PLAINTEXT"
        if name not in mapping:
            raise ConfigError(f"listeners: listener {name} has no security protocol: add {name}:PLAINTEXT (or SSL, "
                              "SASL_PLAINTEXT, SASL_SSL) to listener.security.protocol.map")
        out.append(ListenerAddress(name, host, port, mapping[name]))
    return tuple(out)


def controller_listener_names(props: Mapping[str, str]) -> tuple[str, ...]:
    """`controller.listener.names`; unset, a listener named CONTROLLER is the controllers'."""
    raw = props.get("controller.listener.names", "CONTROLLER")
    return tuple(n.strip().upper() for n in raw.split(",") if n.strip())


def broker_listeners(props: Mapping[str, str]) -> tuple[ListenerAddress, ...]:
    """The entries of `listeners` that serve clients (not named in `controller.listener.names`)."""
    internal = {*controller_listener_names(props), props.get("control.plane.listener.name", "CONTROL_PLANE").upper()}
    return tuple(listener for listener in node_listeners(props) if listener.name not in internal)


def _port(port: int, key: str, where: str, lowest: int) -> int:
    """`port` if it is a TCP port (the OS would silently take 70000 as 4464)."""
    if not lowest <= port <= MAX_PORT:
        free = " (0 picks a free port)" if lowest == 0 else ""
        raise ConfigError(f"{key}: port {port} in {where!r} is out of range: use {lowest}-{MAX_PORT}{free}")
    return port


def int_property(props: Mapping[str, str], key: str, default: int, minimum: int | None = None) -> int:
    """`key` as an integer, `default` when absent; a ConfigError names the
    key and the value when it is not an integer or is below `minimum`."""
    raw = props.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}={value} is below the minimum {minimum}")
    return value


def float_property(props: Mapping[str, str], key: str, default: float) -> float:
    raw = props.get(key)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number") from None


def bool_property(props: Mapping[str, str], key: str, default: bool) -> bool:
    raw = props.get(key)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise ConfigError(f"{key}={raw!r} must be true or false")
    return raw.strip().lower() == "true"


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """The keys a controller, broker or combined node reads."""

    node_id: int
    process_roles: frozenset[str]
    log_dirs: tuple[str, ...]
    controller_quorum_voters: dict[int, tuple[str, int]]
    listener: tuple[str, str, int] | None
    controller_listener: tuple[str, str, int] | None
    controller_quorum_election_timeout_ms: int = 1000
    controller_quorum_fetch_timeout_ms: int = 2000
    controller_quorum_election_backoff_max_ms: int = 1000
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    metadata_log_max_record_bytes_between_snapshots: int = 20 * 1024 * 1024
    num_partitions: int = 1
    default_replication_factor: int = 1
    auto_create_topics_enable: bool = False
    socket_request_max_bytes: int = 104857600
    connections_max_idle_ms: int = 600000
    #: ZooKeeper mode (Kafka's pre-KRaft deployment): `zookeeper.connect` set and
    #: `process.roles` unset; the node is a broker whose controller is elected in ZooKeeper.
    zookeeper_connect: str | None = None
    zookeeper_session_timeout_ms: int = 18000
    zookeeper_connection_timeout_ms: int = 18000
    #: `controller.quorum.bootstrap.servers` (KIP-853): where a node of a
    #: dynamic quorum first asks for the voters; empty with a static
    #: `controller.quorum.voters`.
    controller_quorum_bootstrap_servers: tuple[tuple[str, int], ...] = ()
    raw: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def is_controller(self) -> bool:
        return "controller" in self.process_roles

    @property
    def is_broker(self) -> bool:
        return "broker" in self.process_roles or self.zk_mode

    @property
    def zk_mode(self) -> bool:
        """A ZooKeeper-mode broker: metadata from a controller elected in ZooKeeper, no quorum."""
        return self.zookeeper_connect is not None and not self.process_roles

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> NodeConfig:
        props = props if isinstance(props, Properties) else Properties(props)
        if "zookeeper.connect" in props and "process.roles" not in props:
            return cls._zk_mode(props)
        if "zookeeper.connect" in props and not bool_property(props, "zookeeper.metadata.migration.enable", False):
            raise ConfigError(
                "zookeeper.connect and process.roles are both set: remove process.roles for a ZooKeeper-mode "
                "broker, or zookeeper.connect for a KRaft node (both together only with "
                "zookeeper.metadata.migration.enable=true, during a migration)"
            )
        if "node.id" not in props:
            raise ConfigError("node.id is required: give every node a unique integer id")
        node_id = int_property(props, "node.id", 0, minimum=0)
        roles = frozenset(r.strip() for r in props.get("process.roles", "broker,controller").split(",") if r.strip())
        if not roles or not roles <= {"broker", "controller"}:
            raise ConfigError(f"process.roles={props.get('process.roles')!r}: use broker, controller or broker,controller")
        dirs = props.get("log.dirs") or props.get("log.dir")
        if not dirs:
            raise ConfigError("log.dirs is required: the directory this node keeps its data in")
        bootstrap = parse_bootstrap_servers(props.get("controller.quorum.bootstrap.servers", ""))
        voters = parse_voters(props.get("controller.quorum.voters", ""), allow_empty=bool(bootstrap))
        if bootstrap and voters:
            raise ConfigError("controller.quorum.voters and controller.quorum.bootstrap.servers are both set: keep "
                              "controller.quorum.voters for a static quorum, or controller.quorum.bootstrap.servers "
                              "for a dynamic one (format it with `raftka storage format --standalone` or "
                              "--initial-controllers)")
        if "controller" in roles and not bootstrap and node_id not in voters:
            raise ConfigError(
                f"node.id={node_id} has process.roles controller but is not in controller.quorum.voters "
                f"({','.join(map(str, voters))}); add it there"
            )
        clients = broker_listeners(props)
        listener = (clients[0].name, clients[0].host, clients[0].port) if clients else None
        controller_listener = None
        if "controller" in roles:
            controller_listener = _controller_listener(props, voters.get(node_id))
        if "broker" in roles and listener is None:
            raise ConfigError("listeners has no broker listener: add one, e.g. listeners=PLAINTEXT://127.0.0.1:9092"
                              " (the listeners named in controller.listener.names serve only controllers)")
        return cls(
            node_id=node_id,
            process_roles=roles,
            log_dirs=tuple(d.strip() for d in dirs.split(",") if d.strip()),
            controller_quorum_voters=voters,
            listener=listener,
            controller_listener=controller_listener,
            controller_quorum_election_timeout_ms=int_property(props, "controller.quorum.election.timeout.ms", 1000, 1),
            controller_quorum_fetch_timeout_ms=int_property(props, "controller.quorum.fetch.timeout.ms", 2000, 1),
            controller_quorum_election_backoff_max_ms=int_property(props, "controller.quorum.election.backoff.max.ms", 1000, 1),
            broker_session_timeout_ms=int_property(props, "broker.session.timeout.ms", 9000, 1),
            broker_heartbeat_interval_ms=int_property(props, "broker.heartbeat.interval.ms", 2000, 1),
            metadata_log_max_record_bytes_between_snapshots=int_property(
                props, "metadata.log.max.record.bytes.between.snapshots", 20 * 1024 * 1024, 1
            ),
            num_partitions=int_property(props, "num.partitions", 1, 1),
            default_replication_factor=int_property(props, "default.replication.factor", 1, 1),
            auto_create_topics_enable=bool_property(props, "auto.create.topics.enable", False),
            socket_request_max_bytes=int_property(props, "socket.request.max.bytes", 104857600, 1),
            connections_max_idle_ms=int_property(props, "connections.max.idle.ms", 600000, 1),
            zookeeper_connect=props.get("zookeeper.connect") or None,
            zookeeper_session_timeout_ms=int_property(props, "zookeeper.session.timeout.ms", 18000, 1),
            zookeeper_connection_timeout_ms=int_property(props, "zookeeper.connection.timeout.ms",
                                                 int_property(props, "zookeeper.session.timeout.ms", 18000, 1), 1),
            controller_quorum_bootstrap_servers=bootstrap,
            raw=props,
        )

    @classmethod
    def _zk_mode(cls, props: dict[str, str]) -> NodeConfig:
        """A ZooKeeper-mode broker (Kafka before KIP-500): `broker.id` (or `node.id`),
        `zookeeper.connect`, `listeners`, `log.dirs`; no quorum keys needed."""
        connect = props["zookeeper.connect"].strip()
        if not _ZK_CONNECT.match(connect):
            raise ConfigError(
                f"zookeeper.connect={connect!r} is not of the form host:port[,host:port...][/chroot] "
                "(e.g. 127.0.0.1:2181 or zk1:2181,zk2:2181,zk3:2181/kafka)"
            )
        for server in connect.split("/", 1)[0].split(","):
            _port(int(server.rsplit(":", 1)[1]), "zookeeper.connect", server, lowest=1)
        ids = {k: props[k] for k in ("broker.id", "node.id") if k in props}
        if not ids:
            raise ConfigError("broker.id is required in ZooKeeper mode: give every broker a unique integer id")
        if len(set(ids.values())) > 1:
            raise ConfigError(f"broker.id={ids['broker.id']} and node.id={ids['node.id']} disagree: set one of them")
        key = "broker.id" if "broker.id" in ids else "node.id"
        node_id = int_property(props, key, 0, minimum=0)
        dirs = props.get("log.dirs") or props.get("log.dir")
        if not dirs:
            raise ConfigError("log.dirs is required: the directory this broker keeps its data in")
        if "listeners" not in props:
            raise ConfigError("listeners is required for a broker, e.g. listeners=PLAINTEXT://127.0.0.1:9092")
        session_timeout_ms = int_property(props, "zookeeper.session.timeout.ms", 18000, 1)
        voters = parse_voters(props["controller.quorum.voters"]) if props.get("controller.quorum.voters") else {}
        return cls(
            node_id=node_id,
            process_roles=frozenset(),
            log_dirs=tuple(d.strip() for d in dirs.split(",") if d.strip()),
            controller_quorum_voters=voters,
            listener=parse_listener(props["listeners"]),
            controller_listener=None,
            num_partitions=int_property(props, "num.partitions", 1, 1),
            default_replication_factor=int_property(props, "default.replication.factor", 1, 1),
            auto_create_topics_enable=bool_property(props, "auto.create.topics.enable", False),
            socket_request_max_bytes=int_property(props, "socket.request.max.bytes", 104857600, 1),
            connections_max_idle_ms=int_property(props, "connections.max.idle.ms", 600000, 1),
            zookeeper_connect=connect,
            zookeeper_session_timeout_ms=session_timeout_ms,
            zookeeper_connection_timeout_ms=int_property(props, "zookeeper.connection.timeout.ms", session_timeout_ms, 1),
            raw=_with(props, "node.id", str(node_id)),
        )


def _controller_listener(props: Mapping[str, str], voter: tuple[str, int] | None) -> tuple[str, str, int]:
    """Where a controller listens: the first listener of
    `controller.listener.names` in `listeners` (Kafka's rule), else its own
    address in `controller.quorum.voters`. A controller of a dynamic quorum
    (not in `controller.quorum.voters`) needs the listener."""
    names = controller_listener_names(props)
    for listener in node_listeners(props):
        if names and listener.name == names[0]:
            if voter is None:
                if listener.port == 0:
                    raise ConfigError(f"listeners: controller listener {listener.name} needs a fixed port in a "
                                      "dynamic quorum (the voters record names it)")
                return (listener.name, listener.host or "127.0.0.1", listener.port)
            if listener.port not in (0, voter[1]):
                raise ConfigError(
                    f"listeners: controller listener {listener.name} is on port {listener.port} but this node's entry "
                    f"in controller.quorum.voters says port {voter[1]}; make them agree")
            return (listener.name, listener.host, voter[1])
    if voter is None:
        raise ConfigError("a controller of a dynamic quorum (controller.quorum.bootstrap.servers) needs its listener: "
                          "set controller.listener.names=CONTROLLER and add CONTROLLER://HOST:PORT to listeners")
    return (names[0] if names else "CONTROLLER", voter[0], voter[1])


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set log.segment.bytes=1048576")
        out[key.strip()] = value.strip()
    return out
