"""The controller-to-broker requests of ZooKeeper mode: LeaderAndIsr (api 4),
StopReplica (api 5) and UpdateMetadata (api 6), with their wire codec.

Theory of operation
-------------------
A ZooKeeper-mode controller pushes state to brokers with these three
requests. Kafka 4.0 dropped them from its protocol JSON, and kio (generated
from it) has no schemas for them, so they are declared here by hand, as
kio-style frozen dataclasses: each field carries its Kafka type in
`metadata["kafka_type"]` and each class the `__api_key__`, `__version__`,
`__flexible__` and `__header_schema__` kio expects. kio's generic
`entity_reader`/`entity_writer` then encode them exactly as Kafka 3.x's
generated code does. The field order and types follow Kafka 3.7's
`LeaderAndIsrRequest.json` (v7), `StopReplicaRequest.json` (v4) and
`UpdateMetadataRequest.json` (v8): the last version of each a Kafka
ZooKeeper-mode controller sent. All three are flexible (KIP-482), so they
use request header v2 and response header v1.

Frames are standard Kafka frames (size, header, body), so a Kafka 3.x broker
could decode them; `encode_request`/`decode_request` and the response pair
do it without going through `common.wire.codec.api_codec` (which looks
schemas up in kio). `CONTROLLER_CODECS` holds ready `ApiCodec`s for a server
that wants to serve these APIs next to kio's.

This module must not use `from __future__ import annotations`: kio reads the
field types at runtime.
"""

import io
import struct
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v2.header import RequestHeader as _RequestHeaderV2
from kio.schema.response_header.v1.header import ResponseHeader as _ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from common.wire.codec import ApiCodec, RequestHeader, encode_payload, parse_request_header
from common.wire.codec import decode_response as _decode_response
from common.wire.errors import LocalProtocolError, RemoteProtocolError
from common.wire.framing import SIZE_PREFIX

LEADER_AND_ISR_KEY = 4
STOP_REPLICA_KEY = 5
UPDATE_METADATA_KEY = 6

#: LeaderAndIsr `type`: whether the request lists every partition of the broker (KIP-516).
LEADER_AND_ISR_INCREMENTAL = 0
LEADER_AND_ISR_FULL = 1

_I32 = {"kafka_type": "int32"}
_I64 = {"kafka_type": "int64"}
_I16 = {"kafka_type": "int16"}
_I8 = {"kafka_type": "int8"}
_BOOL = {"kafka_type": "bool"}
_STR = {"kafka_type": "string"}
_UUID = {"kafka_type": "uuid"}
_ERR = {"kafka_type": "error_code"}


