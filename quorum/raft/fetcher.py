"""Fetcher: the pulling half of replication (KIP-595 "Fetch").

A Follower (and an observer looking for the leader) keeps exactly one Fetch
or FetchSnapshot in flight. Each Fetch names the log end offset and the epoch
of the last batch; that position claims only flushed data, because the
`Output` that carries the request also asks for the flush, and the driver
flushes before it sends. The leader answers with one of:

- records that extend this log (append them; learn the high watermark as
  `min(leader's HW, log end)`, KIP-595);
- a DivergingEpoch: this log has records the leader does not; truncate to
  the smaller of the leader's and this log's end offset of that epoch
  (KIP-320) and fetch again. The HW is not learned from such an answer: the
  remaining prefix is not yet known to match the leader's;
- a SnapshotId: the leader deleted the log this fetcher needs; download that
  snapshot chunk by chunk with FetchSnapshot, install it (the log becomes
  empty, starting at the snapshot's end offset), and fetch on from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode
from quorum.raft.messages import (
    UNKNOWN_EPOCH,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    SnapshotId,
)

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


@dataclasses.dataclass
class SnapshotDownload:
    snapshot_id: SnapshotId
    data: bytearray = dataclasses.field(default_factory=bytearray)


class Fetcher:
    def __init__(self, target_id: int, *, max_wait_ms: int) -> None:
        self.target_id = target_id
        self.max_wait_ms = max_wait_ms
        self.in_flight: Hashable | None = None
        self.sent_ms = 0
        self.retry_at_ms = 0
        self.download: SnapshotDownload | None = None

    def wake_at_ms(self, core: RaftCore) -> int:
        if self.in_flight is not None:
            return self.sent_ms + core.config.controller_quorum_request_timeout_ms
        return self.retry_at_ms

    def take(self, correlation: Hashable) -> bool:
        """Claim a response: True only for the answer to the request in flight."""
        if self.in_flight is None or correlation != self.in_flight:
            return False
        self.in_flight = None
        return True

    def back_off(self, core: RaftCore, now_ms: int) -> None:
        self.retry_at_ms = now_ms + core.config.controller_quorum_retry_backoff_ms

    def maybe_send(self, core: RaftCore, epoch: int, now_ms: int) -> None:
        if self.in_flight is not None:
            if now_ms < self.sent_ms + core.config.controller_quorum_request_timeout_ms:
                return
            self.in_flight = None  # timed out: the driver dropped it, or the network did
        if now_ms < self.retry_at_ms:
            return
        log = core.log
        request: FetchRequest | FetchSnapshotRequest
        if self.download is not None:
            request = FetchSnapshotRequest(
                cluster_id=core.cluster_id,
                replica_id=core.node_id,
                current_leader_epoch=epoch,
                snapshot_id=self.download.snapshot_id,
                position=len(self.download.data),
                max_bytes=core.config.fetch_snapshot_max_bytes,
                replica_directory_id=core.directory_id,
            )
        else:
            request = FetchRequest(
                cluster_id=core.cluster_id,
                replica_id=core.node_id,
                current_leader_epoch=epoch,
                fetch_offset=log.log_end_offset,
                last_fetched_epoch=log.last_fetched_epoch,
                log_start_offset=log.log_start_offset,
                max_bytes=core.config.fetch_max_bytes,
                max_wait_ms=self.max_wait_ms,
                replica_directory_id=core.directory_id,
            )
        self.in_flight = core.send_request(self.target_id, request)
        self.sent_ms = now_ms

    def apply_fetch(self, core: RaftCore, response: FetchResponse) -> None:
        """Apply a successful Fetch answer from the leader of our epoch."""
        log = core.log
        if response.diverging_epoch is not None:
            diverging = response.diverging_epoch
            local = log.end_offset_for_epoch(diverging.epoch)
            local_end = local.offset if local.epoch != UNKNOWN_EPOCH else log.log_start_offset
            truncate_to = min(diverging.end_offset, local_end)
            # Committed records are on every future leader (Raft §5.4), so a
            # leader never asks anyone to truncate below the high watermark.
            assert truncate_to >= (core.high_watermark or 0), (truncate_to, core.high_watermark)
            assert truncate_to >= log.log_start_offset, (truncate_to, log.log_start_offset)
            log.truncate_to(truncate_to)
            return
        if response.snapshot_id is not None:
            self.download = SnapshotDownload(response.snapshot_id)
            return
        if response.records:
            info = log.append_as_follower(response.records)
            core.note_appended(info.size_in_bytes)
        if response.high_watermark >= 0:
            core.learn_high_watermark(min(response.high_watermark, log.log_end_offset))

    def apply_fetch_snapshot(self, core: RaftCore, response: FetchSnapshotResponse, now_ms: int) -> None:
        """Apply a FetchSnapshot answer from the leader of our epoch."""
        download = self.download
        if download is None:
            return
        if response.error_code in (ErrorCode.SNAPSHOT_NOT_FOUND, ErrorCode.POSITION_OUT_OF_RANGE):
            # The leader replaced that snapshot: ask with Fetch which one to load now.
            self.download = None
            return
        if response.error_code != ErrorCode.NONE:
            self.back_off(core, now_ms)
            return
        if response.snapshot_id != download.snapshot_id or response.position != len(download.data):
            return  # not the chunk we asked for: ask again
        download.data += response.unaligned_records
        if len(download.data) > response.size:
            self.download = None  # the leader's answers disagree on the size: start over
            return
        if len(download.data) == response.size:
            core.install_snapshot(download.snapshot_id, bytes(download.data), now_ms)
            self.download = None
