"""Hand-built Produce and Fetch responses (pure: bytes and slices out).

Theory of operation
-------------------
Produce and Fetch are the hot path (ARCHITECTURE "Wire protocols"): their
responses are written with precompiled `struct`s instead of kio. A Fetch
response is a list of parts: small header buffers, and the record bytes as
they are (storage file slices, sent with `os.sendfile`, or buffers), so no
record byte is ever copied into Python. The frame's size prefix is computed
from the parts' lengths.

Layouts follow Kafka's ProduceResponse.json (v3..v13: v10+ may carry the
`current_leader` tagged field of a partition and the response's
`node_endpoints` (KIP-951); v13 names each topic by its topic id) and FetchResponse.json
(v4..v17: v13+ name each topic by its 16-byte topic id instead of its name;
v16+ may end with the `node_endpoints` tagged field, the leaders a client
was told of in `current_leader`; v14, v15 and v17 change only the request).
Versions from 9 (Produce) and 12 (Fetch) are flexible (KIP-482):
compact arrays and strings (unsigned varint length + 1) and a tagged-field
section after every struct. Every encoder is checked against kio's decoder
for every version in tests/broker/test_broker_codec.py.
"""

from __future__ import annotations

import collections
import struct
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from common.wire import RequestHeader, encode_response_header, frame_size_prefix, part_length
from common.varint import uvarint
from common.wire.codec import string_bytes
from common.wire.framing import ResponsePart

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PRODUCE_PARTITION = struct.Struct(">ihqq")  # index, error, base_offset, log_append_time
_I64 = struct.Struct(">q")
_FETCH_PARTITION = struct.Struct(">ihq")  # index, error, high_watermark
_LSO_LOG_START = struct.Struct(">qq")
#: index, error, high_watermark, last_stable_offset, log_start_offset (v5+).
_FETCH_PARTITION_V11 = struct.Struct(">ihqqq")
_ERROR_SESSION = struct.Struct(">hi")
#: A null aborted_transactions array, then preferred_read_replica -1 (v11+).
_NULL_ABORTED_NO_REPLICA = b"\xff\xff\xff\xff" + b"\xff\xff\xff\xff"
_NULL_ABORTED_NO_REPLICA_FLEXIBLE = b"\x00" + b"\xff\xff\xff\xff"
#: `_FETCH_PARTITION_V11`, then a null aborted list, preferred_read_replica
#: -1, no records (and no tagged fields, when flexible): a partition with
#: nothing but its offsets, in one `pack`.
_PLAIN_TAIL = _NULL_ABORTED_NO_REPLICA + b"\x00\x00\x00\x00"  # records: 0 bytes
_PLAIN_TAIL_FLEXIBLE = _NULL_ABORTED_NO_REPLICA_FLEXIBLE + b"\x01" + b"\x00"  # compact 0 bytes; no tags
_FETCH_PARTITION_V11_PLAIN = struct.Struct(f">ihqqq{len(_PLAIN_TAIL)}s")
_FETCH_PARTITION_V11_PLAIN_FLEXIBLE = struct.Struct(f">ihqqq{len(_PLAIN_TAIL_FLEXIBLE)}s")
#: Encoded topic names (a broker serves a bounded set; cleared when full).
_TOPIC_NAMES: dict[str, bytes] = {}
_TOPIC_NAMES_FLEXIBLE: dict[str, bytes] = {}
_TOPIC_NAME_CACHE_SIZE = 4096
_EPOCH_END_OFFSET = struct.Struct(">iqB")  # epoch, end_offset, no tagged fields
_LEADER_ID_EPOCH = struct.Struct(">iiB")  # leader_id, leader_epoch, no tagged fields
_NO_TAGS = b"\x00"
_ZERO_UUID = bytes(16)
_THROTTLE = b"\x00\x00\x00\x00"  # throttle_time_ms 0

PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION = 3, 13
#: From this Produce version topics are named by id (KIP-516).
PRODUCE_TOPIC_ID_VERSION = 13
#: From this Produce version an answer may say where a partition's leader went (KIP-951).
PRODUCE_LEADER_VERSION = 10
FETCH_MIN_VERSION, FETCH_MAX_VERSION = 4, 17
#: From this Fetch version on topics are named by id (KIP-516).
FETCH_TOPIC_ID_VERSION = 13


def nullable_string_bytes(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else _I16.pack(-1)
    return string_bytes(value, flexible)


def array_length_bytes(count: int, flexible: bool) -> bytes:
    if flexible:
        return _ONE_BYTE_UVARINTS[count + 1] if count < 127 else uvarint(count + 1)
    return _I32.pack(count)


_ONE_BYTE_UVARINTS = [bytes((n,)) for n in range(128)]


# --- Produce ----------------------------------------------------------------


class ProducePartitionResult(NamedTuple):
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    #: KIP-467 (v8+): `(batch_index, message)` per record that made the batch fail.
    record_errors: tuple[tuple[int, str | None], ...] = ()
    #: (leader_id, leader_epoch) when this broker is not the leader (v10+, KIP-951).
    current_leader: tuple[int, int] | None = None


#: Error code -> count of the partitions answered with it by the hand-built
#: Produce and Fetch encoders below (Kafka's ErrorsPerSec), or None (not
#: counted). Module-wide because these encoders run per request without the
#: broker at hand, and a process serves one broker's metrics
#: (`broker.shell.metrics.BrokerMetrics` sets them).
produce_error_counts: collections.Counter | None = None
fetch_error_counts: collections.Counter | None = None


def encode_produce_response(
    header: RequestHeader,
    topics: Sequence[tuple[str | uuid.UUID, Sequence[ProducePartitionResult]]],
    node_endpoints: Sequence[tuple[int, str, int, str | None]] = (),
    throttle_ms: int = 0,
) -> bytes:
    """One complete ProduceResponse frame (size prefix included).

    Each topic is keyed by its name below v13 and by its topic id from v13.
    `node_endpoints` ((node id, host, port, rack)) and each partition's
    `current_leader` go out from v10."""
    version = header.api_version
    assert PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION, version
    flexible = version >= 9
    leaders = version >= PRODUCE_LEADER_VERSION
    by_id = version >= PRODUCE_TOPIC_ID_VERSION
    # Response header v1 (a tag buffer) exactly when flexible, as for every
    # API but ApiVersions.
    parts = [_I32.pack(header.correlation_id), _NO_TAGS if flexible else b"",
             array_length_bytes(len(topics), flexible)]
    append = parts.append
    # An empty record_errors array and a null error_message (v8+), and the
    # partition's tag buffer (v9+): what every partition without an error ends with.
    plain_tail = (b"\x01\x00\x00" if flexible else b"\x00\x00\x00\x00\xff\xff") if version >= 8 else b""
    counts = produce_error_counts
    for key, partitions in topics:
        if by_id:
            # The zero id reads as None (kio's null uuid); it is answered as asked.
            append(key.bytes if key is not None else _ZERO_UUID)
        else:
            append(_topic_name(key, flexible))
        append(array_length_bytes(len(partitions), flexible))
        for p in partitions:
            if counts is not None:
                counts[p.error_code] += 1
            append(_PRODUCE_PARTITION.pack(p.partition, p.error_code, p.base_offset, p.log_append_time_ms))
            if version >= 5:
                append(_I64.pack(p.log_start_offset))
            leader = p.current_leader if leaders else None
            if version >= 8 and (p.error_message is not None or p.record_errors or leader is not None):
                append(array_length_bytes(len(p.record_errors), flexible))
                for batch_index, message in p.record_errors:
                    append(_I32.pack(batch_index))
                    append(nullable_string_bytes(message, flexible))
                    if flexible:
                        append(_NO_TAGS)
                append(nullable_string_bytes(p.error_message, flexible))
                if leader is not None:
                    # Tagged field 0, `current_leader`: one tag, 9 bytes.
                    append(b"\x01\x00\x09" + _LEADER_ID_EPOCH.pack(leader[0], leader[1], 0))
                elif flexible:
                    append(_NO_TAGS)
            else:
                append(plain_tail)
        if flexible:
            append(_NO_TAGS)
    append(_I32.pack(throttle_ms) if throttle_ms else _THROTTLE)
    if node_endpoints and leaders:
        append(_node_endpoints_tag(node_endpoints))
    elif flexible:
        append(_NO_TAGS)
    body = b"".join(parts)
    return _I32.pack(len(body)) + body


# --- Fetch ------------------------------------------------------------------


class FetchPartitionResult(NamedTuple):
    partition: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    #: Whole record batches: storage file slices (as `common.wire.FileSlice`) or buffers.
    records: Sequence[ResponsePart] = ()
    #: None: a null list (read_uncommitted); () an empty one (read_committed).
    aborted_transactions: tuple[tuple[int, int], ...] | None = None
    #: (epoch, end_offset) for a follower whose log diverged (v12+, KIP-595).
    diverging_epoch: tuple[int, int] | None = None
    #: (leader_id, leader_epoch) when this broker is not the leader (v12+).
    current_leader: tuple[int, int] | None = None


def records_size(records: Sequence[ResponsePart]) -> int:
    if len(records) == 1:  # a follower's usual read: one slice (no generator to start)
        return part_length(records[0])
    return sum(part_length(p) for p in records)


def encode_fetch_response(
    header: RequestHeader,
    error_code: int,
    session_id: int,
    topics: Sequence[tuple[str | uuid.UUID, Sequence[FetchPartitionResult]]],
    node_endpoints: Sequence[tuple[int, str, int, str | None]] = (),
    throttle_ms: int = 0,
) -> list[ResponsePart]:
    """One complete FetchResponse frame as a list of parts (size prefix first).

    Each topic is keyed by its name below v13 and by its topic id from v13.
    `node_endpoints` ((node id, host, port, rack)) go out from v16.

    A consumer's Fetch is answered with one of these per request, cold (the
    broker slept since the last one), so the common partition (no aborted
    list, no tags) is one `struct` call and the frame's length is summed
    as the parts are made rather than measured again at the end."""
    version = header.api_version
    assert FETCH_MIN_VERSION <= version <= FETCH_MAX_VERSION, version
    flexible = version >= 12
    parts: list[ResponsePart] = [b""]  # the size prefix, filled in last
    out = bytearray(encode_response_header(header))
    out += _I32.pack(throttle_ms)
    if version >= 7:
        out += _ERROR_SESSION.pack(error_code, session_id)
    out += array_length_bytes(len(topics), flexible)
    total = 0
    # A partition with no records, a null aborted list and no tagged field
    # (most of a follower's answer after a failover: a position checked, a
    # HW moved) is one `struct` call with its fixed tail: 4 appends, a
    # `uvarint` and 8 attribute reads fewer per partition.
    plain = (_FETCH_PARTITION_V11_PLAIN_FLEXIBLE if flexible else _FETCH_PARTITION_V11_PLAIN).pack \
        if version >= 11 else None
    plain_tail = _PLAIN_TAIL_FLEXIBLE if flexible else _PLAIN_TAIL
    by_id = version >= FETCH_TOPIC_ID_VERSION
    counts = fetch_error_counts
    if counts is not None:
        counts[error_code] += 1
    for name, partitions in topics:
        if by_id:
            # The zero id reads as None (kio's null uuid); it is answered as asked.
            out += name.bytes if name is not None else _ZERO_UUID
        else:
            out += _topic_name(name, flexible)
        out += array_length_bytes(len(partitions), flexible)
        for p in partitions:
            index, error, high_watermark, last_stable, log_start, records, aborted, diverging, leader = p
            if counts is not None:
                counts[error] += 1
            if plain is not None and not records and aborted is None and diverging is None and leader is None:
                out += plain(index, error, high_watermark, last_stable, log_start, plain_tail)
                continue
            size = records_size(records) if records else 0
            if aborted is None and version >= 11:
                # The common case: a null aborted list, preferred_read_replica -1.
                out += _FETCH_PARTITION_V11.pack(index, error, high_watermark, last_stable, log_start)
                out += _NULL_ABORTED_NO_REPLICA_FLEXIBLE if flexible else _NULL_ABORTED_NO_REPLICA
            else:
                out += _FETCH_PARTITION.pack(index, error, high_watermark)
                if version >= 5:
                    out += _LSO_LOG_START.pack(last_stable, log_start)
                else:
                    out += _I64.pack(last_stable)
                if aborted is None:
                    out += b"\x00" if flexible else _I32.pack(-1)
                else:
                    out += array_length_bytes(len(aborted), flexible)
                    for producer_id, first_offset in aborted:
                        out += _LSO_LOG_START.pack(producer_id, first_offset)
                        if flexible:
                            out += _NO_TAGS
                if version >= 11:
                    out += _I32.pack(-1)  # preferred_read_replica
            if flexible:
                out += _ONE_BYTE_UVARINTS[size + 1] if size < 127 else uvarint(size + 1)
            else:
                out += _I32.pack(size)
            if size:
                total += len(out) + size
                parts.append(bytes(out))
                if len(records) == 1:  # a follower's usual read: one slice, `size` bytes long
                    parts.append(records[0])
                else:
                    parts.extend(r for r in records if part_length(r))
                out = bytearray()
            if flexible:
                out += (_NO_TAGS if diverging is None and leader is None
                        else _partition_tags(p))
        if flexible:
            out += _NO_TAGS
    if node_endpoints and version >= 16:
        out += _node_endpoints_tag(node_endpoints)
    elif flexible:
        out += _NO_TAGS
    total += len(out)
    parts.append(bytes(out))
    parts[0] = frame_size_prefix((total,))
    return parts


def _topic_name(name: str, flexible: bool) -> bytes:
    """A topic name as a (compact) string, encoded once per name."""
    cache = _TOPIC_NAMES_FLEXIBLE if flexible else _TOPIC_NAMES
    encoded = cache.get(name)
    if encoded is None:
        if len(cache) >= _TOPIC_NAME_CACHE_SIZE:
            cache.clear()
        encoded = cache[name] = string_bytes(name, flexible)
    return encoded


def _node_endpoints_tag(node_endpoints: Sequence[tuple[int, str, int, str | None]]) -> bytes:
    """The response's tagged fields holding only tag 0, `node_endpoints`
    (KIP-951): a compact array of (node_id, host, port, rack)."""
    body = bytearray(array_length_bytes(len(node_endpoints), True))
    for node_id, host, port, rack in node_endpoints:
        body += _I32.pack(node_id) + string_bytes(host, True) + _I32.pack(port)
        body += nullable_string_bytes(rack, True) + _NO_TAGS
    return b"\x01" + b"\x00" + uvarint(len(body)) + bytes(body)


def _partition_tags(p: FetchPartitionResult) -> bytes:
    tags = []
    if p.diverging_epoch is not None:
        tags.append((0, _EPOCH_END_OFFSET.pack(p.diverging_epoch[0], p.diverging_epoch[1], 0)))
    if p.current_leader is not None:
        tags.append((1, _LEADER_ID_EPOCH.pack(p.current_leader[0], p.current_leader[1], 0)))
    if not tags:
        return _NO_TAGS
    out = bytearray(uvarint(len(tags)))
    for tag, body in tags:
        out += uvarint(tag) + uvarint(len(body)) + body
    return bytes(out)
