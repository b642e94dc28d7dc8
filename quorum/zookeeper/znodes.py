"""Kafka's znode layout in ZooKeeper and the JSON each znode holds.

Theory of operation
-------------------
A ZooKeeper-mode Kafka cluster keeps its metadata in a fixed tree of znodes
(Kafka's `kafka.zk.ZkData`). raftka writes and reads exactly that layout, so
a person who knows Kafka can inspect a raftka cluster with `zkCli.sh`, and
`raftka migrate` can read what a real Kafka wrote:

    /cluster/id                                {"version":"1","id":<uuid>}
    /controller                      ephemeral {"version":2,"brokerid":..,"timestamp":"..","kraftControllerEpoch":-1}
    /controller_epoch                          "<int>"
    /brokers/ids/<id>                ephemeral {"version":5,"host","port","endpoints":[..],"listener_security_protocol_map",
                                                "jmx_port","timestamp","features", "rack"?}
    /brokers/seqid                             (empty; its zkVersion generates broker ids)
    /brokers/topics/<t>                        {"version":3,"partitions":{"0":[1,2]},"adding_replicas":{},
                                                "removing_replicas":{},"topic_id":<uuid>}
    /brokers/topics/<t>/partitions/<p>/state   {"version":1,"leader","leader_epoch","controller_epoch","isr"}
    /config/topics/<t>                         {"version":1,"config":{"k":"v"}}
    /config/changes/config_change_<seq>        {"version":2,"entity_path":"topics/<t>"}
    /admin/delete_topics/<t>                   (empty)
    /admin/reassign_partitions                 {"version":1,"partitions":[{"topic","partition","replicas"}]}
    /isr_change_notification/isr_change_<seq>  {"version":1,"partitions":[{"topic","partition"}]}
    /latest_producer_id_block                  {"version":1,"broker","block_start":"..","block_end":".."}

Everything here is pure: paths are strings, encoders return bytes, decoders
take bytes (and, where Kafka does, the znode's zkVersion from its `Stat`) and
raise `MalformedZNodeError` on anything that is not Kafka's JSON. JSON is
written compactly, as Kafka's Jackson encoder does; decoders accept any key
order. Kafka writes timestamps and producer-id bounds as strings and versions
as numbers, except `/cluster/id`, whose version is the string "1"; kept here.

Topic ids and cluster ids are Kafka `Uuid`s: 16 bytes written as URL-safe
base64 without padding (22 characters), not the 36-character hex form.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from quorum.metadata.records import Endpoint
from quorum.zookeeper.errors import MalformedZNodeError

# --- paths --------------------------------------------------------------------

CLUSTER_ID_PATH = "/cluster/id"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
BROKERS_PATH = "/brokers"
BROKER_IDS_PATH = "/brokers/ids"
BROKER_SEQID_PATH = "/brokers/seqid"
TOPICS_PATH = "/brokers/topics"
CONFIG_PATH = "/config"
TOPIC_CONFIGS_PATH = "/config/topics"
CONFIG_CHANGES_PATH = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
ADMIN_PATH = "/admin"
DELETE_TOPICS_PATH = "/admin/delete_topics"
REASSIGN_PARTITIONS_PATH = "/admin/reassign_partitions"
ISR_CHANGE_NOTIFICATION_PATH = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"

#: Persistent paths every broker makes sure exist at start-up (Kafka's
#: `ZkData.PersistentZkPaths`, less the old consumer path).
PERSISTENT_PATHS: tuple[str, ...] = (
    BROKER_IDS_PATH,
    TOPICS_PATH,
    CONFIG_CHANGES_PATH,
    DELETE_TOPICS_PATH,
    BROKER_SEQID_PATH,
    ISR_CHANGE_NOTIFICATION_PATH,
    PRODUCER_ID_BLOCK_PATH,
    TOPIC_CONFIGS_PATH,
    "/config/clients",
    "/config/users",
    "/config/brokers",
    "/config/ips",
)

#: `leader` in a partition state: no leader (offline). Same as KRaft's NO_LEADER.
NO_LEADER = -1
#: `leader` the controller sends in UpdateMetadata for a topic being deleted
#: (Kafka's `LeaderAndIsr.LeaderDuringDelete`).
LEADER_DURING_DELETE = -2

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class NamedPartition(NamedTuple):
    """A partition by topic name, as ZooKeeper mode names it (Kafka's `TopicPartition`)."""

    topic: str
    partition: int


def is_legal_topic_name(name: str) -> bool:
    """Kafka's topic name rule: 1-249 of `[a-zA-Z0-9._-]`, and not "." or ".."."""
    return bool(_LEGAL_TOPIC.match(name)) and name not in (".", "..")


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS_PATH}/{broker_id}"


