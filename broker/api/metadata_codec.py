"""Metadata responses written by hand, each topic's bytes kept while its image does not change.

Theory of operation
-------------------
A client that knows 10,000 partitions asks for all of them in every
Metadata request. Built as kio entities and encoded by kio, one answer cost
the broker about 100 ms (40 ms building, 65 ms encoding): a client
refreshing every second during a failover took a tenth of a core from a
broker busy moving leaders, and Kafka clients refresh more often than that
while partitions have no leader.

An answer is the same bytes as long as the image is, and the image changes
by sharing: a `TopicImage` no record touched is the same object in the next
image. So `MetadataEncoder` keeps each topic's encoded bytes by (version,
topic name) together with the `TopicImage` object, the live-broker set and
the brokers' offline log dirs they were made from, and makes them again
only when one differs. An
answer is then the header, the live brokers, and the kept topics.

Layout (Kafka's MetadataResponse.json, v1..v13; flexible from v9, KIP-482):

    response  throttle_time_ms (v3+), brokers, cluster_id (v2+),
              controller_id, topics, cluster_authorized_operations (v8-v10),
              error_code (v13+: a request-wide error; raftka has none)
    broker    node_id, host, port, rack
    topic     error_code, name (nullable in v12), topic_id (v10+),
              is_internal, partitions, topic_authorized_operations (v8+)
    partition error_code, partition_index, leader_id, leader_epoch (v7+),
              replica_nodes, isr_nodes, offline_replicas (v5+: on a
              broker not live, or in a log dir its broker reports offline)

Every struct ends with a tagged-field section when flexible. Checked
against kio's decoder for every version in tests/broker/test_broker_codec.py.
"""

from __future__ import annotations

import struct
import uuid

from kio.schema.errors import ErrorCode

from broker.api.codec import array_length_bytes, nullable_string_bytes, string_bytes
from quorum.metadata import MetadataImage

METADATA_MIN_VERSION, METADATA_MAX_VERSION = 1, 13
#: Kafka's "authorized operations not requested" (INT32_MIN).
NO_OPERATIONS = -2147483648
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">hii")  # error_code, partition_index, leader_id
_NO_TAGS = b"\x00"
_NULL_UUID = bytes(16)
#: Cached topics beyond this many per topic in the image are dropped (deleted topics).
_SLACK = 64


class MetadataEncoder:
    """Metadata answers of one broker (see the module docstring)."""

    def __init__(self) -> None:
        #: (version, name) -> (TopicImage, (live broker ids, offline log dirs), internal, bytes).
        self._topics: dict[tuple[int, str], tuple[object, tuple, bool, bytes]] = {}

    def encode(self, correlation_id: int, version: int, image: MetadataImage,
               brokers: list[tuple[int, str, int, str | None]], cluster_id: str, controller_id: int,
               topics: list[tuple[str | None, ErrorCode | None]], internal: frozenset[str]) -> bytes:
        """One complete MetadataResponse frame (size prefix included).

        `brokers`: the live ones, (id, host, port, rack); `topics`: in the
        order asked, (name, error) where error None means "answer from the
        image" and a code means the topic is answered with that error and no
        partitions; `internal`: the names to mark `is_internal`."""
        assert METADATA_MIN_VERSION <= version <= METADATA_MAX_VERSION, version
        flexible = version >= 9
        live = frozenset(b[0] for b in brokers)
        offline_dirs = image.offline_log_dirs()
        made_from = (live, frozenset(offline_dirs.items()))
        if len(self._topics) > len(image.topics_by_id) * 2 + _SLACK:
            self._topics.clear()
        parts = [_I32.pack(correlation_id), _NO_TAGS if flexible else b""]
        if version >= 3:
            parts.append(b"\x00\x00\x00\x00")  # throttle_time_ms
        parts.append(array_length_bytes(len(brokers), flexible))
        for node_id, host, port, rack in brokers:
            parts.append(_I32.pack(node_id) + string_bytes(host, flexible) + _I32.pack(port)
                         + nullable_string_bytes(rack, flexible) + (_NO_TAGS if flexible else b""))
        if version >= 2:
            parts.append(nullable_string_bytes(cluster_id, flexible))
        parts.append(_I32.pack(controller_id))
        parts.append(array_length_bytes(len(topics), flexible))
        for name, error in topics:
            if error is not None:
                parts.append(_topic_bytes(version, name, None, error, name in internal, (), live, offline_dirs))
                continue
            topic = image.topic(name)
            is_internal = name in internal
            kept = self._topics.get((version, name))
            if kept is None or kept[0] is not topic or kept[1] != made_from or kept[2] != is_internal:
                encoded = _topic_bytes(version, name, topic.topic_id, ErrorCode.none, is_internal,
                                       sorted(topic.partitions.items()), live, offline_dirs)
                kept = self._topics[(version, name)] = (topic, made_from, is_internal, encoded)
            parts.append(kept[3])
        if 8 <= version <= 10:
            parts.append(_I32.pack(NO_OPERATIONS))
        if version >= 13:
            parts.append(b"\x00\x00")  # error_code NONE
        if flexible:
            parts.append(_NO_TAGS)
        body = b"".join(parts)
        return _I32.pack(len(body)) + body


