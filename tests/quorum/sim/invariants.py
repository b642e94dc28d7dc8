"""The safety properties checked after every simulated event.

- Election Safety: at most one leader per epoch (Raft §5.2).
- Committed records are never lost or changed: every record any node ever
  applied below a high watermark it reported is recorded in `committed`;
  any node applying, loading from a snapshot, or still holding a different
  record at that offset is a violation (State Machine Safety, §5.4.3). A
  voter's log must still hold, after a crash, everything below the highest
  HW it ever reported.
- The HW of every voter is monotonic, across crashes too.
- An observer's log is always a prefix of the committed log. It flushes only
  now and then (`quorum.raft.core`, as Kafka's observers): after a crash it
  must still hold what it had flushed (up to its HW), and what it holds is
  committed; its HW is monotonic within each life.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.node import Entry, SimNode


class SafetyViolation(AssertionError):
    pass


class Invariants:
    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}
        self.committed: dict[int, tuple[int, bool, bytes]] = {}
        self.checks = 0

    def _check_entry(self, node: SimNode, offset: int, value: tuple[int, bool, bytes], what: str) -> None:
        self.checks += 1
        known = self.committed.setdefault(offset, value)
        if known != value:
            raise SafetyViolation(f"node {node.node_id} {what} {value!r} at offset {offset}; committed was {known!r}")

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        offset, epoch, control, record = entry
        self._check_entry(node, offset, (epoch, control, record), "applied")

    def on_snapshot_loaded(self, node: SimNode) -> None:
        for offset, epoch, control, record in node.sm.entries:
            self._check_entry(node, offset, (epoch, control, record), "loaded from a snapshot")

    def on_high_watermark(self, node: SimNode, high_watermark: int) -> None:
        if high_watermark < node.max_high_watermark:
            raise SafetyViolation(
                f"node {node.node_id}: high watermark went back from {node.max_high_watermark} to {high_watermark}"
            )
        if high_watermark > node.log.log_end_offset:
            raise SafetyViolation(f"node {node.node_id}: HW {high_watermark} beyond its log end")
        node.max_high_watermark = high_watermark
        if node.core is not None and node.core.may_stand:
            node.max_high_watermark_as_voter = high_watermark

    def on_restart(self, node: SimNode) -> None:
        """What a node reported committed must have survived its crash."""
        log = node.log
        if not node.voter_at_crash:
            durable = min(node.max_high_watermark, node.flushed_before_crash)
            if log.log_end_offset < durable:
                raise SafetyViolation(
                    f"observer {node.node_id} lost flushed records: log end {log.log_end_offset} < {durable}, "
                    f"what it had flushed below its HW before crashing"
                )
            self._check_log(node, log.log_start_offset, min(log.log_end_offset, node.max_high_watermark), "still holds")
            # It fetches the lost tail again: its HW starts over from what it holds.
            node.max_high_watermark = min(node.max_high_watermark, log.log_end_offset)
            return
        # A voter keeps all it reported as a voter; a node made a voter may
        # lose the unflushed part of what it fetched as an observer.
        durable = max(node.max_high_watermark_as_voter, min(node.max_high_watermark, node.flushed_before_crash))
        if log.log_end_offset < durable:
            raise SafetyViolation(
                f"node {node.node_id} lost committed records: log end {log.log_end_offset} "
                f"< HW {durable} it reported before crashing"
            )
        self._check_log(node, log.log_start_offset, min(log.log_end_offset, node.max_high_watermark), "still holds")
        node.max_high_watermark = min(node.max_high_watermark, log.log_end_offset)

    def _check_log(self, node: SimNode, start: int, end: int, what: str) -> None:
        for batch in node.disk.batches(start, end):
            for i, record in enumerate(batch.records):
                offset = batch.base_offset + i
                if start <= offset < end:
                    self._check_entry(node, offset, (batch.epoch, batch.control, record), what)

    def after_event(self, node: SimNode) -> None:
        if node.core is None:
            return
        if node.core.role in ("Prospective", "Candidate", "Leader") and \
                not node.cluster.was_voter(node.node_id, node.directory_id):
            raise SafetyViolation(
                f"node {node.node_id} stands as a voter ({node.core.role}, epoch {node.core.epoch}) with directory id "
                f"{node.directory_id}, which no voter set ever named (a wiped disk acting as the voter it was)"
            )
        if node.is_leader():
            epoch = node.core.epoch
            leader = self.leaders.setdefault(epoch, node.node_id)
            if leader != node.node_id:
                raise SafetyViolation(f"epoch {epoch} has two leaders: {leader} and {node.node_id}")
        if node.log.log_end_offset < node.max_high_watermark:
            raise SafetyViolation(f"node {node.node_id} truncated below its high watermark")
        if not node.is_voter:
            start = max(node.observer_checked_offset, node.log.log_start_offset)
            for batch in node.disk.batches(start):
                for i, record in enumerate(batch.records):
                    offset = batch.base_offset + i
                    if offset < start:
                        continue
                    known = self.committed.get(offset)
                    if known != (batch.epoch, batch.control, record):
                        raise SafetyViolation(
                            f"observer {node.node_id} holds {(batch.epoch, batch.control, record)!r} at offset "
                            f"{offset}, which is not committed (committed: {known!r})"
                        )
            node.observer_checked_offset = node.log.log_end_offset
