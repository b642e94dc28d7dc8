"""The records of `__consumer_offsets`, in Kafka's own binary formats (pure).

Theory of operation
-------------------
A group coordinator's state is the compacted topic `__consumer_offsets`:
each record's key names a thing (a group, or one committed offset of a
group) and its value is that thing's newest state; a null value (a
tombstone) deletes it, and compaction eventually keeps only the newest
record per key. Replaying a partition's records in offset order rebuilds
the state of every group the partition holds.

The bytes are Kafka's, so Kafka's tooling (`kafka-dump-log
--offsets-decoder`, `kafka-console-consumer` with the group formatters)
reads a raftka data dir and the other way round. Every key and value
starts with an int16 version; the bodies are Kafka's non-flexible
encoding (big-endian ints, int16-length strings with -1 for null,
int32-length bytes, int32-count arrays):

    key v0/v1  OffsetCommitKey    group, topic, partition int32
    key v2     GroupMetadataKey   group

    OffsetCommitValue   v0: offset int64, metadata, commit_timestamp int64
                        v1: v0 + expire_timestamp int64 (OffsetCommit v2-v4
                            retention_time, the pre-KIP-211 per-offset expiry)
                        v2: as v0
                        v3: offset, leader_epoch int32, metadata, commit_timestamp
    GroupMetadataValue  v0: protocol_type, generation int32, protocol?, leader?,
                            members [member_id, client_id, client_host,
                            session_timeout int32, subscription bytes,
                            assignment bytes]
                        v1: + member rebalance_timeout int32 (before session)
                        v2: + current_state_timestamp int64 (before members)
                        v3: + member group_instance_id? (after member_id)

raftka writes key v1 and v2, OffsetCommitValue v3 (v1 when the commit
carried an explicit retention time, as Kafka does) and GroupMetadataValue
v3, and reads every version above. Flexible versions (v4+ values, with
tagged fields) are refused with a clear error rather than half-read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from common.errors import RaftkaError

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class GroupRecordError(RaftkaError):
    """A `__consumer_offsets` record could not be decoded: the partition's
    log is damaged or was written in a format raftka does not read (Kafka's
    flexible v4+ values). Remove the partition's data dir to start the
    groups it holds from scratch, or restore it from a replica."""


class Record(NamedTuple):
    """One key/value pair to append to a `__consumer_offsets` partition
    (value None: a tombstone)."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp_ms: int
    leader_epoch: int = -1
    #: -1 unless the commit carried an explicit retention time (value v1).
    expire_timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberMetadata, ...]


# --- records ---------------------------------------------------------------


def offset_commit_record(group: str, topic: str, partition: int, value: OffsetCommitValue | None) -> Record:
    key = encode_key(OffsetCommitKey(group, topic, partition))
    return Record(key, None if value is None else encode_offset_commit_value(value))


def group_metadata_record(group: str, value: GroupMetadataValue | None) -> Record:
    key = encode_key(GroupMetadataKey(group))
    return Record(key, None if value is None else encode_group_metadata_value(value))


def decode_record(
    key: bytes, value: bytes | None
) -> tuple[OffsetCommitKey, OffsetCommitValue | None] | tuple[GroupMetadataKey, GroupMetadataValue | None] | None:
    """The typed key and value of a stored record; None for a key type
    raftka does not know (Kafka's KIP-848 consumer-group and share-group
    records, key versions 3+), which replay skips."""
    decoded_key = decode_key(key)
    if decoded_key is None:
        return None
    if isinstance(decoded_key, OffsetCommitKey):
        return decoded_key, None if value is None else decode_offset_commit_value(value)
    return decoded_key, None if value is None else decode_group_metadata_value(value)


# --- keys ------------------------------------------------------------------


def encode_key(key: OffsetCommitKey | GroupMetadataKey) -> bytes:
    out = bytearray()
    if isinstance(key, OffsetCommitKey):
        out += _I16.pack(OFFSET_COMMIT_KEY_VERSION)
        _put_string(out, key.group)
        _put_string(out, key.topic)
        out += _I32.pack(key.partition)
    else:
        out += _I16.pack(GROUP_METADATA_KEY_VERSION)
        _put_string(out, key.group)
    return bytes(out)


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    r = _Reader(data, "key")
    version = r.int16()
    if version in (0, 1):
        key: OffsetCommitKey | GroupMetadataKey = OffsetCommitKey(r.string(), r.string(), r.int32())
    elif version == 2:
        key = GroupMetadataKey(r.string())
    else:
        return None
    r.done()
    return key


