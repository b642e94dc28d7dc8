"""From committed metadata log bytes to `MetadataImage`s.

Theory of operation
-------------------
`committed_records(data)` turns whole v2 batches read from the metadata log
into `LoggedRecord`s (offset, leader epoch, decoded record), skipping
control batches (the Raft leader's LeaderChange records carry no metadata).
It also reports each batch's span and epoch, which the driver uses to tell
whether a proposal was committed in the epoch it was appended in.

`MetadataState` is the applied state of one node: the committed image,
the next log offset to apply, and the epoch of the last applied batch. A
snapshot replaces it wholesale (`load_snapshot`); committed batches extend
it (`apply`). It is pure: bytes in, images out.
"""

from __future__ import annotations

import dataclasses

from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.metadata.records import decode_record
from quorum.metadata.snapshot import image_from_records
from quorum.node.snapshots import decode_snapshot
from quorum.raft.messages import SnapshotId
from storage.batch import iter_batch_headers, iter_records


@dataclasses.dataclass(frozen=True, slots=True)
class BatchSpan:
    base_offset: int
    last_offset: int
    epoch: int
    control: bool


def committed_records(data: bytes) -> tuple[list[LoggedRecord], list[BatchSpan]]:
    records: list[LoggedRecord] = []
    spans: list[BatchSpan] = []
    end = 0
    for pos, header in iter_batch_headers(data):
        epoch = header.partition_leader_epoch
        spans.append(BatchSpan(header.base_offset, header.last_offset, epoch, header.is_control))
        end = pos + header.size_in_bytes
        if header.is_control:
            continue
        for record in iter_records(data, pos):
            assert record.value is not None, f"metadata record at offset {record.offset} has no value"
            records.append(LoggedRecord(record.offset, epoch, decode_record(record.value)))
    assert end == len(data), f"{len(data) - end} bytes of a partial batch in committed metadata log data"
    return records, spans


@dataclasses.dataclass(frozen=True, slots=True)
class MetadataState:
    image: MetadataImage = MetadataImage()
    next_offset: int = 0
    last_epoch: int = 0

    def load_snapshot(self, blob: bytes) -> tuple[MetadataState, SnapshotId]:
        snapshot_id, records = decode_snapshot(blob)
        image = image_from_records(records, snapshot_id.end_offset - 1, snapshot_id.epoch)
        return MetadataState(image, snapshot_id.end_offset, snapshot_id.epoch), snapshot_id

    def apply(self, data: bytes) -> tuple[MetadataState, list[BatchSpan]]:
        """The state after the whole batches in `data`; the first holds
        `next_offset` (records before it, already applied, are skipped)."""
        records, spans = committed_records(data)
        if not spans:
            return self, spans
        assert spans[0].base_offset <= self.next_offset <= spans[0].last_offset, (spans[0], self.next_offset)
        if spans[0].base_offset < self.next_offset:
            records = [r for r in records if r.offset >= self.next_offset]
        image = self.image.apply(records) if records else self.image
        return MetadataState(image, spans[-1].last_offset + 1, spans[-1].epoch), spans
