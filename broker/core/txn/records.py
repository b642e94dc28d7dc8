"""The records of `__transaction_state`, in Kafka's own binary format (pure).

Theory of operation
-------------------
The transaction coordinator's state is the compacted topic
`__transaction_state`: each record's key is a transactional id and its
value that id's newest `TransactionMetadata` (a null value, a tombstone,
forgets the id once it expired). Replaying a partition's records in offset
order rebuilds every transactional id the partition holds.

The bytes are Kafka's (`TransactionLogKey.json`, `TransactionLogValue.json`
of Kafka's transaction coordinator), each prefixed by its int16 version,
so `kafka-dump-log --transaction-log-decoder` reads a raftka data dir:

    key v0    transactional_id string
    value v0  producer_id int64, producer_epoch int16,
              transaction_timeout_ms int32, transaction_status int8,
              transaction_partitions [topic string, partition_ids [int32]]?,
              last_update_timestamp_ms int64, start_timestamp_ms int64
    value v1  the same fields in the flexible encoding (compact strings and
              arrays, tagged fields), plus tagged previous_producer_id (0),
              next_producer_id (1), client_transaction_version (2)

raftka writes value v0 for a transaction of a client that speaks
transactions v1, and v1 for one that speaks v2 (EndTxn v5, Produce v12,
TxnOffsetCommit v5): its client transaction version and next producer id
must survive a coordinator failover. It reads both. Partitions are null in
the Empty state.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from broker.core.txn.state import TxnState
from common.errors import RaftkaError

KEY_VERSION = 0
VALUE_VERSION = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_VALUE_HEAD = struct.Struct(">qhib")
_VALUE_TAIL = struct.Struct(">qq")


class TransactionRecordError(RaftkaError):
    """A `__transaction_state` record that is not in Kafka's format (another
    tool wrote the topic, or the log is damaged): the partition's
    transactional ids cannot be loaded; repair or remove the record."""


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TxnState
    #: topic -> partitions, sorted; empty in the Empty state.
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    return _I16.pack(KEY_VERSION) + _I16.pack(len(raw)) + raw


def decode_key(key: bytes) -> str:
    try:
        (version,) = _I16.unpack_from(key, 0)
        if version != KEY_VERSION:
            raise TransactionRecordError(f"unknown __transaction_state key version {version}")
        (length,) = _I16.unpack_from(key, 2)
        if length < 0 or 4 + length != len(key):
            raise TransactionRecordError(f"bad transactional id length {length} in a {len(key)}-byte key")
        return key[4:4 + length].decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise TransactionRecordError(f"cannot decode a __transaction_state key: {exc}") from None


def encode_value(value: TransactionLogValue) -> bytes:
    if value.client_transaction_version >= 2:
        return _encode_v1(value)
    out = bytearray(_I16.pack(VALUE_VERSION))
    out += _VALUE_HEAD.pack(value.producer_id, value.producer_epoch, value.transaction_timeout_ms,
                            value.state.id)
    if value.state is TxnState.EMPTY:
        assert not value.partitions, "an Empty transaction has no partitions"
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(value.partitions))
        for topic, partitions in value.partitions:
            raw = topic.encode()
            out += _I16.pack(len(raw)) + raw + _I32.pack(len(partitions))
            for p in partitions:
                out += _I32.pack(p)
    out += _VALUE_TAIL.pack(value.last_update_timestamp_ms, value.start_timestamp_ms)
    return bytes(out)


def decode_value(value: bytes | None) -> TransactionLogValue | None:
    """The value, or None for a tombstone."""
    if value is None:
        return None
    try:
        (version,) = _I16.unpack_from(value, 0)
        if version == 0:
            return _decode_v0(value)
        if version == 1:
            return _decode_v1(value)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise TransactionRecordError(f"cannot decode a __transaction_state value: {exc}") from None
    raise TransactionRecordError(f"unknown __transaction_state value version {version}")


def _decode_v0(buf: bytes) -> TransactionLogValue:
    pid, epoch, timeout, status = _VALUE_HEAD.unpack_from(buf, 2)
    pos = 2 + _VALUE_HEAD.size
    (count,) = _I32.unpack_from(buf, pos)
    pos += 4
    partitions = []
    for _ in range(max(count, 0)):
        (n,) = _I16.unpack_from(buf, pos)
        topic = buf[pos + 2:pos + 2 + n].decode()
        pos += 2 + n
        (k,) = _I32.unpack_from(buf, pos)
        pos += 4
        ids = struct.unpack_from(f">{k}i", buf, pos)
        pos += 4 * k
        partitions.append((topic, tuple(sorted(ids))))
    last_update, start = _VALUE_TAIL.unpack_from(buf, pos)
    if pos + _VALUE_TAIL.size != len(buf):
        raise TransactionRecordError(f"{len(buf) - pos - _VALUE_TAIL.size} trailing bytes in a value v0")
    return TransactionLogValue(pid, epoch, timeout, TxnState.from_id(status), tuple(sorted(partitions)),
                               last_update, start)


def _put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _encode_v1(value: TransactionLogValue) -> bytes:
    out = bytearray(_I16.pack(1))
    out += _VALUE_HEAD.pack(value.producer_id, value.producer_epoch, value.transaction_timeout_ms,
                            value.state.id)
    if value.state is TxnState.EMPTY:
        assert not value.partitions, "an Empty transaction has no partitions"
        out.append(0)  # a null compact array
    else:
        _put_uvarint(out, len(value.partitions) + 1)
        for topic, partitions in value.partitions:
            raw = topic.encode()
            _put_uvarint(out, len(raw) + 1)
            out += raw
            _put_uvarint(out, len(partitions) + 1)
            for p in partitions:
                out += _I32.pack(p)
            out.append(0)  # no tagged fields
    out += _VALUE_TAIL.pack(value.last_update_timestamp_ms, value.start_timestamp_ms)
    # Tagged fields, in tag order: previous (0) and next (1) producer id,
    # client transaction version (2); each written only when set, as Kafka.
    tagged = []
    if value.previous_producer_id >= 0:
        tagged.append((0, _I64.pack(value.previous_producer_id)))
    if value.next_producer_id >= 0:
        tagged.append((1, _I64.pack(value.next_producer_id)))
    if value.client_transaction_version:
        tagged.append((2, _I16.pack(value.client_transaction_version)))
    _put_uvarint(out, len(tagged))
    for tag, raw in tagged:
        _put_uvarint(out, tag)
        _put_uvarint(out, len(raw))
        out += raw
    return bytes(out)


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _skip_tagged(buf: bytes, pos: int) -> tuple[dict[int, bytes], int]:
    count, pos = _uvarint(buf, pos)
    fields = {}
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        fields[tag] = buf[pos:pos + size]
        pos += size
    return fields, pos


def _decode_v1(buf: bytes) -> TransactionLogValue:
    pid, epoch, timeout, status = _VALUE_HEAD.unpack_from(buf, 2)
    pos = 2 + _VALUE_HEAD.size
    count, pos = _uvarint(buf, pos)
    partitions = []
    for _ in range(max(count - 1, 0)):
        n, pos = _uvarint(buf, pos)
        topic = buf[pos:pos + n - 1].decode()
        pos += n - 1
        k, pos = _uvarint(buf, pos)
        ids = struct.unpack_from(f">{k - 1}i", buf, pos)
        pos += 4 * (k - 1)
        _, pos = _skip_tagged(buf, pos)
        partitions.append((topic, tuple(sorted(ids))))
    last_update, start = _VALUE_TAIL.unpack_from(buf, pos)
    tagged, _pos = _skip_tagged(buf, pos + _VALUE_TAIL.size)
    previous = _I64.unpack(tagged[0])[0] if len(tagged.get(0, b"")) == 8 else -1
    following = _I64.unpack(tagged[1])[0] if len(tagged.get(1, b"")) == 8 else -1
    version = _I16.unpack(tagged[2])[0] if len(tagged.get(2, b"")) == 2 else 0
    return TransactionLogValue(pid, epoch, timeout, TxnState.from_id(status), tuple(sorted(partitions)),
                               last_update, start, previous, following, version)
