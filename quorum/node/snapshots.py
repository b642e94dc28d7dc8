"""Metadata snapshots: the image as CBOR records, in checkpoint files.

Theory of operation
-------------------
A snapshot at end offset N describes the metadata image after every record
below N (KIP-630). Its bytes are one self-checking blob, the same on disk
and on the wire (FetchSnapshot ships the file as is):

    offset  size  field
         0     4  magic b"RKSN"
         4     4  CRC32C of every byte from offset 8 to the end
         8     2  format version (1)
        10     8  end_offset
        18     4  epoch          (of the record at end_offset - 1)
        22     4  record_count
        26     8  payload_length
        34     -  payload: CBOR array of metadata record maps
                  (`quorum.metadata.records.record_to_map`)

`encode_snapshot` / `decode_snapshot` are pure. The metadata log
(`quorum.raft.storage_log`) stores the blob as the file
`<end_offset:020d>-<epoch:010d>.checkpoint`, written atomically (temp
file, fsync, rename, fsync of the directory), so a crash leaves a whole
snapshot or none.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import cbor2
from crc32c import crc32c

from quorum.metadata.image import MetadataImage
from quorum.metadata.records import Record, record_from_map, record_to_map
from quorum.metadata.snapshot import image_from_records, image_to_records
from quorum.raft.messages import SnapshotId
from quorum.raft.voters import split_snapshot_file
from common.errors import RaftkaError

MAGIC = b"RKSN"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sIHqiiQ")
HEADER_SIZE = _HEADER.size
_CRC_FROM = 8


class CorruptSnapshotError(RaftkaError):
    """A snapshot's bytes fail their checks (magic, CRC32C, lengths). The
    file was damaged on disk or in transit; delete it and let the node fetch
    the leader's snapshot again."""


def encode_snapshot(records: Sequence[Record], snapshot_id: SnapshotId) -> bytes:
    payload = cbor2.dumps([record_to_map(r) for r in records])
    body = _HEADER.pack(MAGIC, 0, FORMAT_VERSION, snapshot_id.end_offset, snapshot_id.epoch, len(records),
                        len(payload))[_CRC_FROM:] + payload
    return MAGIC + struct.pack(">I", crc32c(body)) + body


def snapshot_header(blob: bytes | memoryview) -> tuple[SnapshotId, int, int]:
    """(snapshot id, record count, payload length) after checking magic and sizes (not the CRC)."""
    blob = split_snapshot_file(bytes(blob))[1]
    if len(blob) < HEADER_SIZE:
        raise CorruptSnapshotError(f"snapshot of {len(blob)} bytes is shorter than its {HEADER_SIZE}-byte header")
    magic, _crc, version, end_offset, epoch, count, length = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise CorruptSnapshotError(f"snapshot starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise CorruptSnapshotError(
            f"snapshot format version {version} is not {FORMAT_VERSION}: it was written by another raftka version")
    if HEADER_SIZE + length != len(blob):
        raise CorruptSnapshotError(f"snapshot payload says {length} bytes but {len(blob) - HEADER_SIZE} follow")
    return SnapshotId(end_offset, epoch), count, length


def decode_snapshot(blob: bytes | memoryview) -> tuple[SnapshotId, list[Record]]:
    """The records of a snapshot, after the voter set a file may start with."""
    blob = split_snapshot_file(bytes(blob))[1]
    snapshot_id, count, _ = snapshot_header(blob)
    (crc,) = struct.unpack_from(">I", blob, 4)
    view = memoryview(blob)
    if crc32c(view[_CRC_FROM:]) != crc:
        raise CorruptSnapshotError(f"snapshot {snapshot_id} fails its CRC32C check")
    maps = cbor2.loads(view[HEADER_SIZE:])
    if not isinstance(maps, list) or len(maps) != count:
        raise CorruptSnapshotError(f"snapshot {snapshot_id} payload is not a list of {count} records")
    return snapshot_id, [record_from_map(m) for m in maps]


def snapshot_of_image(image: MetadataImage, snapshot_id: SnapshotId) -> bytes:
    return encode_snapshot(image_to_records(image), snapshot_id)


def image_of_snapshot(blob: bytes | memoryview) -> MetadataImage:
    """The image a snapshot describes, as of offset end_offset - 1."""
    snapshot_id, records = decode_snapshot(blob)
    return image_from_records(records, snapshot_id.end_offset - 1, snapshot_id.epoch)
