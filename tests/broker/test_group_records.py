"""`__consumer_offsets` records are Kafka's bytes: OffsetCommitKey v1,
GroupMetadataKey v2, OffsetCommitValue v3 (v1 with an expiry),
GroupMetadataValue v3; older versions written by older Kafkas still read.

Expected bytes are packed here field by field from Kafka's message JSON
(group-coordinator/src/main/resources/common/message/*.json), not by the
codec under test.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    GroupRecordError,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    decode_record,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
    group_metadata_record,
    offset_commit_record,
)


def s(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def b(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def test_offset_commit_key_is_version_1_group_topic_partition() -> None:
    expected = struct.pack(">h", 1) + s("my-group") + s("orders") + struct.pack(">i", 7)
    assert encode_key(OffsetCommitKey("my-group", "orders", 7)) == expected
    assert decode_key(expected) == OffsetCommitKey("my-group", "orders", 7)
    # Kafka 0.8/0.9 wrote key version 0 with the same fields.
    assert decode_key(struct.pack(">h", 0) + expected[2:]) == OffsetCommitKey("my-group", "orders", 7)


def test_group_metadata_key_is_version_2_group() -> None:
    expected = struct.pack(">h", 2) + s("grüppe")
    assert encode_key(GroupMetadataKey("grüppe")) == expected
    assert decode_key(expected) == GroupMetadataKey("grüppe")


def test_offset_commit_value_v3() -> None:
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp_ms=1_700_000_000_000, leader_epoch=5)
    expected = struct.pack(">hqi", 3, 42, 5) + s("m") + struct.pack(">q", 1_700_000_000_000)
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value


def test_offset_commit_value_with_expiry_is_v1_as_kafka_writes_it() -> None:
    value = OffsetCommitValue(offset=42, metadata="", commit_timestamp_ms=1000, expire_timestamp_ms=5000)
    expected = struct.pack(">hq", 1, 42) + s("") + struct.pack(">qq", 1000, 5000)
    assert encode_offset_commit_value(value) == expected
    assert decode_offset_commit_value(expected) == value


@pytest.mark.parametrize("version", [0, 2])
def test_offset_commit_value_v0_and_v2_read(version: int) -> None:
    raw = struct.pack(">hq", version, 9) + s("meta") + struct.pack(">q", 123)
    assert decode_offset_commit_value(raw) == OffsetCommitValue(9, "meta", 123)


MEMBER = MemberMetadata("m-1", "inst-1", "client", "/10.0.0.1", 30_000, 10_000, b"sub", b"asg")


def test_group_metadata_value_v3() -> None:
    value = GroupMetadataValue("consumer", 4, "range", "m-1", 1234, (MEMBER,))
    expected = (struct.pack(">h", 3) + s("consumer") + struct.pack(">i", 4) + s("range") + s("m-1")
                + struct.pack(">q", 1234) + struct.pack(">i", 1)
                + s("m-1") + s("inst-1") + s("client") + s("/10.0.0.1") + struct.pack(">ii", 30_000, 10_000)
                + b(b"sub") + b(b"asg"))
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_empty_group_metadata_has_null_protocol_and_leader() -> None:
    value = GroupMetadataValue("", 0, None, None, 55, ())
    expected = struct.pack(">h", 3) + s("") + struct.pack(">i", 0) + s(None) + s(None) + struct.pack(">qi", 55, 0)
    assert encode_group_metadata_value(value) == expected
    assert decode_group_metadata_value(expected) == value


def test_group_metadata_value_v0_v1_v2_read() -> None:
    v0_member = s("m") + s("c") + s("h") + struct.pack(">i", 6000) + b(b"s") + b(b"a")
    v0 = struct.pack(">h", 0) + s("consumer") + struct.pack(">i", 1) + s("range") + s("m") + struct.pack(">i", 1) + v0_member
    assert decode_group_metadata_value(v0).members == (MemberMetadata("m", None, "c", "h", -1, 6000, b"s", b"a"),)
    v1_member = s("m") + s("c") + s("h") + struct.pack(">ii", 9000, 6000) + b(b"s") + b(b"a")
    v1 = struct.pack(">h", 1) + s("consumer") + struct.pack(">i", 1) + s("range") + s("m") + struct.pack(">i", 1) + v1_member
    assert decode_group_metadata_value(v1).members[0].rebalance_timeout_ms == 9000
    v2 = (struct.pack(">h", 2) + s("consumer") + struct.pack(">i", 1) + s("range") + s("m")
          + struct.pack(">qi", 777, 1) + v1_member)
    decoded = decode_group_metadata_value(v2)
    assert decoded.current_state_timestamp_ms == 777 and decoded.members[0].group_instance_id is None


def test_tombstones_and_unknown_key_types() -> None:
    rec = offset_commit_record("g", "t", 0, None)
    assert rec.value is None and decode_record(rec.key, None) == (OffsetCommitKey("g", "t", 0), None)
    rec = group_metadata_record("g", None)
    assert decode_record(rec.key, None) == (GroupMetadataKey("g"), None)
    # KIP-848 consumer-group records (key version 3+) are not raftka's: skipped.
    assert decode_record(struct.pack(">h", 3) + s("g"), b"\x00\x00") is None


@pytest.mark.parametrize("raw", [
    b"",
    struct.pack(">h", 1) + s("g"),  # no topic, no partition
    struct.pack(">h", 2) + s("g") + b"\x00",  # a byte too many
    struct.pack(">h", 2) + struct.pack(">h", 5) + b"ab",  # string runs past the end
    struct.pack(">h", 2) + struct.pack(">h", 2) + b"\xff\xfe",  # not UTF-8
])
def test_damaged_keys_raise_a_record_error(raw: bytes) -> None:
    with pytest.raises(GroupRecordError):
        decode_key(raw)


def test_flexible_values_are_refused_not_half_read() -> None:
    with pytest.raises(GroupRecordError, match="version 4"):
        decode_offset_commit_value(struct.pack(">hq", 4, 1) + b"\x01\x00")
    with pytest.raises(GroupRecordError, match="version 4"):
        decode_group_metadata_value(struct.pack(">h", 4) + b"\x00" * 20)


names = st.text(max_size=20)
members = st.builds(MemberMetadata, names, st.none() | names, names, names, st.integers(0, 2**31 - 1),
                    st.integers(0, 2**31 - 1), st.binary(max_size=30), st.binary(max_size=30))


@given(st.builds(GroupMetadataValue, names, st.integers(0, 2**31 - 1), st.none() | names, st.none() | names,
                 st.integers(-1, 2**62), st.lists(members, max_size=4).map(tuple)))
def test_group_metadata_value_round_trips(value: GroupMetadataValue) -> None:
    assert decode_group_metadata_value(encode_group_metadata_value(value)) == value


@given(st.integers(-1, 2**62), names, st.integers(0, 2**62), st.integers(-1, 2**31 - 1))
def test_offset_commit_value_round_trips(offset: int, metadata: str, ts: int, epoch: int) -> None:
    value = OffsetCommitValue(offset, metadata, ts, epoch)
    assert decode_offset_commit_value(encode_offset_commit_value(value)) == value