# --- LeaderAndIsr v7 ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrPartitionState:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    partition_index: int = field(metadata=_I32)
    controller_epoch: int = field(metadata=_I32)
    leader: int = field(metadata=_I32)
    leader_epoch: int = field(metadata=_I32)
    isr: tuple[int, ...] = field(metadata=_I32)
    #: The state znode's zkVersion (Kafka's name since 3.3: PartitionEpoch).
    partition_epoch: int = field(metadata=_I32)
    replicas: tuple[int, ...] = field(metadata=_I32)
    adding_replicas: tuple[int, ...] = field(metadata=_I32, default=())
    removing_replicas: tuple[int, ...] = field(metadata=_I32, default=())
    #: Whether the replica is new (created by this request): the broker may create its log.
    is_new: bool = field(metadata=_BOOL, default=False)
    leader_recovery_state: int = field(metadata=_I8, default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrTopicState:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    topic_name: str = field(metadata=_STR)
    topic_id: uuid.UUID = field(metadata=_UUID)
    partition_states: tuple[LeaderAndIsrPartitionState, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrLiveLeader:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    broker_id: int = field(metadata=_I32)
    host_name: str = field(metadata=_STR)
    port: int = field(metadata=_I32)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrRequest:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    controller_id: int = field(metadata=_I32)
    is_kraft_controller: bool = field(metadata=_BOOL, default=False)
    controller_epoch: int = field(metadata=_I32)
    broker_epoch: int = field(metadata=_I64, default=-1)
    type: int = field(metadata=_I8, default=LEADER_AND_ISR_INCREMENTAL)
    topic_states: tuple[LeaderAndIsrTopicState, ...]
    live_leaders: tuple[LeaderAndIsrLiveLeader, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrPartitionError:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    partition_index: int = field(metadata=_I32)
    error_code: ErrorCode = field(metadata=_ERR)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrTopicError:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    topic_id: uuid.UUID = field(metadata=_UUID)
    partition_errors: tuple[LeaderAndIsrPartitionError, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderAndIsrResponse:
    __version__: ClassVar[int] = 7
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = LEADER_AND_ISR_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    error_code: ErrorCode = field(metadata=_ERR)
    topics: tuple[LeaderAndIsrTopicError, ...]


# --- StopReplica v4 --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaPartitionState:
    __version__: ClassVar[int] = 4
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = STOP_REPLICA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    partition_index: int = field(metadata=_I32)
    #: The leader epoch the controller knows (KIP-570); -2 = delete regardless of epoch.
    leader_epoch: int = field(metadata=_I32, default=-1)
    delete_partition: bool = field(metadata=_BOOL)


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaTopicState:
    __version__: ClassVar[int] = 4
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = STOP_REPLICA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    topic_name: str = field(metadata=_STR)
    partition_states: tuple[StopReplicaPartitionState, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaRequest:
    __version__: ClassVar[int] = 4
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = STOP_REPLICA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    controller_id: int = field(metadata=_I32)
    is_kraft_controller: bool = field(metadata=_BOOL, default=False)
    controller_epoch: int = field(metadata=_I32)
    broker_epoch: int = field(metadata=_I64, default=-1)
    topic_states: tuple[StopReplicaTopicState, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaPartitionError:
    __version__: ClassVar[int] = 4
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = STOP_REPLICA_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    topic_name: str = field(metadata=_STR)
    partition_index: int = field(metadata=_I32)
    error_code: ErrorCode = field(metadata=_ERR)


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReplicaResponse:
    __version__: ClassVar[int] = 4
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = STOP_REPLICA_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    error_code: ErrorCode = field(metadata=_ERR)
    partition_errors: tuple[StopReplicaPartitionError, ...]


# --- UpdateMetadata v8 -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataPartitionState:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    partition_index: int = field(metadata=_I32)
    controller_epoch: int = field(metadata=_I32)
    leader: int = field(metadata=_I32)
    leader_epoch: int = field(metadata=_I32)
    isr: tuple[int, ...] = field(metadata=_I32)
    zk_version: int = field(metadata=_I32)
    replicas: tuple[int, ...] = field(metadata=_I32)
    offline_replicas: tuple[int, ...] = field(metadata=_I32, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataTopicState:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    topic_name: str = field(metadata=_STR)
    topic_id: uuid.UUID = field(metadata=_UUID)
    partition_states: tuple[UpdateMetadataPartitionState, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataEndpoint:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    port: int = field(metadata=_I32)
    host: str = field(metadata=_STR)
    listener: str = field(metadata=_STR)
    security_protocol: int = field(metadata=_I16)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataBroker:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    id: int = field(metadata=_I32)
    endpoints: tuple[UpdateMetadataEndpoint, ...]
    rack: str | None = field(metadata=_STR, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataRequest:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _RequestHeaderV2
    controller_id: int = field(metadata=_I32)
    is_kraft_controller: bool = field(metadata=_BOOL, default=False)
    #: KIP-866 tagged field: 0 unknown, 1 incremental, 2 full.
    type: int = field(metadata={"kafka_type": "int8", "tag": 0}, default=0)
    controller_epoch: int = field(metadata=_I32)
    broker_epoch: int = field(metadata=_I64, default=-1)
    topic_states: tuple[UpdateMetadataTopicState, ...]
    live_brokers: tuple[UpdateMetadataBroker, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateMetadataResponse:
    __version__: ClassVar[int] = 8
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[int] = UPDATE_METADATA_KEY
    __header_schema__: ClassVar[type] = _ResponseHeaderV1
    error_code: ErrorCode = field(metadata=_ERR)


ControllerRequest = LeaderAndIsrRequest | StopReplicaRequest | UpdateMetadataRequest
ControllerResponse = LeaderAndIsrResponse | StopReplicaResponse | UpdateMetadataResponse

_PAIRS: dict[int, tuple[type, type]] = {
    LEADER_AND_ISR_KEY: (LeaderAndIsrRequest, LeaderAndIsrResponse),
    STOP_REPLICA_KEY: (StopReplicaRequest, StopReplicaResponse),
    UPDATE_METADATA_KEY: (UpdateMetadataRequest, UpdateMetadataResponse),
}

#: api_key -> the codec of the one version raftka speaks, in `common.wire`'s shape.
CONTROLLER_CODECS: dict[int, ApiCodec] = {
    key: ApiCodec(
        api_key=key, api_version=req.__version__, request_type=req, response_type=resp,
        read_request=entity_reader(req), write_request=entity_writer(req),
        read_response=entity_reader(resp), write_response=entity_writer(resp),
        request_header_version=2, response_header_version=1,
    )
    for key, (req, resp) in _PAIRS.items()
}

_REQUEST_FIXED = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")


def is_controller_request(api_key: int, api_version: int) -> bool:
    codec = CONTROLLER_CODECS.get(api_key)
    return codec is not None and codec.api_version == api_version


def encode_request(correlation_id: int, client_id: str | None, request: ControllerRequest) -> bytes:
    """One complete request frame (size prefix, header v2, body)."""
    codec = CONTROLLER_CODECS.get(getattr(request, "__api_key__", -1))
    if codec is None or type(request) is not codec.request_type:
        raise LocalProtocolError(f"{type(request).__name__} is not a controller-to-broker request")
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_REQUEST_FIXED.pack(codec.api_key, codec.api_version, correlation_id))
    raw = None if client_id is None else client_id.encode()
    out.write(_INT16.pack(-1 if raw is None else len(raw)))
    if raw:
        out.write(raw)
    out.write(b"\0")  # no tagged fields in the header
    codec.write_request(out, request)
    frame = out.getbuffer()
    SIZE_PREFIX.pack_into(frame, 0, frame.nbytes - 4)
    del frame
    return out.getvalue()


def decode_request(frame: memoryview | bytes) -> tuple[RequestHeader, ControllerRequest]:
    """Header and body of a controller request frame (without its size prefix).

    RemoteProtocolError for anything else, or for a body that does not decode.
    """
    frame = memoryview(frame)
    if frame.nbytes < 10:
        raise RemoteProtocolError(f"a request frame of {frame.nbytes} bytes is too short for a request header")
    api_key, api_version, _ = _REQUEST_FIXED.unpack_from(frame, 0)
    if not is_controller_request(api_key, api_version):
        raise RemoteProtocolError(f"api {api_key} v{api_version} is not a controller request raftka serves")
    codec = CONTROLLER_CODECS[api_key]
    try:
        header, pos = parse_request_header(frame, 2)
        body, size = codec.read_request(frame, pos)
    except Exception as exc:  # kio raises SerialError, ValueError, ... on garbage
        raise RemoteProtocolError(f"controller request api {api_key} does not decode: "
                                  f"{type(exc).__name__}: {exc}") from None
    if pos + size != frame.nbytes:
        raise RemoteProtocolError(f"controller request api {api_key}: {frame.nbytes - pos - size} bytes left over")
    return header, body


def encode_response(correlation_id: int, response: ControllerResponse) -> bytes:
    """One complete response frame (size prefix, header v1, body)."""
    codec = CONTROLLER_CODECS[response.__api_key__]
    assert type(response) is codec.response_type, type(response)
    return encode_payload(correlation_id, 1, codec.write_response, response)


def decode_response(frame: memoryview | bytes, api_key: int, expected_correlation_id: int) -> Any:
    """The response body in `frame` (without size prefix) answering `expected_correlation_id`."""
    return _decode_response(memoryview(frame), CONTROLLER_CODECS[api_key], expected_correlation_id)
