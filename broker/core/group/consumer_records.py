"""`__consumer_offsets` records of KIP-848 consumer groups (pure).

Kafka's formats: the key is a version (its record type) and non-flexible
fields; the value a version 0 flexible struct (compact strings and arrays,
an empty tagged-field section after each struct).

    3 ConsumerGroupMetadata            GroupId              -> Epoch
    4 ConsumerGroupPartitionMetadata   GroupId              -> Topics[TopicId, TopicName, NumPartitions, PartitionMetadata[]]
    5 ConsumerGroupMemberMetadata      GroupId, MemberId    -> InstanceId, RackId, ClientId, ClientHost,
                                                               SubscribedTopicNames, SubscribedTopicRegex,
                                                               RebalanceTimeoutMs, ServerAssignor,
                                                               tag 0: ClassicMemberMetadata[SessionTimeoutMs,
                                                                      SupportedProtocols[Name, Metadata]]
    6 ConsumerGroupTargetAssignmentMetadata GroupId         -> AssignmentEpoch
    7 ConsumerGroupTargetAssignmentMember   GroupId, MemberId -> TopicPartitions[TopicId, Partitions]
    8 ConsumerGroupCurrentMemberAssignment  GroupId, MemberId -> MemberEpoch, PreviousMemberEpoch, State,
                                                               AssignedPartitions, PartitionsPendingRevocation
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from broker.core.group.records import GroupRecordError, Record


@dataclass(frozen=True)
class ClassicMeta:
    """What a classic-protocol member of a consumer group joined with: its
    session timeout and its (name, metadata) protocols, in its order."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]

GROUP_METADATA_KEY, PARTITION_METADATA_KEY, MEMBER_METADATA_KEY = 3, 4, 5
TARGET_METADATA_KEY, TARGET_MEMBER_KEY, CURRENT_ASSIGNMENT_KEY = 6, 7, 8
KEY_TYPES = (3, 4, 5, 6, 7, 8)
_WITH_MEMBER = (MEMBER_METADATA_KEY, TARGET_MEMBER_KEY, CURRENT_ASSIGNMENT_KEY)
_I16, _I32, _I8 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">b")


def _key(kind: int, group_id: str, member_id: str = "") -> bytes:
    out = bytearray(_I16.pack(kind))
    for text in (group_id, member_id) if kind in _WITH_MEMBER else (group_id,):
        raw = text.encode()
        out += _I16.pack(len(raw)) + raw
    return bytes(out)


def tombstone(kind: int, group_id: str, member_id: str = "") -> Record:
    return Record(_key(kind, group_id, member_id), None)


# --- flexible value writer/reader -------------------------------------------


def _uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _cstr(out: bytearray, text: str | None) -> None:
    if text is None:
        _uvarint(out, 0)
        return
    raw = text.encode()
    _uvarint(out, len(raw) + 1)
    out += raw


def _value(*parts: bytes, tags: dict[int, bytes] | None = None) -> bytes:
    out = bytearray(_I16.pack(0))
    for p in parts:
        out += p
    _uvarint(out, len(tags or {}))
    for tag, data in sorted((tags or {}).items()):
        _uvarint(out, tag)
        _uvarint(out, len(data))
        out += data
    return bytes(out)


def _cbytes(out: bytearray, data: bytes) -> None:
    _uvarint(out, len(data) + 1)
    out += data


