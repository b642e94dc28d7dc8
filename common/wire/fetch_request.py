"""A follower's Fetch request encoded by hand (pure).

Theory of operation
-------------------
A follower sends its leader a Fetch after every answer: with fetch sessions
(KIP-227) it names only the partitions whose position moved, so the
request is small, but building it as kio entities (each field's type
checked as it is constructed) and writing them field by field through
kio's serializer cost about as much as the rest of the follower's round.
This module writes Fetch v12 -- the version the broker's replica fetcher
sends -- with `struct`, straight from the fetch plan's tuples, into a body
that `codec.encode_request` frames like any other (`EncodedRequest`).

The layout, from Kafka's FetchRequest.json (flexible, KIP-482: compact
arrays and strings are an unsigned varint length + 1, and a tagged field
section follows each partition, each topic and the body; none is written):

    replica_id int32, max_wait_ms int32, min_bytes int32, max_bytes int32,
    isolation_level int8, session_id int32, session_epoch int32
    topics: compact array of
        topic: compact string, partitions: compact array of
            partition int32, current_leader_epoch int32, fetch_offset int64,
            last_fetched_epoch int32, log_start_offset int64,
            partition_max_bytes int32
    forgotten_topics_data: compact array of
        topic: compact string, partitions: compact array of int32
    rack_id: compact string

Checked byte for byte against kio's encoder in tests/wire/test_wire_fetch_request.py.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from common.varint import uvarint
from common.wire.codec import EncodedRequest, string_bytes
from common.wire.fetch_response import FETCH_KEY

VERSION = 12

_HEAD = struct.Struct(">iiiibii")
_PARTITION = struct.Struct(">iiqiqiB")  # ... and its empty tagged field section
_INT32 = struct.Struct(">i")
_NO_TAGS = b"\0"

#: (partition, current_leader_epoch, fetch_offset, last_fetched_epoch, log_start_offset, partition_max_bytes)
FetchPosition = tuple[int, int, int, int, int, int]


def encode_fetch_v12(
    *,
    replica_id: int,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
    session_id: int,
    session_epoch: int,
    topics: Sequence[tuple[str, Sequence[FetchPosition]]],
    forgotten: Sequence[tuple[str, Sequence[int]]] = (),
    rack_id: str = "",
) -> EncodedRequest:
    """A Fetch v12 request body; `topics` in the order they go on the wire."""
    parts = [_HEAD.pack(replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, session_id, session_epoch),
             uvarint(len(topics) + 1)]
    append = parts.append
    pack_partition = _PARTITION.pack
    for topic, positions in topics:
        append(string_bytes(topic, True))
        append(uvarint(len(positions) + 1))
        for position in positions:
            append(pack_partition(*position, 0))
        append(_NO_TAGS)
    append(uvarint(len(forgotten) + 1))
    for topic, partitions in forgotten:
        append(string_bytes(topic, True))
        append(uvarint(len(partitions) + 1))
        for partition in partitions:
            append(_INT32.pack(partition))
        append(_NO_TAGS)
    append(string_bytes(rack_id, True))
    append(_NO_TAGS)
    return EncodedRequest(FETCH_KEY, VERSION, b"".join(parts))