def topic_path(topic: str) -> str:
    assert is_legal_topic_name(topic), f"illegal topic name {topic!r} must be refused before it reaches ZooKeeper"
    return f"{TOPICS_PATH}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{partitions_path(topic)}/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


def topic_config_path(topic: str) -> str:
    assert is_legal_topic_name(topic), topic
    return f"{TOPIC_CONFIGS_PATH}/{topic}"


def delete_topic_path(topic: str) -> str:
    assert is_legal_topic_name(topic), topic
    return f"{DELETE_TOPICS_PATH}/{topic}"


# --- JSON helpers ---------------------------------------------------------------


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=False).encode()


def _loads(path: str, data: bytes | None) -> dict[str, Any]:
    if not data:
        raise MalformedZNodeError(f"{path}: empty znode, expected Kafka's JSON")
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedZNodeError(f"{path}: not JSON ({e}): {data[:200]!r}") from None
    if not isinstance(value, dict):
        raise MalformedZNodeError(f"{path}: expected a JSON object, got {data[:200]!r}")
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _field(path: str, obj: Mapping[str, Any], key: str, kind: type | str) -> Any:
    if key not in obj:
        raise MalformedZNodeError(f"{path}: missing {key!r} in {obj!r}")
    v = obj[key]
    if kind == "int":
        ok = _is_int(v)
    elif kind == "ints":
        ok = isinstance(v, list) and all(_is_int(x) for x in v)
    else:
        assert isinstance(kind, type)
        ok = isinstance(v, kind)
    if not ok:
        name = kind if isinstance(kind, str) else kind.__name__
        raise MalformedZNodeError(f"{path}: {key!r} should be {name}, got {v!r}")
    return v


def kafka_uuid_str(value: uuid.UUID) -> str:
    """A UUID as Kafka writes it: URL-safe base64 of its 16 bytes, no padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def parse_kafka_uuid(text: str) -> uuid.UUID:
    """Inverse of `kafka_uuid_str`; raises ValueError on anything else."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"{text!r} is not a Kafka Uuid") from None
    if len(raw) != 16:
        raise ValueError(f"{text!r} is not a Kafka Uuid (decodes to {len(raw)} bytes, not 16)")
    return uuid.UUID(bytes=raw)


# --- /controller, /controller_epoch -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerRegistration:
    """Who holds the ephemeral `/controller` znode."""

    broker_id: int
    timestamp_ms: int = 0
    #: KIP-866: the KRaft controller epoch during a migration, -1 for a ZooKeeper-mode controller.
    kraft_controller_epoch: int = -1


def encode_controller(reg: ControllerRegistration) -> bytes:
    return _dumps({"version": 2, "brokerid": reg.broker_id, "timestamp": str(reg.timestamp_ms),
                   "kraftControllerEpoch": reg.kraft_controller_epoch})


