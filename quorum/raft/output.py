"""What one call into the core asks its driver to do.

Obey the fields in this order (the etcd raft contract):
1. persist: fsync `persist_election_state` to the quorum-state file, and
   flush the log up to `flush_log_to_offset`;
2. send: `messages`, each to its destination (responses go back on the
   connection their request came from, found by `correlation`);
3. apply: hand the records below `high_watermark` to the state machine (after
   reloading it from the snapshot if `snapshot_installed` says one replaced
   the log);
4. call `tick(now_ms)` again by `wake_at_ms` at the latest, and right after a
   flush completes (a leader counts its own log only up to what is flushed).

One exception to "persist, then send": when `send_before_flush` is true (a
leader's output that changed no election state), the messages may go out
while the log flush is still under way. A leader's messages claim nothing
about its own log's durability: its records count toward the high
watermark only once flushed, and after a crash it comes back Resigned and
never appends in that epoch again, so a follower holding records the
leader lost is the ordinary case of an uncommitted tail (Raft thesis
§10.2.1: the leader writes to its disk in parallel with replicating). That
overlaps the leader's fsync with the followers' fetch and fsync, so a
commit waits for one fsync instead of two in a row.
"""

from __future__ import annotations

import dataclasses

from quorum.raft.election import ElectionState
from quorum.raft.messages import Outbound, SnapshotId


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderAndEpoch:
    leader_id: int | None
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class AppendResult:
    """Where `propose` put the records: offsets [base_offset, last_offset] in
    `epoch`. They are committed once the high watermark passes last_offset
    while this epoch's records are still there."""

    base_offset: int
    last_offset: int
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    messages: tuple[Outbound, ...]
    persist_election_state: ElectionState | None
    flush_log_to_offset: int | None
    high_watermark: int | None  # None until this node learns it
    leader: LeaderAndEpoch
    role: str
    snapshot_installed: SnapshotId | None
    snapshot_suggested: bool  # create a snapshot at an offset <= high_watermark
    wake_at_ms: int

    @property
    def send_before_flush(self) -> bool:
        """The messages need not wait for `flush_log_to_offset` (see the module docstring)."""
        return self.persist_election_state is None and self.role == "Leader"
