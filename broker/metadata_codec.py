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
topic name) together with the `TopicImage` object and the live-broker set
they were made from, and makes them again only when either differs. An
answer is then the header, the live brokers, and the kept topics.

Layout (Kafka's MetadataResponse.json, v1..v12; flexible from v9, KIP-482):

    response  throttle_time_ms (v3+), brokers, cluster_id (v2+),
              controller_id, topics, cluster_authorized_operations (v8-v10)
    broker    node_id, host, port, rack
    topic     error_code, name (nullable in v12), topic_id (v10+),
              is_internal, partitions, topic_authorized_operations (v8+)
    partition error_code, partition_index, leader_id, leader_epoch (v7+),
              replica_nodes, isr_nodes, offline_replicas (v5+)

Every struct ends with a tagged-field section when flexible. Checked
against kio's decoder for every version in tests/broker/test_broker_codec.py.
"""

from __future__ import annotations

import struct
import uuid

from kio.schema.errors import ErrorCode

from broker.codec import array_length_bytes, nullable_string_bytes, string_bytes
from quorum.metadata import MetadataImage

METADATA_MIN_VERSION, METADATA_MAX_VERSION = 1, 12
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
        #: (version, name) -> (TopicImage, live broker ids, internal, bytes).
        self._topics: dict[tuple[int, str], tuple[object, frozenset[int], bool, bytes]] = {}

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
                parts.append(_topic_bytes(version, name, None, error, name in internal, (), live))
                continue
            topic = image.topic(name)
            is_internal = name in internal
            kept = self._topics.get((version, name))
            if kept is None or kept[0] is not topic or kept[1] != live or kept[2] != is_internal:
                encoded = _topic_bytes(version, name, topic.topic_id, ErrorCode.none, is_internal,
                                       sorted(topic.partitions.items()), live)
                kept = self._topics[(version, name)] = (topic, live, is_internal, encoded)
            parts.append(kept[3])
        if 8 <= version <= 10:
            parts.append(_I32.pack(NO_OPERATIONS))
        if flexible:
            parts.append(_NO_TAGS)
        body = b"".join(parts)
        return _I32.pack(len(body)) + body


def _topic_bytes(version: int, name: str | None, topic_id: uuid.UUID | None, error: ErrorCode, is_internal: bool,
                 partitions, live: frozenset[int]) -> bytes:
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
    for index, p in partitions:
        leader_live = p.leader in live
        out.append(_PARTITION_HEAD.pack(ErrorCode.none if leader_live else ErrorCode.leader_not_available, index,
                                        p.leader if leader_live else -1))
        if version >= 7:
            out.append(_I32.pack(p.leader_epoch))
        out.append(_int32_array(p.replicas, flexible))
        out.append(_int32_array(p.isr, flexible))
        if version >= 5:
            out.append(_int32_array([r for r in p.replicas if r not in live], flexible))
        out.append(tags)
    if version >= 8:
        out.append(_I32.pack(NO_OPERATIONS))
    out.append(tags)
    return b"".join(out)


def _int32_array(values, flexible: bool) -> bytes:
    return array_length_bytes(len(values), flexible) + struct.pack(f">{len(values)}i", *values)