def decode_controller(data: bytes) -> ControllerRegistration:
    obj = _loads(CONTROLLER_PATH, data)
    broker_id = _field(CONTROLLER_PATH, obj, "brokerid", "int")
    timestamp = obj.get("timestamp", "0")
    kraft = obj.get("kraftControllerEpoch", -1)
    try:
        timestamp_ms = int(timestamp)
    except (TypeError, ValueError):
        raise MalformedZNodeError(f"{CONTROLLER_PATH}: bad timestamp {timestamp!r}") from None
    if not _is_int(kraft):
        raise MalformedZNodeError(f"{CONTROLLER_PATH}: bad kraftControllerEpoch {kraft!r}")
    return ControllerRegistration(broker_id, timestamp_ms, kraft)


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(data: bytes) -> int:
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise MalformedZNodeError(f"{CONTROLLER_EPOCH_PATH}: expected an integer, got {data[:50]!r}") from None


# --- /brokers/ids/<id> ------------------------------------------------------------

SECURITY_PROTOCOLS: dict[int, str] = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}
_PROTOCOL_CODES = {v: k for k, v in SECURITY_PROTOCOLS.items()}
_CONNECTION_STRING = re.compile(r"^([^:/]+)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


def endpoint_connection_string(e: Endpoint) -> str:
    """Kafka's `EndPoint.connectionString`: `LISTENER://host:port`, IPv6 hosts in brackets."""
    host = f"[{e.host}]" if ":" in e.host else e.host
    return f"{e.name}://{host}:{e.port}"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker's registration znode (JSON version 5).

    `broker_epoch` is not in the JSON: as in Kafka, it is the czxid of the
    ephemeral znode (the zxid of the transaction that created it), so each
    new session's registration has a larger epoch. -1 when unknown.
    """

    broker_id: int
    endpoints: tuple[Endpoint, ...]
    rack: str | None = None
    jmx_port: int = -1
    timestamp_ms: int = 0
    #: feature name -> (min_version, max_version)
    features: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    broker_epoch: int = -1

    def endpoint(self, listener: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.name == listener), None)


def encode_broker_info(info: BrokerInfo) -> bytes:
    # The top-level host and port are the first PLAINTEXT endpoint's, for old
    # clients; without one Kafka writes a null host and port -1.
    plaintext = next((e for e in info.endpoints if e.security_protocol == 0), None)
    obj: dict[str, Any] = {
        "features": {name: {"min_version": lo, "max_version": hi} for name, (lo, hi) in info.features.items()},
        "listener_security_protocol_map": {e.name: SECURITY_PROTOCOLS[e.security_protocol] for e in info.endpoints},
        "endpoints": [endpoint_connection_string(e) for e in info.endpoints],
        "jmx_port": info.jmx_port,
        "port": plaintext.port if plaintext else -1,
        "host": plaintext.host if plaintext else None,
        "version": 5,
        "timestamp": str(info.timestamp_ms),
    }
    if info.rack is not None:
        obj["rack"] = info.rack
    return _dumps(obj)


def decode_broker_info(broker_id: int, data: bytes, czxid: int = -1) -> BrokerInfo:
    """Decode `/brokers/ids/<broker_id>` (JSON versions 2-5); `czxid` becomes the broker epoch."""
    path = broker_path(broker_id)
    obj = _loads(path, data)
    version = _field(path, obj, "version", "int")
    if version < 2:
        raise MalformedZNodeError(f"{path}: broker registration version {version} is older than raftka reads (2-5)")
    protocols = obj.get("listener_security_protocol_map") or {}
    if not isinstance(protocols, dict):
        raise MalformedZNodeError(f"{path}: bad listener_security_protocol_map {protocols!r}")
    endpoints = []
    for s in _field(path, obj, "endpoints", list):
        m = _CONNECTION_STRING.match(s) if isinstance(s, str) else None
        if m is None:
            raise MalformedZNodeError(f"{path}: bad endpoint {s!r}")
        name, host, port = m.group(1), m.group(2), int(m.group(3))
        protocol = protocols.get(name, name)
        if protocol not in _PROTOCOL_CODES:
            raise MalformedZNodeError(f"{path}: unknown security protocol {protocol!r} for listener {name!r}")
        endpoints.append(Endpoint(name, host, port, _PROTOCOL_CODES[protocol]))
    features: dict[str, tuple[int, int]] = {}
    for name, v in (obj.get("features") or {}).items():
        if not (isinstance(v, dict) and _is_int(v.get("min_version")) and _is_int(v.get("max_version"))):
            raise MalformedZNodeError(f"{path}: bad feature {name!r}: {v!r}")
        features[name] = (v["min_version"], v["max_version"])
    rack = obj.get("rack")
    timestamp = obj.get("timestamp", "0")
    try:
        timestamp_ms = int(timestamp)
    except (TypeError, ValueError):
        raise MalformedZNodeError(f"{path}: bad timestamp {timestamp!r}") from None
    return BrokerInfo(broker_id, tuple(endpoints), rack if isinstance(rack, str) else None,
                      _field(path, obj, "jmx_port", "int"), timestamp_ms, features, czxid)


# --- /brokers/topics/<t> --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A topic's replica assignment (JSON version 3). Partition -> replicas, preferred leader first."""

    partitions: Mapping[int, tuple[int, ...]]
    topic_id: uuid.UUID | None = None
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


def _replica_map(m: Mapping[int, tuple[int, ...]]) -> dict[str, list[int]]:
    return {str(p): list(r) for p, r in sorted(m.items()) if r}


def encode_topic_assignment(a: TopicAssignment) -> bytes:
    obj: dict[str, Any] = {
        "version": 3,
        "partitions": {str(p): list(r) for p, r in sorted(a.partitions.items())},
        "adding_replicas": _replica_map(a.adding_replicas),
        "removing_replicas": _replica_map(a.removing_replicas),
    }
    if a.topic_id is not None:
        obj["topic_id"] = kafka_uuid_str(a.topic_id)
    return _dumps(obj)


def decode_topic_assignment(topic: str, data: bytes) -> TopicAssignment:
    path = topic_path(topic)
    obj = _loads(path, data)

    def replica_map(key: str) -> dict[int, tuple[int, ...]]:
        raw = obj.get(key) or {}
        if not isinstance(raw, dict):
            raise MalformedZNodeError(f"{path}: {key!r} should be an object, got {raw!r}")
        out = {}
        for p, replicas in raw.items():
            if not (p.isdigit() and isinstance(replicas, list) and all(_is_int(r) for r in replicas)):
                raise MalformedZNodeError(f"{path}: bad {key!r} entry {p!r}: {replicas!r}")
            out[int(p)] = tuple(replicas)
        return out

    topic_id = None
    if "topic_id" in obj:
        try:
            topic_id = parse_kafka_uuid(_field(path, obj, "topic_id", str))
        except ValueError as e:
            raise MalformedZNodeError(f"{path}: {e}") from None
    return TopicAssignment(replica_map("partitions"), topic_id, replica_map("adding_replicas"),
                           replica_map("removing_replicas"))


# --- /brokers/topics/<t>/partitions/<p>/state ---------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader, ISR and epochs of one partition (Kafka's `LeaderIsrAndControllerEpoch`).

    `zk_version` is the state znode's zkVersion: every conditional write names
    it, so a writer that read an older state loses (BadVersion). Kafka sends
    it to brokers as the partition epoch. -1 when the znode does not exist yet.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    zk_version: int = -1
    #: KIP-704: 1 while recovering from an unclean election; 0 otherwise.
    leader_recovery_state: int = 0

    @property
    def has_leader(self) -> bool:
        return self.leader >= 0


def encode_partition_state(s: PartitionState) -> bytes:
    obj: dict[str, Any] = {"controller_epoch": s.controller_epoch, "leader": s.leader, "version": 1,
                           "leader_epoch": s.leader_epoch, "isr": list(s.isr)}
    if s.leader_recovery_state != 0:
        obj["leader_recovery_state"] = s.leader_recovery_state
    return _dumps(obj)


def decode_partition_state(topic: str, partition: int, data: bytes, zk_version: int) -> PartitionState:
    path = partition_state_path(topic, partition)
    obj = _loads(path, data)
    recovery = obj.get("leader_recovery_state", 0)
    if not _is_int(recovery):
        raise MalformedZNodeError(f"{path}: bad leader_recovery_state {recovery!r}")
    return PartitionState(
        leader=_field(path, obj, "leader", "int"),
        leader_epoch=_field(path, obj, "leader_epoch", "int"),
        isr=tuple(_field(path, obj, "isr", "ints")),
        controller_epoch=_field(path, obj, "controller_epoch", "int"),
        zk_version=zk_version,
        leader_recovery_state=recovery,
    )


# --- /isr_change_notification -------------------------------------------------------------


def encode_isr_change_notification(partitions: Iterable[NamedPartition]) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in sorted(set(partitions))]})


