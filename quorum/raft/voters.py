"""The voter set as Kafka stores it: VotersRecord and KRaftVersionRecord.

A dynamic quorum (KIP-853) keeps its voter set in the metadata log, as
control records: a KRaftVersionRecord (control type 5) saying the log
speaks `kraft.version` 1, and a VotersRecord (control type 6) naming every
voter by id and directory id with the endpoints it listens on. The latest
VotersRecord in the log, committed or not, is the set in force; a snapshot
starts with the set in force at its end offset, so a log that starts at a
snapshot still knows its voters.

`VoterInfo` is one voter; `encode_voters_record` / `decode_voters_record`
speak Kafka's VotersRecord v0 (kio's schema), and
`encode_kraft_version_record` / `decode_kraft_version_record` Kafka's
KRaftVersionRecord v0 (version int16, kraft.version int16, no tagged fields).
`voters_control_batch` builds the one control batch holding both, which is
what `raftka storage format --standalone / --initial-controllers` writes
into the bootstrap snapshot and what the leader appends for a change.
Directory ids are `uuid.UUID` values as kio decodes them (this pure module
draws and parses none: `quorum.node.voter_config` does).
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Iterable, Sequence

from kio.schema.voters_record.v0.data import (
    Endpoint,
    KRaftVersionFeature,
    Voter,
    VotersRecord,
)
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, u16

from common.errors import RaftkaError
from storage.batch import (
    HEADER_SIZE,
    MAGIC,
    ControlRecordType,
    build_batch,
    control_key,
    iter_batch_headers,
    iter_records,
    parse_control_key,
    validate_batch,
)
from storage.errors import StorageError

#: The kraft.version a VotersRecord in the log means (KIP-853); 0 is a static quorum.
KRAFT_VERSION_DYNAMIC = 1
CONTROLLER_LISTENER = "CONTROLLER"

_write_voters = entity_writer(VotersRecord)
_read_voters = entity_reader(VotersRecord)
MAGIC_POSITION = 16  # of a v2 batch's magic byte
_KRAFT_VERSION = struct.Struct(">hhB")  # version, kraft.version, empty tagged fields


class VotersFormatError(RaftkaError):
    """A VotersRecord or an `--initial-controllers` entry that cannot be read."""


@dataclasses.dataclass(frozen=True, slots=True)
class VoterInfo:
    """One voter: its node id, the directory id of its metadata log dir
    (None when the voter came from a static `controller.quorum.voters`),
    and its endpoints as (listener name, host, port)."""

    node_id: int
    directory_id: uuid.UUID | None = None  # noqa: F821 (a kio-decoded value)
    endpoints: tuple[tuple[str, str, int], ...] = ()

    @property
    def address(self) -> tuple[str, int] | None:
        """The first endpoint's (host, port): where the quorum reaches this voter."""
        return (self.endpoints[0][1], self.endpoints[0][2]) if self.endpoints else None


def encode_voters_record(voters: Iterable[VoterInfo]) -> bytes:
    record = VotersRecord(
        version=i16(0),
        voters=tuple(
            Voter(
                voter_id=i32(v.node_id),
                voter_directory_id=v.directory_id,
                endpoints=tuple(Endpoint(name=n, host=h, port=u16(p)) for n, h, p in v.endpoints),
                k_raft_version_feature=KRaftVersionFeature(min_supported_version=i16(0),
                                                           max_supported_version=i16(KRAFT_VERSION_DYNAMIC)),
            )
            for v in sorted(voters, key=lambda v: v.node_id)
        ),
    )
    buffer = io.BytesIO()
    _write_voters(buffer, record)
    return buffer.getvalue()


def decode_voters_record(value: bytes) -> tuple[VoterInfo, ...]:
    try:
        record, _ = _read_voters(memoryview(value), 0)
    except Exception as exc:  # kio raises struct/value errors on truncated input
        raise VotersFormatError(f"a VotersRecord of {len(value)} bytes cannot be read: {exc}") from exc
    return tuple(
        VoterInfo(int(v.voter_id), v.voter_directory_id,
                  tuple((e.name, e.host, int(e.port)) for e in v.endpoints))
        for v in record.voters
    )


def encode_kraft_version_record(kraft_version: int) -> bytes:
    return _KRAFT_VERSION.pack(0, kraft_version, 0)


def decode_kraft_version_record(value: bytes) -> int:
    if len(value) < 4:
        raise VotersFormatError(f"a KRaftVersionRecord of {len(value)} bytes is shorter than 4")
    return struct.unpack_from(">h", value, 2)[0]


def voters_control_batch(voters: Iterable[VoterInfo], *, base_offset: int, epoch: int,
                         timestamp_ms: int = -1, with_kraft_version: bool = True) -> bytes:
    """One control batch: a KRaftVersionRecord (kraft.version 1) then a
    VotersRecord, or the VotersRecord alone."""
    records = []
    if with_kraft_version:
        records.append((control_key(ControlRecordType.KRAFT_VERSION),
                        encode_kraft_version_record(KRAFT_VERSION_DYNAMIC), (), timestamp_ms))
    records.append((control_key(ControlRecordType.KRAFT_VOTERS), encode_voters_record(voters), (), timestamp_ms))
    return build_batch(records, base_offset=base_offset, partition_leader_epoch=epoch, is_control=True)


def voter_records_in(data: bytes | memoryview) -> list[tuple[int, tuple[VoterInfo, ...]]]:
    """(offset, voters) of every VotersRecord in the whole batches of `data`."""
    found = []
    for pos, header in iter_batch_headers(data):
        if not header.is_control:
            continue
        for record in iter_records(data, pos):
            if record.key is None or record.value is None:
                continue
            _, control_type = parse_control_key(record.key)
            if control_type == ControlRecordType.KRAFT_VOTERS:
                found.append((record.offset, decode_voters_record(bytes(record.value))))
    return found


def split_snapshot_file(blob: bytes) -> tuple[tuple[VoterInfo, ...] | None, bytes]:
    """A stored snapshot's voter set (None if it carries none) and the state
    machine's bytes after it. A snapshot that carries a voter set starts
    with one control record batch (the KRaftVersion and Voters records),
    as Kafka's snapshots start with their header batch."""
    if len(blob) < HEADER_SIZE or blob[MAGIC_POSITION] != MAGIC:
        return None, blob
    try:
        # A CRC-checked control batch: state machine bytes that happen to
        # look like a batch header fail here and are returned whole.
        header = validate_batch(blob, 0)
    except StorageError:
        return None, blob
    if not header.is_control:
        return None, blob
    size = header.size_in_bytes
    found = voter_records_in(blob[:size])
    return (found[-1][1] if found else None), blob[size:]


def voter_ids(voters: Sequence[VoterInfo]) -> frozenset[int]:
    return frozenset(v.node_id for v in voters)
