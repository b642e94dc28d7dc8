"""LeaderState: serve Fetches, advance the high watermark, append proposals.

On election the leader first appends a LeaderChange control record in its
new epoch (KIP-595); its offset is the epoch start offset. It then tells the
other voters with BeginQuorumEpoch (sent again until each one answers or
fetches), while followers pull records with Fetch.

High watermark (commit index). The leader tracks each voter's fetch offset
(a voter only fetches from an offset it has flushed). Its own log counts
only up to `log.flushed_offset`. The HW is the largest offset a majority of
voters have reached (the "median"), and it moves only once that offset
covers a record of the leader's own epoch, i.e. exceeds the epoch start
offset (Raft §5.4.2: a leader cannot conclude an older-epoch record is
committed by counting replicas). It never goes down. Until it first moves,
Fetch answers say -1: the HW this node learned as a follower is true but
may be lower than what a restarted follower had already seen, and HWs must
not go backwards anywhere. Observers are tracked
for `describe()` but do not count, and they are served only records below
the HW, so an observer's log never holds anything that could be truncated.

Long poll. A Fetch that would get no records is parked by its request
token until records arrive, the HW moves past what that replica was last
told, `max_wait_ms` passes, or this node stops being leader (then the
parked fetches are answered with the error a non-leader gives).

Check-quorum. If for `controller_quorum_fetch_timeout_ms` fewer than a majority of voters
(the leader included) have fetched, the leader resigns: it may be on the
minority side of a partition, and it must not keep answering as leader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode, RaftUsageError
from quorum.raft.log import VALID, ValidPosition, validate_fetch_position
from quorum.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Inbound,
    SnapshotId,
)
from quorum.raft.output import AppendResult
from quorum.raft.state import EpochState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


@dataclasses.dataclass
class ReplicaState:
    replica_id: int
    directory_id: uuid.UUID | None = None  # noqa: F821 (as the voter set records it, or the fetcher names it)
    end_offset: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    leader_end_at_last_fetch: int = -1
    last_sent_high_watermark: int = -1


@dataclasses.dataclass
class ParkedFetch:
    source_id: int
    request: FetchRequest
    deadline_ms: int


class LeaderState(EpochState):
    name = "Leader"

    def __init__(self, epoch: int, granting_voters: Sequence[int], *, core: RaftCore, now_ms: int) -> None:
        super().__init__(epoch, leader_id=core.node_id, voted_id=core.node_id)
        self.granting_voters = tuple(granting_voters)
        self.start_ms = now_ms
        self.epoch_start_offset = core.log.log_end_offset
        self.voter_states = {v: ReplicaState(v, core.recorded_directory_id(v)) for v in core.voters
                             if v != core.node_id}
        # Observers by (node id, directory id), as Kafka's ReplicaKey: a
        # controller formatted again is an observer beside the voter its id
        # still names until the operator replaces it.
        self.observer_states: dict[tuple[int, uuid.UUID | None], ReplicaState] = {}  # noqa: F821
        self.parked: dict[Hashable, ParkedFetch] = {}
        self.unacked_voters = set(self.voter_states)
        self.next_begin_epoch_ms: dict[int, int] = {}
        self.begin_epoch_in_flight: dict[Hashable, int] = {}
        # The HW this node knew as a follower is true, but lower than what
        # others may have seen (a restarted follower would go backwards), so
        # Fetch answers carry the HW only once this epoch has advanced it.
        self.high_watermark_established = False
        self.snapshot_reads: dict[SnapshotId, int] = {}  # snapshot -> last FetchSnapshot of it

    # --- lifecycle -------------------------------------------------------------

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        info = core.log.append_leader_change(self.epoch, core.node_id, sorted(core.voters), self.granting_voters)
        assert info.base_offset == self.epoch_start_offset
        core.note_appended(info.size_in_bytes)
        self._send_begin_quorum_epoch(core, now_ms)
        self.maybe_advance_high_watermark(core, now_ms)

    def on_exit(self, core: RaftCore, now_ms: int) -> None:
        parked, self.parked = self.parked, {}
        for token, fetch in parked.items():
            core.answer_as_non_leader(fetch.source_id, fetch.request, token)

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        self.maybe_advance_high_watermark(core, now_ms)
        if core.state is not self:
            return  # resigned: its own removal was committed
        if now_ms >= self._quorum_lost_at_ms(core):
            core.become_resigned(self.preferred_successors(), now_ms)
            return
        self._send_begin_quorum_epoch(core, now_ms)
        self._complete_parked(core, now_ms)
        expired = now_ms - core.config.observer_session_timeout_ms
        for key in [k for k, s in self.observer_states.items() if s.last_fetch_ms < expired]:
            del self.observer_states[key]

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        times = [self._quorum_lost_at_ms(core)]
        times += [p.deadline_ms for p in self.parked.values()]
        times += [self.next_begin_epoch_ms.get(v, now_ms) for v in self.unacked_voters]
        return min(times)

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        return False

    def preferred_successors(self) -> list[int]:
        """Other voters, most caught up first (EndQuorumEpoch's order)."""
        return sorted(self.voter_states, key=lambda v: (-self.voter_states[v].end_offset, v))

    # --- check-quorum ------------------------------------------------------------

    def _quorum_lost_at_ms(self, core: RaftCore) -> int:
        needed = core.majority - 1 if core.is_voter else core.majority  # a voter leader counts itself
        if needed == 0:
            return 2**62
        contacts = sorted((max(s.last_fetch_ms, self.start_ms) for s in self.voter_states.values()), reverse=True)
        return contacts[needed - 1] + core.config.controller_quorum_fetch_timeout_ms

    # --- BeginQuorumEpoch --------------------------------------------------------

    def _send_begin_quorum_epoch(self, core: RaftCore, now_ms: int) -> None:
        for voter in sorted(self.unacked_voters):
            if now_ms < self.next_begin_epoch_ms.get(voter, now_ms):
                continue
            request = BeginQuorumEpochRequest(
                cluster_id=core.cluster_id, voter_id=voter, leader_id=core.node_id, leader_epoch=self.epoch,
                voter_directory_id=core.recorded_directory_id(voter),
            )
            self.begin_epoch_in_flight[core.send_request(voter, request)] = voter
            self.next_begin_epoch_ms[voter] = now_ms + core.config.controller_quorum_request_timeout_ms

    def on_begin_quorum_epoch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        voter = self.begin_epoch_in_flight.pop(inbound.correlation, None)
        response = inbound.message
        assert isinstance(response, BeginQuorumEpochResponse)
        if voter is not None and response.error_code == ErrorCode.NONE and response.leader_epoch == self.epoch:
            self.unacked_voters.discard(voter)

    # --- appends and the high watermark --------------------------------------

    def propose(self, core: RaftCore, records: Sequence[bytes], now_ms: int) -> AppendResult:
        info = core.log.append_as_leader(records, self.epoch)
        core.note_appended(info.size_in_bytes)
        self._complete_parked(core, now_ms)
        return AppendResult(info.base_offset, info.last_offset, self.epoch)

    def change_voters(self, core: RaftCore, voters: frozenset[int], now_ms: int, *,
                      same_set: bool = False) -> AppendResult:
        current = core.voters
        if same_set:  # UpdateRaftVoter: the same voters, one with new endpoints
            if voters != current:
                raise RaftUsageError(f"an update keeps the voters {sorted(current)}, not {sorted(voters)}")
        elif len(voters ^ current) != 1 or not voters:
            raise RaftUsageError(
                f"a voter change adds or removes exactly one voter and leaves at least one: "
                f"{sorted(current)} -> {sorted(voters)}"
            )
        if core.high_watermark is None or core.high_watermark <= self.epoch_start_offset:
            raise RaftUsageError("the leader has not committed a record of its epoch yet; retry the voter change")
        if core.voter_change_pending:
            raise RaftUsageError("the previous voter change is not committed yet; retry once it is")
        info = core.log.append_voters(self.epoch, voters)
        core.note_appended(info.size_in_bytes)
        core.notice_voters_changed(now_ms)
        self._complete_parked(core, now_ms)
        return AppendResult(info.base_offset, info.last_offset, self.epoch)

    def on_voters_changed(self, core: RaftCore, now_ms: int) -> None:
        """The set changed by our own append: count the new set at once."""
        voters = core.voters
        for v in [v for v in self.voter_states if v not in voters]:
            state = self.voter_states.pop(v)
            self.observer_states[(v, state.directory_id)] = state
            self.unacked_voters.discard(v)
        for v in voters - {core.node_id} - set(self.voter_states):
            directory_id = core.recorded_directory_id(v)
            self.voter_states[v] = self.observer_states.pop((v, directory_id), None) or ReplicaState(v, directory_id)
            self.unacked_voters.add(v)  # tell it of this epoch
        self.maybe_advance_high_watermark(core, now_ms)

    def maybe_advance_high_watermark(self, core: RaftCore, now_ms: int) -> None:
        offsets = [s.end_offset for s in self.voter_states.values()]
        if core.is_voter:
            offsets.append(core.log.flushed_offset)
        offsets.sort(reverse=True)
        majority_offset = offsets[core.majority - 1]
        # Raft §5.4.2: commit only through a record of this epoch.
        if majority_offset <= self.epoch_start_offset:
            return
        if core.high_watermark is not None and majority_offset <= core.high_watermark:
            return
        core.learn_high_watermark(majority_offset)
        self.high_watermark_established = True
        self._complete_parked(core, now_ms)
        if not core.is_voter and not core.voter_change_pending:
            # Its own removal is committed: hand over (KIP-853).
            core.become_resigned(self.preferred_successors(), now_ms)

    # --- Fetch -------------------------------------------------------------------

    def _replica(self, core: RaftCore, replica_id: int,
                 directory_id: uuid.UUID | None = None) -> ReplicaState | None:  # noqa: F821
        if replica_id in self.voter_states and core.is_voter_key(replica_id, directory_id):
            return self.voter_states[replica_id]
        # A voter's id on another disk (wiped, formatted again) is an
        # observer: its fetches must not count as that voter's (KIP-853)
        # until it is removed and added again with its new directory id.
        if replica_id < 0 or replica_id == core.node_id:
            return None
        return self.observer_states.setdefault((replica_id, directory_id), ReplicaState(replica_id, directory_id))

    def _is_voter(self, replica: ReplicaState | None) -> bool:
        """`replica` is a voter's progress (not an observer's that shares its id)."""
        return replica is not None and self.voter_states.get(replica.replica_id) is replica

    def on_fetch_request(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        request = inbound.message
        assert isinstance(request, FetchRequest)
        replica = self._replica(core, request.replica_id, request.replica_directory_id)
        for token in [t for t, p in self.parked.items() if p.source_id == inbound.source_id]:
            # A fetcher has one Fetch outstanding; an older parked one is answered now.
            old = self.parked.pop(token)
            self._answer(core, old.source_id, old.request, token, park_until_ms=None)
        verdict = validate_fetch_position(core.log, request.fetch_offset, request.last_fetched_epoch)
        if replica is not None:
            if self._is_voter(replica):
                self.unacked_voters.discard(replica.replica_id)
            if verdict is VALID:
                self._record_fetch(core, replica, request.fetch_offset, now_ms)
            else:
                replica.last_fetch_ms = now_ms
        if verdict is VALID and self._is_voter(replica):
            self.maybe_advance_high_watermark(core, now_ms)
            if core.state is not self:  # resigned: its own removal was committed
                core.answer_as_non_leader(inbound.source_id, request, inbound.correlation)
                return
        park_until_ms = now_ms + request.max_wait_ms if request.max_wait_ms > 0 else None
        self._answer(core, inbound.source_id, request, inbound.correlation, park_until_ms=park_until_ms)

    def _record_fetch(self, core: RaftCore, replica: ReplicaState, fetch_offset: int, now_ms: int) -> None:
        leader_end = core.log.log_end_offset
        if fetch_offset >= leader_end:
            replica.last_caught_up_ms = now_ms
        elif replica.last_fetch_ms >= 0 and fetch_offset >= replica.leader_end_at_last_fetch:
            replica.last_caught_up_ms = max(replica.last_caught_up_ms, replica.last_fetch_ms)
        replica.end_offset = fetch_offset
        replica.last_fetch_ms = now_ms
        replica.leader_end_at_last_fetch = leader_end

    def _answer(
        self, core: RaftCore, source_id: int, request: FetchRequest, token: Hashable, *, park_until_ms: int | None
    ) -> None:
        """Answer a Fetch, or, if there is nothing new for it and
        `park_until_ms` is given, park it until then."""
        log = core.log
        hw = core.high_watermark if self.high_watermark_established else None
        verdict: ValidPosition | DivergingEpoch | SnapshotId = validate_fetch_position(
            log, request.fetch_offset, request.last_fetched_epoch
        )
        records = b""
        replica = self._replica(core, request.replica_id, request.replica_directory_id)
        if verdict is VALID:
            if self._is_voter(replica):
                bound = None
            else:
                bound = core.high_watermark or 0  # observers get committed records only
            if bound is None or request.fetch_offset < bound:
                max_bytes = min(request.max_bytes, core.config.fetch_max_bytes)
                records = log.read(request.fetch_offset, max_bytes, bound)
            hw_news = replica is not None and (hw if hw is not None else -1) > replica.last_sent_high_watermark
            if park_until_ms is not None and not records and not hw_news:
                self.parked[token] = ParkedFetch(source_id, request, park_until_ms)
                return
        if replica is not None and hw is not None:
            replica.last_sent_high_watermark = max(replica.last_sent_high_watermark, hw)
        core.respond(
            source_id,
            FetchResponse(
                error_code=ErrorCode.NONE,
                leader_id=core.node_id,
                leader_epoch=self.epoch,
                high_watermark=hw if hw is not None else -1,
                log_start_offset=log.log_start_offset,
                diverging_epoch=verdict if isinstance(verdict, DivergingEpoch) else None,
                snapshot_id=verdict if isinstance(verdict, SnapshotId) else None,
                records=records,
            ),
            token,
        )

    def _complete_parked(self, core: RaftCore, now_ms: int) -> None:
        for token, fetch in list(self.parked.items()):
            del self.parked[token]
            park_until_ms = fetch.deadline_ms if now_ms < fetch.deadline_ms else None
            self._answer(core, fetch.source_id, fetch.request, token, park_until_ms=park_until_ms)

    # --- FetchSnapshot -------------------------------------------------------------

    def snapshots_in_use(self, core: RaftCore, now_ms: int) -> set[SnapshotId]:
        """Snapshots a fetcher asked a chunk of within the fetch timeout and
        has not finished: deleting one would restart that download."""
        horizon = now_ms - core.config.controller_quorum_fetch_timeout_ms
        for snapshot_id in [s for s, t in self.snapshot_reads.items() if t < horizon]:
            del self.snapshot_reads[snapshot_id]
        return set(self.snapshot_reads)

    def on_fetch_snapshot_request(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        request = inbound.message
        assert isinstance(request, FetchSnapshotRequest)
        # A download by a voter's id on another disk keeps no voter's
        # check-quorum contact fresh: a leader cut off from the real voters
        # must still resign (KIP-853).
        replica = self._replica(core, request.replica_id, request.replica_directory_id)
        if replica is not None:
            replica.last_fetch_ms = now_ms
            if self._is_voter(replica):
                self.unacked_voters.discard(replica.replica_id)
        size = core.log.snapshot_size(request.snapshot_id)
        error = ErrorCode.NONE
        chunk = b""
        if size is None:
            error = ErrorCode.SNAPSHOT_NOT_FOUND
        elif not 0 <= request.position <= size:
            error = ErrorCode.POSITION_OUT_OF_RANGE
        else:
            max_bytes = min(request.max_bytes, core.config.fetch_snapshot_max_bytes)
            chunk = core.log.read_snapshot(request.snapshot_id, request.position, max_bytes)
            if request.position + len(chunk) < size:
                self.snapshot_reads[request.snapshot_id] = now_ms
            else:
                self.snapshot_reads.pop(request.snapshot_id, None)  # the last chunk
        core.respond(
            inbound.source_id,
            FetchSnapshotResponse(
                error_code=error,
                leader_id=core.node_id,
                leader_epoch=self.epoch,
                snapshot_id=request.snapshot_id,
                size=size if size is not None else -1,
                position=request.position,
                unaligned_records=chunk,
            ),
            inbound.correlation,
        )