def decode_isr_change_notification(data: bytes) -> tuple[NamedPartition, ...]:
    path = ISR_CHANGE_NOTIFICATION_PATH
    obj = _loads(path, data)
    out = []
    for entry in _field(path, obj, "partitions", list):
        if not isinstance(entry, dict):
            raise MalformedZNodeError(f"{path}: bad partition entry {entry!r}")
        out.append(NamedPartition(_field(path, entry, "topic", str), _field(path, entry, "partition", "int")))
    return tuple(out)


# --- /config ---------------------------------------------------------------------------------


def encode_entity_config(config: Mapping[str, str]) -> bytes:
    return _dumps({"version": 1, "config": dict(config)})


def decode_entity_config(path: str, data: bytes | None) -> dict[str, str]:
    """A config entity's keys; an empty or missing znode means no overrides (as Kafka reads it)."""
    if not data:
        return {}
    obj = _loads(path, data)
    config = obj.get("config") or {}
    if not isinstance(config, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in config.items()):
        raise MalformedZNodeError(f"{path}: 'config' should map strings to strings, got {config!r}")
    return dict(config)


def encode_config_change(entity_path: str) -> bytes:
    """A `/config/changes/config_change_<seq>` notification: `entity_path` is e.g. "topics/orders"."""
    return _dumps({"version": 2, "entity_path": entity_path})


