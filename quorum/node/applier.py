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

`apply_committed` is one turn of the driver's applying: a bounded amount
of committed log, replayed in one go (cheaper per record than many small
replays), except where the leader's own proposals come staged with the
image its controller already computed: those are adopted as they commit,
not decoded and replayed a second time.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

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


def apply_committed(state: MetadataState, read: Callable[[int, int, int], bytes], high_watermark: int,
                    staged: collections.deque[Any], leader_epoch: int | None, budget_bytes: int) -> MetadataState:
    """`state` after the committed batches below `high_watermark`, about
    `budget_bytes` of them (`read(offset, max_bytes, max_offset)` returns
    whole batches, at least one). `staged` holds this leader's proposals of
    `leader_epoch` (None: not the leader), oldest first, each with
    `base_offset`, `last_offset`, `epoch` and `image_after`; ones behind the
    state or of another epoch are dropped from it."""
    while state.next_offset < high_watermark and budget_bytes > 0:
        while staged and (staged[0].last_offset < state.next_offset or staged[0].epoch != leader_epoch):
            staged.popleft()
        first = staged[0] if staged else None
        if first is not None and first.base_offset == state.next_offset and first.last_offset < high_watermark:
            staged.popleft()  # our own records, decided on the working image: adopt its result
            assert first.image_after is not None
            state = MetadataState(first.image_after, first.last_offset + 1, first.epoch)
            continue
        data = read(state.next_offset, budget_bytes, high_watermark)
        if not data:
            break
        state, _ = state.apply(data)
        budget_bytes -= len(data)
    return state
