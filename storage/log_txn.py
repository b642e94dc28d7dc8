"""Transactions on a `Log` (KIP-98): the marker batches that end a
producer's transaction and the aborted transactions a read_committed fetch
is told about. Split from `storage.log` by responsibility; read that
module's docstring first.

None of these touches a `Log`: each takes the segments, the producer
state and plain values. `Log.append_marker` checks the producer and writes
the batch built here through its follower path (the batch already carries
its offset), which calls `apply_marker` for each control batch it writes.
"""

from __future__ import annotations

import logging
from bisect import bisect_right

from storage.batch import (
    ControlRecordType,
    build_control_batch,
    end_txn_marker_value,
    read_txn_marker,
)
from storage.errors import StorageError
from storage.producer_snapshot import ProducerStateManager, record_completed
from storage.segment import LogSegment
from storage.txn_index import AbortedTxn

logger = logging.getLogger("storage.log")


def apply_marker(dir_path: str, producer_state: ProducerStateManager, segment: LogSegment, header, buf,
                 position: int) -> None:
    """A control batch of a producer is in `segment` at `position` of
    `buf`: end its transaction in the producer state and index an abort."""
    try:
        marker = read_txn_marker(buf, position)
    except StorageError as e:
        # Written already (the log is the truth): the epoch still moves.
        logger.error("%s: control batch at offset %d has no readable marker: %s",
                     dir_path, header.base_offset, e)
        marker = None
    completed = producer_state.update(header, marker=marker)
    if completed is not None:
        record_completed(segment, producer_state, completed)


def marker_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                 base_offset: int, now_ms: int, leader_epoch: int):
    """The COMMIT or ABORT control batch a leader writes at `base_offset`."""
    return build_control_batch(
        ControlRecordType.COMMIT if commit else ControlRecordType.ABORT,
        end_txn_marker_value(coordinator_epoch),
        base_offset=base_offset,
        timestamp_ms=now_ms,
        partition_leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )


def collect_aborted_txns(segments: list[LogSegment], base_offsets: list[int], fetch_offset: int,
                         upper_bound: int) -> list[AbortedTxn]:
    """The aborted transactions overlapping [fetch_offset, upper_bound),
    from the `.txnindex` of each segment from the one holding
    `fetch_offset` (`storage.txn_index`)."""
    out: list[AbortedTxn] = []
    i = max(bisect_right(base_offsets, fetch_offset) - 1, 0)
    for segment in segments[i:]:
        if segment.txn_index.collect(fetch_offset, upper_bound, out):
            break
    return out
