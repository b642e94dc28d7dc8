"""Produce requests decoded by hand (pure): the records stay where they arrived.

Theory of operation
-------------------
kio decodes every other request into frozen dataclasses and copies each
bytes field out of the frame. A Produce request is nearly all record bytes,
and the broker only checks a batch's header and CRC before writing it to
its segment as received (docs/architecture.md, "Data flow" 1), so this decoder
reads the few fields around the records with `struct` and hands out each
partition's records as a read-only `memoryview` of the request frame: no
copy, and a few Python steps per partition instead of kio's per-field
machinery. The views point into the server's receive buffer, which does
not reuse that memory while any view of it is alive
(`framing.ReceiveBuffer`).

The body has kio's field names (`transactional_id`, `acks`, `timeout`,
`topic_data[].name`, `.partition_data[].index`, `.records`), plus
`timeout_ms` and `topic_data[].topic_id`. Layouts follow Kafka's
ProduceRequest.json (v3..v13):

    v3..v8   transactional_id: nullable string (int16 length)
             acks int16, timeout_ms int32
             topic_data: array (int32 count) of
                 name: string, partition_data: array of
                     index int32, records: nullable bytes (int32 length)
    v9..v12  the same, flexible (KIP-482): compact arrays, strings and
             bytes (unsigned varint length + 1; 0 is null) and a tagged
             field section after each partition, each topic and the body.
    v13      v12 with each topic named by its 16-byte topic id instead of its
             name (KIP-516); the decoded topic has `name` None and
             `topic_id` set, and the handler looks the name up.

Garbage raises ValueError or struct.error, which `codec.decode_request`
turns into a RemoteProtocolError (the connection closes). Checked against
kio's decoder for every version in tests/wire/test_wire_produce_request.py.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from common.wire.length_check import (past_end, read_compact_bytes_view, read_compact_count, read_compact_string,
                                      skip_tagged_fields)

PRODUCE_KEY = 0
#: The versions decoded here; the rest go to kio.
FIRST_VERSION, LAST_VERSION = 3, 13
FIRST_FLEXIBLE_VERSION = 9
#: From this version topics are named by id (KIP-516).
TOPIC_ID_VERSION = 13

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


class PartitionProduceData(NamedTuple):
    index: int
    #: One record batch (a read-only view of the request frame), or None.
    records: memoryview | None


class TopicProduceData(NamedTuple):
    #: None in a v13 request until the handler resolves `topic_id`.
    name: str | None
    partition_data: tuple[PartitionProduceData, ...]
    #: v13+: the topic's id (the zero id when the client sent it); None before.
    topic_id: uuid.UUID | None = None


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]

    @property
    def timeout(self) -> datetime.timedelta:
        """As kio gives it."""
        return datetime.timedelta(milliseconds=self.timeout_ms)


def _read_legacy(frame: memoryview, pos: int) -> tuple[ProduceRequest, int]:
    start = pos
    end = frame.nbytes
    unpack_i16 = _INT16.unpack_from
    unpack_i32 = _INT32.unpack_from
    (length,) = unpack_i16(frame, pos)
    pos += 2
    transactional_id = None
    if length >= 0:
        if pos + length > end:
            raise past_end("transactional_id")
        transactional_id = str(frame[pos : pos + length], "utf-8")
        pos += length
    elif length != -1:
        raise ValueError(f"transactional_id has length {length}")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(frame, pos)
    pos += 6
    (topic_count,) = unpack_i32(frame, pos)
    pos += 4
    if topic_count < 0:
        raise ValueError(f"topic_data has {topic_count} entries")
    topics = []
    for _ in range(topic_count):
        (length,) = unpack_i16(frame, pos)
        pos += 2
        if length < 0 or pos + length > end:
            raise past_end("a topic name") if length >= 0 else ValueError(f"a topic name has length {length}")
        name = str(frame[pos : pos + length], "utf-8")
        pos += length
        (partition_count,) = unpack_i32(frame, pos)
        pos += 4
        if partition_count < 0:
            raise ValueError(f"partition_data has {partition_count} entries")
        partitions = []
        for _ in range(partition_count):
            index, length = struct.unpack_from(">ii", frame, pos)
            pos += 8
            records = None
            if length >= 0:
                if pos + length > end:
                    raise past_end("records")
                records = frame[pos : pos + length]
                pos += length
            elif length != -1:
                raise ValueError(f"records have length {length}")
            partitions.append(PartitionProduceData(index, records))
        topics.append(TopicProduceData(name, tuple(partitions)))
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics)), pos - start


def _read_flexible(frame: memoryview, pos: int, by_id: bool = False) -> tuple[ProduceRequest, int]:
    # Tag sections are nearly always empty (one 0 byte): read inline.
    start = pos
    transactional_id, pos = read_compact_string(frame, pos, "transactional_id", nullable=True)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(frame, pos)
    topic_count, pos = read_compact_count(frame, pos + 6, "topic_data")
    topics = []
    for _ in range(topic_count):
        topic_id = None
        if by_id:
            if pos + 16 > frame.nbytes:
                raise past_end("a topic id")
            topic_id = uuid.UUID(bytes=bytes(frame[pos : pos + 16]))
            name = None
            pos += 16
        else:
            name, pos = read_compact_string(frame, pos, "a topic name")
        partition_count, pos = read_compact_count(frame, pos, "partition_data")
        partitions = []
        for _ in range(partition_count):
            (index,) = _INT32.unpack_from(frame, pos)
            records, pos = read_compact_bytes_view(frame, pos + 4, "records")
            pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
            partitions.append(PartitionProduceData(index, records))
        pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
        topics.append(TopicProduceData(name, tuple(partitions), topic_id))
    pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics)), pos - start


def produce_request_reader(version: int) -> Callable[[Any, int], tuple[ProduceRequest, int]] | None:
    """The hand decoder of Produce `version` (kio's reader signature:
    `(frame, offset) -> (body, bytes used)`), or None for versions kio decodes."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        return None
    if version >= TOPIC_ID_VERSION:
        return _read_by_id
    return _read_flexible if version >= FIRST_FLEXIBLE_VERSION else _read_legacy


def _read_by_id(frame: memoryview, pos: int) -> tuple[ProduceRequest, int]:
    return _read_flexible(frame, pos, by_id=True)