# --- offset commit values ----------------------------------------------------


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    out = bytearray()
    if value.expire_timestamp_ms >= 0:
        out += _I16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
        out += _I64.pack(value.offset)
        _put_string(out, value.metadata)
        out += _I64.pack(value.commit_timestamp_ms)
        out += _I64.pack(value.expire_timestamp_ms)
    else:
        out += _I16.pack(OFFSET_COMMIT_VALUE_VERSION)
        out += _I64.pack(value.offset)
        out += _I32.pack(value.leader_epoch)
        _put_string(out, value.metadata)
        out += _I64.pack(value.commit_timestamp_ms)
    return bytes(out)


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    r = _Reader(data, "OffsetCommitValue")
    version = r.int16()
    if version not in (0, 1, 2, 3):
        raise GroupRecordError(f"OffsetCommitValue version {version} is not one raftka reads (0-3)")
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp_ms = r.int64()
    expire_timestamp_ms = r.int64() if version == 1 else -1
    r.done()
    return OffsetCommitValue(offset, metadata, commit_timestamp_ms, leader_epoch, expire_timestamp_ms)


# --- group metadata values ---------------------------------------------------


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    out = bytearray()
    out += _I16.pack(GROUP_METADATA_VALUE_VERSION)
    _put_string(out, value.protocol_type)
    out += _I32.pack(value.generation)
    _put_nullable_string(out, value.protocol)
    _put_nullable_string(out, value.leader)
    out += _I64.pack(value.current_state_timestamp_ms)
    out += _I32.pack(len(value.members))
    for m in value.members:
        _put_string(out, m.member_id)
        _put_nullable_string(out, m.group_instance_id)
        _put_string(out, m.client_id)
        _put_string(out, m.client_host)
        out += _I32.pack(m.rebalance_timeout_ms)
        out += _I32.pack(m.session_timeout_ms)
        _put_bytes(out, m.subscription)
        _put_bytes(out, m.assignment)
    return bytes(out)


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    r = _Reader(data, "GroupMetadataValue")
    version = r.int16()
    if version not in (0, 1, 2, 3):
        raise GroupRecordError(f"GroupMetadataValue version {version} is not one raftka reads (0-3)")
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_timestamp_ms = r.int64() if version >= 2 else -1
    count = r.int32()
    if count < 0:
        raise GroupRecordError("GroupMetadataValue has a null member array")
    members = []
    for _ in range(count):
        member_id = r.string()
        group_instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout_ms = r.int32() if version >= 1 else -1
        session_timeout_ms = r.int32()
        subscription = r.bytes_()
        assignment = r.bytes_()
        members.append(MemberMetadata(member_id, group_instance_id, client_id, client_host,
                                      rebalance_timeout_ms, session_timeout_ms, subscription, assignment))
    r.done()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, current_state_timestamp_ms, tuple(members))


# --- primitives --------------------------------------------------------------


def _put_string(out: bytearray, text: str) -> None:
    raw = text.encode("utf-8")
    assert len(raw) <= 0x7FFF, "a Kafka string is at most 32767 bytes"
    out += _I16.pack(len(raw))
    out += raw


def _put_nullable_string(out: bytearray, text: str | None) -> None:
    if text is None:
        out += _I16.pack(-1)
    else:
        _put_string(out, text)


def _put_bytes(out: bytearray, data: bytes) -> None:
    out += _I32.pack(len(data))
    out += data


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = bytes(data)
        self.pos = 0
        self.what = what

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise GroupRecordError(f"{self.what} is truncated at byte {self.pos} of {len(self.data)}")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        if n < 0:
            raise GroupRecordError(f"{self.what} has a string of length {n}")
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GroupRecordError(f"{self.what} has a string that is not UTF-8: {exc}") from None

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise GroupRecordError(f"{self.what} has a null where a string is required")
        return text

    def bytes_(self) -> bytes:
        n = self.int32()
        if n < 0:
            raise GroupRecordError(f"{self.what} has a null where bytes are required")
        return self._take(n)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise GroupRecordError(f"{self.what} has {len(self.data) - self.pos} bytes left over")