def decode_config_change(data: bytes) -> str:
    obj = _loads(CONFIG_CHANGES_PATH, data)
    return _field(CONFIG_CHANGES_PATH, obj, "entity_path", str)


# --- /cluster/id, /admin/reassign_partitions, /latest_producer_id_block -------------------------------


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return _field(CLUSTER_ID_PATH, _loads(CLUSTER_ID_PATH, data), "id", str)


def encode_reassignment(reassignment: Mapping[NamedPartition, tuple[int, ...]]) -> bytes:
    return _dumps({"version": 1, "partitions": [
        {"topic": tp.topic, "partition": tp.partition, "replicas": list(r)} for tp, r in sorted(reassignment.items())]})


def decode_reassignment(data: bytes) -> dict[NamedPartition, tuple[int, ...]]:
    path = REASSIGN_PARTITIONS_PATH
    out = {}
    for entry in _field(path, _loads(path, data), "partitions", list):
        if not isinstance(entry, dict):
            raise MalformedZNodeError(f"{path}: bad entry {entry!r}")
        tp = NamedPartition(_field(path, entry, "topic", str), _field(path, entry, "partition", "int"))
        out[tp] = tuple(_field(path, entry, "replicas", "ints"))
    return out


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """The last producer-id block handed out: ids `block_start..block_end` inclusive went to `broker`."""

    broker: int
    block_start: int
    block_end: int


def encode_producer_id_block(b: ProducerIdBlock) -> bytes:
    return _dumps({"version": 1, "broker": b.broker, "block_start": str(b.block_start), "block_end": str(b.block_end)})


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    path = PRODUCER_ID_BLOCK_PATH
    obj = _loads(path, data)
    try:
        return ProducerIdBlock(_field(path, obj, "broker", "int"), int(_field(path, obj, "block_start", str)),
                               int(_field(path, obj, "block_end", str)))
    except ValueError:
        raise MalformedZNodeError(f"{path}: block bounds are not integers: {obj!r}") from None
