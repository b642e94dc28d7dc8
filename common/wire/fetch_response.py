"""Fetch responses decoded by hand (pure): the records stay where they arrived.

Theory of operation
-------------------
A follower's Fetch response is nearly all record bytes, which the follower
writes to its log as received (after checking each batch's header and CRC).
kio copies every `records` field out of the frame into a new `bytes`, and
walks every field with its generic machinery: work per byte replicated, on
every follower, that it does not need. This decoder
reads the fields around the records with `struct` and hands out each
partition's records as a read-only `memoryview` of the response frame. The
views point into the client's receive buffer, which does not reuse that
memory while any view of it is alive (`framing.ReceiveBuffer`).

The body has kio's field names and defaults (`throttle_time`,
`error_code`, `session_id`, `responses[].topic`, `.partitions[]` with
`partition_index`, `error_code`, `high_watermark`, `last_stable_offset`,
`log_start_offset`, `diverging_epoch`, `current_leader`, `snapshot_id`,
`aborted_transactions`, `preferred_read_replica`, `records`), so a caller
cannot tell it from kio's but for `records` being a memoryview. Only v12 is
decoded here, the version raftka's followers send (the last that names
topics); the rest go to kio. Its layout, from Kafka's FetchResponse.json,
flexible (KIP-482: compact arrays, strings and bytes are an unsigned varint
length + 1, 0 is null, and a tagged-field section ends every struct):

    throttle_time_ms int32, error_code int16, session_id int32
    responses: array of
        topic: string, partitions: array of
            partition_index int32, error_code int16, high_watermark int64,
            last_stable_offset int64, log_start_offset int64,
            aborted_transactions: nullable array of
                producer_id int64, first_offset int64
            preferred_read_replica int32, records: nullable bytes
            tags: 0 diverging_epoch {epoch int32, end_offset int64},
                  1 current_leader {leader_id int32, leader_epoch int32},
                  2 snapshot_id {end_offset int64, epoch int32}

Garbage raises ValueError, IndexError or struct.error, which
`codec.decode_response` turns into a RemoteProtocolError (the connection
closes). Checked against kio's encoder and decoder in
tests/wire/test_wire_fetch_response.py.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from kio._kio_native import read_unsigned_varint

from common.frozen import new_tuple
from common.wire.length_check import (past_end, read_compact_bytes_view, read_compact_count, read_compact_string,
                                      skip_tagged_fields)

FETCH_KEY = 1
#: The one version decoded here; the rest go to kio.
VERSION = 12

_HEAD = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION = struct.Struct(">ihqqq")  # index, error, high_watermark, last_stable_offset, log_start_offset
#: ... then, as they mostly are: the aborted transactions' one-byte compact
#: length (0: null), preferred_read_replica and the records' first length byte.
_PLAIN_PARTITION = struct.Struct(">ihqqqBiB")
_INT32 = struct.Struct(">i")
_ABORTED = struct.Struct(">qq")
_EPOCH_END_OFFSET = struct.Struct(">iq")
_LEADER_ID_EPOCH = struct.Struct(">ii")
_SNAPSHOT_ID = struct.Struct(">qi")
#: The partition's tagged fields by tag.
_TAGGED = {0: _EPOCH_END_OFFSET, 1: _LEADER_ID_EPOCH, 2: _SNAPSHOT_ID}


class EpochEndOffset(NamedTuple):
    epoch: int = -1
    end_offset: int = -1


class LeaderIdAndEpoch(NamedTuple):
    leader_id: int = -1
    leader_epoch: int = -1


class SnapshotId(NamedTuple):
    end_offset: int = -1
    epoch: int = -1


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int


_NO_DIVERGENCE = EpochEndOffset()
_NO_LEADER = LeaderIdAndEpoch()
_NO_SNAPSHOT = SnapshotId()


class PartitionData(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset
    current_leader: LeaderIdAndEpoch
    snapshot_id: SnapshotId
    aborted_transactions: tuple[AbortedTransaction, ...] | None
    preferred_read_replica: int
    #: The record batches (a read-only view of the response frame), or None.
    records: memoryview | None


class FetchableTopicResponse(NamedTuple):
    topic: str
    partitions: tuple[PartitionData, ...]


class FetchResponse(NamedTuple):
    throttle_time_ms: int
    error_code: int
    session_id: int
    responses: tuple[FetchableTopicResponse, ...]

    @property
    def throttle_time(self) -> datetime.timedelta:
        """As kio gives it."""
        return datetime.timedelta(milliseconds=self.throttle_time_ms)


def _partition_tags(frame: memoryview, pos: int) -> tuple[EpochEndOffset, LeaderIdAndEpoch, SnapshotId, int]:
    """The tagged fields of a partition (nearly always none: one 0 byte)."""
    diverging, leader, snapshot = _NO_DIVERGENCE, _NO_LEADER, _NO_SNAPSHOT
    count, n = read_unsigned_varint(frame, pos)
    pos += n
    end = frame.nbytes
    for _ in range(count):
        tag, n = read_unsigned_varint(frame, pos)
        pos += n
        size, n = read_unsigned_varint(frame, pos)
        pos += n
        if pos + size > end:
            raise past_end(f"tagged field {tag}")
        # Each struct ends in its own tagged-field section, skipped with the
        # rest of the tag's bytes; an unknown tag is skipped whole.
        layout = _TAGGED.get(tag)
        if layout is not None:
            if size < layout.size:
                raise ValueError(f"tagged field {tag} has {size} bytes, fewer than its {layout.size}")
            values = layout.unpack_from(frame, pos)
            if tag == 0:
                diverging = EpochEndOffset(*values)
            elif tag == 1:
                leader = LeaderIdAndEpoch(*values)
            else:
                snapshot = SnapshotId(*values)
        pos += size
    return diverging, leader, snapshot, pos


def read_fetch_response(frame: memoryview, pos: int) -> tuple[FetchResponse, int]:
    """Fetch v12 response body at `pos`: (body, bytes used), kio's reader signature."""
    start = pos
    uvarint = read_unsigned_varint
    new_partition = new_tuple  # a local: read per partition
    frame_end = frame.nbytes
    throttle_ms, error_code, session_id = _HEAD.unpack_from(frame, pos)
    topic_count, pos = read_compact_count(frame, pos + _HEAD.size, "responses")
    topics = []
    for _ in range(topic_count):
        name, pos = read_compact_string(frame, pos, "a topic name")
        partition_count, pos = read_compact_count(frame, pos, "partitions")
        partitions = []
        for _ in range(partition_count):
            # A follower's answers name thousands of partitions (a fence):
            # the usual one (no aborted transactions, records under 127
            # bytes or none, no tagged fields) is read with one unpack and
            # no Python call; anything else takes the general path below.
            index, p_error, hw, lso, log_start, aborted_count, preferred, size = _PLAIN_PARTITION.unpack_from(
                frame, pos)
            if aborted_count == 0 and size < 0x80:
                pos += _PLAIN_PARTITION.size
                aborted = None
                if size:
                    end = pos + size - 1
                    if end > frame_end:
                        raise past_end("records")
                    records = frame[pos:end]
                    pos = end
                else:
                    records = None
            else:
                pos += _PARTITION.size
                aborted_count, n = uvarint(frame, pos)
                pos += n
                aborted = None
                if aborted_count:
                    aborted = []
                    for _ in range(aborted_count - 1):
                        aborted.append(AbortedTransaction(*_ABORTED.unpack_from(frame, pos)))
                        pos = skip_tagged_fields(frame, pos + _ABORTED.size)
                    aborted = tuple(aborted)
                (preferred,) = _INT32.unpack_from(frame, pos)
                records, pos = read_compact_bytes_view(frame, pos + 4, "records")
            if frame[pos] == 0:
                pos += 1
                diverging, leader, snapshot = _NO_DIVERGENCE, _NO_LEADER, _NO_SNAPSHOT
            else:
                diverging, leader, snapshot, pos = _partition_tags(frame, pos)
            partitions.append(new_partition(PartitionData, (index, p_error, hw, lso, log_start, diverging, leader,
                                                            snapshot, aborted, preferred, records)))
        pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
        topics.append(FetchableTopicResponse(name, tuple(partitions)))
    pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
    return FetchResponse(throttle_ms, error_code, session_id, tuple(topics)), pos - start


def fetch_response_reader(version: int) -> Callable[[Any, int], tuple[FetchResponse, int]] | None:
    """The hand decoder of Fetch response `version`, or None for versions kio decodes."""
    return read_fetch_response if version == VERSION else None
