"""The leaders in a Metadata v12 answer, read by hand (pure): no kio entities.

Theory of operation
-------------------
A client that only routes records needs one thing per partition from a
Metadata answer: its leader. kio builds a frozen dataclass per partition
and a tuple per replica array, and `codec.decode_response` first walks the
whole body with `length_check` to keep kio from allocating on a bogus
count. `raftka bench failover`'s probe asks for such answers several
times a second while it waits for a dead broker's partitions to move, on
the same cores as the brokers it times: decoding them was most of the
probe's CPU, which the brokers then lacked. With this reader, `raftka
bench failover --led-partitions 10000 --acks all` on a 2-core VM reports
the bench's own CPU from the fence to the last write at 0.21-0.34 s,
against 0.37-0.52 s with kio's decoding.

Layout (Kafka's MetadataResponse.json, v12, flexible: KIP-482 compact
arrays and strings are an unsigned varint length + 1, 0 is null, and a
tagged-field section ends every struct):

    throttle_time_ms int32
    brokers: array of node_id int32, host string, port int32, rack nullable string
    cluster_id nullable string, controller_id int32
    topics: array of
        error_code int16, name nullable string, topic_id uuid, is_internal bool
        partitions: array of
            error_code int16, partition_index int32, leader_id int32, leader_epoch int32,
            replica_nodes, isr_nodes, offline_replicas: arrays of int32
        topic_authorized_operations int32

The answer is {(topic name, partition index): leader id} over the topics
without an error, as `bench.cluster_probes` reads kio's. Nothing is
allocated per count read: an array's entries are skipped by arithmetic and
a count that claims more than the frame holds fails at the next read past
its end. Garbage raises ValueError, IndexError, struct.error or kio's
BufferUnderflow, which `codec.decode_response` turns into a
RemoteProtocolError. Checked against kio's encoder and decoder in
tests/wire/test_wire_metadata_leaders.py.
"""

from __future__ import annotations

import struct

from common.wire.length_check import read_compact_count, read_compact_string, skip_tagged_fields

METADATA_KEY = 3
#: The one version read here (what `bench.cluster_probes` asks in).
VERSION = 12

#: A partition's fixed fields and the first byte of its replica array's count.
_PARTITION = struct.Struct(">hiiiB")
_INT16 = struct.Struct(">h")
_INT32_SIZE = 4
_UUID_SIZE = 16


def read_leaders(frame: memoryview, pos: int) -> tuple[dict[tuple[str | None, int], int], int]:
    """({(topic, partition): leader id}, bytes read) of the Metadata v12
    response body at `frame[pos:]`."""
    start = pos
    pos += _INT32_SIZE  # throttle_time_ms
    brokers, pos = read_compact_count(frame, pos, "brokers")
    for _ in range(brokers):
        pos += _INT32_SIZE  # node_id
        _, pos = read_compact_string(frame, pos, "a broker's host")
        pos += _INT32_SIZE  # port
        _, pos = read_compact_string(frame, pos, "a broker's rack", nullable=True)
        pos = _tags(frame, pos)
    _, pos = read_compact_string(frame, pos, "cluster_id", nullable=True)
    pos += _INT32_SIZE  # controller_id
    topics, pos = read_compact_count(frame, pos, "topics")
    leaders: dict[tuple[str | None, int], int] = {}
    unpack = _PARTITION.unpack_from
    for _ in range(topics):
        (error_code,) = _INT16.unpack_from(frame, pos)
        name, pos = read_compact_string(frame, pos + 2, "a topic's name", nullable=True)
        pos += _UUID_SIZE + 1  # topic_id, is_internal
        partitions, pos = read_compact_count(frame, pos, "a topic's partitions")
        for _ in range(partitions):
            _, index, leader, _, count = unpack(frame, pos)
            # Each id array is nearly always a one-byte count (below 128):
            # read inline, the rest through `_skip_ints`.
            if 0 < count < 0x80:
                pos += 15 + _INT32_SIZE * (count - 1)
            else:
                pos = _skip_ints(frame, pos + 14, "replica_nodes")
            count = frame[pos]
            pos = pos + 1 + _INT32_SIZE * (count - 1) if 0 < count < 0x80 else _skip_ints(frame, pos, "isr_nodes")
            count = frame[pos]
            pos = (pos + 1 + _INT32_SIZE * (count - 1) if 0 < count < 0x80
                   else _skip_ints(frame, pos, "offline_replicas"))
            pos = pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
            if error_code == 0:
                leaders[(name, index)] = leader
        pos += _INT32_SIZE  # topic_authorized_operations
        pos = _tags(frame, pos)
    pos = _tags(frame, pos)
    return leaders, pos - start


def _skip_ints(frame: memoryview, pos: int, what: str) -> int:
    count, pos = read_compact_count(frame, pos, what)
    return pos + _INT32_SIZE * count


def _tags(frame: memoryview, pos: int) -> int:
    return pos + 1 if frame[pos] == 0 else skip_tagged_fields(frame, pos)