def _partitions(assignment: dict) -> bytes:
    out = bytearray()
    _uvarint(out, len(assignment) + 1)
    for topic_id, partitions in sorted(assignment.items(), key=lambda x: str(x[0])):
        out += topic_id.bytes
        _uvarint(out, len(partitions) + 1)
        for p in sorted(partitions):
            out += _I32.pack(p)
        out.append(0)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise GroupRecordError("a consumer group record ends early: the __consumer_offsets log is damaged")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def i8(self) -> int:
        return _I8.unpack(self.take(1))[0]

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def uvarint(self) -> int:
        shift = n = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n
            shift += 7

    def cstr(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def string(self) -> str:
        return self.take(self.i16()).decode()

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16))

    def skip_tags(self) -> None:
        self.tags()

    def tags(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out

    def cbytes(self) -> bytes:
        return self.take(self.uvarint() - 1)

    def partitions(self) -> dict:
        out = {}
        for _ in range(self.uvarint() - 1):
            topic_id = self.uuid()
            out[topic_id] = frozenset(self.i32() for _ in range(self.uvarint() - 1))
            self.skip_tags()
        return out


# --- records ----------------------------------------------------------------------


def group_metadata_record(group_id: str, epoch: int) -> Record:
    return Record(_key(GROUP_METADATA_KEY, group_id), _value(_I32.pack(epoch)))


def target_metadata_record(group_id: str, assignment_epoch: int) -> Record:
    return Record(_key(TARGET_METADATA_KEY, group_id), _value(_I32.pack(assignment_epoch)))


def partition_metadata_record(group_id: str, topics: dict) -> Record:
    out = bytearray()
    _uvarint(out, len(topics) + 1)
    for name, (topic_id, n) in sorted(topics.items()):
        out += topic_id.bytes
        _cstr(out, name)
        out += _I32.pack(n)
        _uvarint(out, 1)  # PartitionMetadata (racks): not tracked
        out.append(0)
    return Record(_key(PARTITION_METADATA_KEY, group_id), _value(bytes(out)))


def member_metadata_record(group_id: str, m: Any) -> Record:
    out = bytearray()
    _cstr(out, m.instance_id)
    _cstr(out, m.rack_id)
    _cstr(out, m.client_id)
    _cstr(out, m.client_host)
    _uvarint(out, len(m.subscribed_topic_names) + 1)
    for t in m.subscribed_topic_names:
        _cstr(out, t)
    _cstr(out, m.subscribed_topic_regex)
    out += _I32.pack(m.rebalance_timeout_ms)
    _cstr(out, m.server_assignor)
    tags = None
    if m.classic is not None:
        # A member that speaks the classic protocol (JoinGroup/SyncGroup) in
        # a consumer group: Kafka keeps its session timeout and protocols in
        # tagged field 0, so a new coordinator knows to answer it that way.
        classic = bytearray(_I32.pack(m.classic.session_timeout_ms))
        _uvarint(classic, len(m.classic.protocols) + 1)
        for name, metadata in m.classic.protocols:
            _cstr(classic, name)
            _cbytes(classic, metadata)
            classic.append(0)
        classic.append(0)
        tags = {0: bytes(classic)}
    return Record(_key(MEMBER_METADATA_KEY, group_id, m.member_id), _value(bytes(out), tags=tags))


def target_member_record(group_id: str, member_id: str, assignment: dict) -> Record:
    return Record(_key(TARGET_MEMBER_KEY, group_id, member_id), _value(_partitions(assignment)))


def current_assignment_record(group_id: str, m: Any) -> Record:
    return Record(_key(CURRENT_ASSIGNMENT_KEY, group_id, m.member_id), _value(
        _I32.pack(m.member_epoch), _I32.pack(m.previous_member_epoch), _I8.pack(m.state),
        _partitions(m.assigned), _partitions(m.pending_revocation)))


def _member_metadata(v: _Reader, kafka_order: bool) -> dict:
    v.i16()  # value version 0
    decoded: dict[str, Any] = {"instance_id": v.cstr(), "rack_id": v.cstr(), "client_id": v.cstr() or "",
                               "client_host": v.cstr() or ""}
    decoded["subscribed_topic_names"] = tuple(v.cstr() or "" for _ in range(v.uvarint() - 1))
    decoded["subscribed_topic_regex"] = v.cstr()
    if kafka_order:
        decoded["rebalance_timeout_ms"] = v.i32()
        decoded["server_assignor"] = v.cstr()
    else:
        decoded["server_assignor"] = v.cstr()
        decoded["rebalance_timeout_ms"] = v.i32()
    decoded["classic"] = None
    classic = v.tags().get(0)
    if v.pos != len(v.data):
        raise GroupRecordError("a ConsumerGroupMemberMetadata value has bytes after its end")
    if classic is not None:
        c = _Reader(classic)
        session_timeout_ms = c.i32()
        protocols = []
        for _ in range(c.uvarint() - 1):
            name = c.cstr() or ""
            protocols.append((name, c.cbytes()))
            c.skip_tags()
        decoded["classic"] = ClassicMeta(session_timeout_ms, tuple(protocols))
    return decoded


def decode(key: bytes, value: bytes | None) -> tuple[tuple[int, str, str], Any] | None:
    """((type, group, member), decoded value or None) of a consumer group
    record; None for other key types."""
    r = _Reader(key)
    kind = r.i16()
    if kind not in KEY_TYPES:
        return None
    group_id = r.string()
    member_id = r.string() if kind in _WITH_MEMBER else ""
    if value is None:
        return (kind, group_id, member_id), None
    v = _Reader(value)
    v.i16()  # value version 0; later versions only add tagged fields
    if kind in (GROUP_METADATA_KEY, TARGET_METADATA_KEY):
        decoded: Any = v.i32()
    elif kind == PARTITION_METADATA_KEY:
        decoded = {}
        for _ in range(v.uvarint() - 1):
            topic_id = v.uuid()
            name = v.cstr() or ""
            decoded[name] = (topic_id, v.i32())
            for _ in range(v.uvarint() - 1):
                v.i32()
                for _ in range(v.uvarint() - 1):
                    v.cstr()
                v.skip_tags()
            v.skip_tags()
    elif kind == MEMBER_METADATA_KEY:
        try:
            return (kind, group_id, member_id), _member_metadata(_Reader(value), kafka_order=True)
        except GroupRecordError:
            # Written by an earlier raftka, which put ServerAssignor before
            # RebalanceTimeoutMs (Kafka's order is the reverse).
            return (kind, group_id, member_id), _member_metadata(_Reader(value), kafka_order=False)
    elif kind == TARGET_MEMBER_KEY:
        decoded = v.partitions()
    else:
        decoded = {"member_epoch": v.i32(), "previous_member_epoch": v.i32(), "state": v.i8(),
                       "assigned": v.partitions(), "pending_revocation": v.partitions()}
    v.skip_tags()
    return (kind, group_id, member_id), decoded