def _topic_bytes(version: int, name: str | None, topic_id: uuid.UUID | None, error: ErrorCode, is_internal: bool,
                 partitions, live: frozenset[int], offline_dirs: dict[int, frozenset[uuid.UUID]]) -> bytes:
    flexible = version >= 9
    tags = _NO_TAGS if flexible else b""
    out = [_I16.pack(error)]
    if version >= 12:
        out.append(nullable_string_bytes(name, flexible))
    else:
        out.append(string_bytes(name or "", flexible))
    if version >= 10:
        out.append(_NULL_UUID if topic_id is None else topic_id.bytes)
    out.append(b"\x01" if is_internal else b"\x00")
    out.append(array_length_bytes(len(partitions), flexible))
    # One struct.pack per partition, its format made once per shape
    # (version and array lengths): 5.6 -> 2.1 us per partition at v12,
    # against a pack per field and per array. A failover re-encodes every
    # topic of the moved partitions (once when the victim leaves the live
    # set, again as its partitions move) while the probe or clients refresh.
    with_epoch, with_offline = version >= 7, version >= 5
    count = 1 if flexible else 0  # compact arrays carry length + 1
    for index, p in partitions:
        replicas, isr, leader = p.replicas, p.isr, p.leader
        if leader in live:
            head = (ErrorCode.none, index, leader)
        else:
            head = (ErrorCode.leader_not_available, index, -1)
        if not with_offline:
            offline = ()
        elif offline_dirs and p.directories:
            offline = p.offline_replicas(live, offline_dirs)
        else:
            offline = () if live.issuperset(replicas) else [r for r in replicas if r not in live]
        shape = _partition_shape(version, len(replicas), len(isr), len(offline))
        if shape is None:  # an array too long for a one-byte compact length
            out.append(_partition_bytes_slow(version, head, p, offline, tags))
            continue
        args = (*head, p.leader_epoch) if with_epoch else head
        args = (*args, len(replicas) + count, *replicas, len(isr) + count, *isr)
        if with_offline:
            args = (*args, len(offline) + count, *offline)
        out.append(shape.pack(*args, 0) if flexible else shape.pack(*args))
    if version >= 8:
        out.append(_I32.pack(NO_OPERATIONS))
    out.append(tags)
    return b"".join(out)


_SHAPES: dict[tuple[int, int, int, int], struct.Struct] = {}


def _partition_shape(version: int, replicas: int, isr: int, offline: int) -> struct.Struct | None:
    """The struct of one partition entry of `version` with arrays of these
    lengths (lengths and tagged fields included); None when a compact
    array length would take more than one byte."""
    key = (version, replicas, isr, offline)
    shape = _SHAPES.get(key)
    if shape is None:
        flexible = version >= 9
        if flexible and max(replicas, isr, offline) >= 127:
            return None
        n = "B" if flexible else "i"
        shape = _SHAPES[key] = struct.Struct(
            ">hii" + ("i" if version >= 7 else "") + n + "i" * replicas + n + "i" * isr
            + (n + "i" * offline if version >= 5 else "") + ("B" if flexible else ""))
    return shape


def _partition_bytes_slow(version: int, head: tuple[int, int, int], p, offline, tags: bytes) -> bytes:
    flexible = version >= 9
    out = [_PARTITION_HEAD.pack(*head)]
    if version >= 7:
        out.append(_I32.pack(p.leader_epoch))
    out.append(_int32_array(p.replicas, flexible))
    out.append(_int32_array(p.isr, flexible))
    if version >= 5:
        out.append(_int32_array(offline, flexible))
    out.append(tags)
    return b"".join(out)


def _int32_array(values, flexible: bool) -> bytes:
    return array_length_bytes(len(values), flexible) + struct.pack(f">{len(values)}i", *values)
