"""What a Raft node counts for its metrics (KIP-595's `raft-metrics` and
the controller's event queue time): a handful of numbers per turn of the
Raft loop, never per record.

- `event_queue`: how long a proposal (a controller decision) waited for the
  Raft loop to run it (Kafka's ControllerEventManager EventQueueTimeMs);
- `commit_latency`: from a leader's append of a proposal to the high
  watermark passing it (`commit-latency-avg`/`-max`, ms);
- `election_latency`: from this node starting an election (Prospective or
  Candidate) to a leader being known (`election-latency-avg`/`-max`, ms);
- `append_records` / `fetch_records`: records added to the log here as the
  leader (appends) or as a follower or observer (fetched), whose `-rate`s
  are KIP-595's `append-records-rate` and `fetch-records-rate`.
"""

from __future__ import annotations

from common.metrics import LatencyHistogram, WindowedStat

_ELECTING = ("Prospective", "Candidate")


class RaftStats:
    def __init__(self) -> None:
        self.event_queue = LatencyHistogram()
        self.commit_latency = WindowedStat()
        self.election_latency = WindowedStat()
        self.append_records = WindowedStat()
        self.fetch_records = WindowedStat()
        self._election_started: float | None = None
        self._log_end_offset: int | None = None

    def on_role(self, role: str, leader_id: int | None, now: float) -> None:
        """The node's role changed (once per change)."""
        if role in _ELECTING:
            if self._election_started is None:
                self._election_started = now
        elif self._election_started is not None and (role == "Leader" or leader_id is not None):
            self.election_latency.record((now - self._election_started) * 1000, now)
            self._election_started = None

    def on_turn(self, log_end_offset: int, is_leader: bool, now: float) -> None:
        """After a turn of the loop: the log's growth is appended or fetched records."""
        before = self._log_end_offset
        self._log_end_offset = log_end_offset
        if before is not None and log_end_offset > before:
            (self.append_records if is_leader else self.fetch_records).record(log_end_offset - before, now)
