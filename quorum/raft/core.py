"""RaftCore: the pure Raft state machine of the metadata quorum (KIP-595).

Theory of operation. The core does no I/O and reads no clock. Its driver
feeds it what happened, with the current time:

- `handle(inbound, now_ms)`: a request or a response arrived;
- `tick(now_ms)`: time passed (timers), or a log flush completed;
- `propose(records, now_ms)`: append records (leader only);
- `create_snapshot(end_offset, data, now_ms)`, `resign(now_ms)`.

Each call returns an `Output`, and the driver must act on it in this order:
**persist, then send, then apply** (as etcd's raft documents for `Ready`):

1. fsync `persist_election_state` (the quorum-state file) and flush the log
   to `flush_log_to_offset`. Nothing may be sent before: a vote granted or a
   message of a new epoch that a crash could make us forget would let one
   epoch elect two leaders; a Fetch offset that a crash could take back would
   let the leader count a record as committed on a voter that lost it.
   An observer (a broker) asks for a flush at most once per
   `OBSERVER_FLUSH_INTERVAL_MS`, not per append, as Kafka's observers do
   not flush (`KafkaRaftClient.appendAsFollower`): its fetch offset counts
   toward nothing, and it is only ever sent committed records, so a crash
   that loses its unflushed tail loses records it fetches again; the flush
   only bounds what a restart re-reads;
2. send `messages`;
3. apply records below `high_watermark` to the state machine;
4. call `tick` at `wake_at_ms` at the latest, and after each flush.

Randomness comes only from the injected `random.Random` (election timeouts,
which voter an observer asks first), so one seed replays a whole run.

The core holds one role object (`state.py` has the transition table); each
role lives in its own module and handles what only it does. What is common
to every role stays here: epochs and leaders learned from any message (a
message from a higher epoch moves any node to that epoch, Raft §5.1), the
transitions, and the Output. Requests every role answers alike (votes,
Begin/EndQuorumEpoch, Fetch validation) are in `requests.py`.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Mapping, Sequence

from quorum.raft import requests
from quorum.raft.candidate import CandidateState, ProspectiveState
from quorum.raft.config import QuorumConfig
from quorum.raft.election import ElectionState
from quorum.raft.errors import ErrorCode, NotLeaderError, RaftUsageError
from quorum.raft.follower import FollowerState
from quorum.raft.leader import LeaderState
from quorum.raft.log import ReplicatedLog
from quorum.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    RESPONSE_TYPES,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Inbound,
    Message,
    Outbound,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from quorum.raft.output import AppendResult, LeaderAndEpoch, Output
from quorum.raft.resigned import ResignedState
from quorum.raft.state import EpochState
from quorum.raft.status import QuorumStatus, describe
from quorum.raft.unattached import UnattachedState, VotedState


#: An observer flushes its log at most this often (see the module docstring).
OBSERVER_FLUSH_INTERVAL_MS = 1000


class RaftCore:
    def __init__(
        self,
        *,
        node_id: int,
        voters: frozenset[int] | set[int],
        log: ReplicatedLog,
        rng: random.Random,
        now_ms: int,
        config: QuorumConfig | None = None,
        election_state: ElectionState | None = None,
        cluster_id: str | None = None,
        directory_id: uuid.UUID | None = None,  # noqa: F821
        voter_directory_ids: Mapping[int, uuid.UUID | None] | None = None,  # noqa: F821
    ) -> None:
        """`election_state` is what the quorum-state file holds (None if there
        is none yet). The first `Output` (from the first `tick` or `handle`)
        carries what starting up sends. `directory_id` is this node's metadata
        log dir's `directory.id`; `voter_directory_ids` those of the
        configured voters, when known (a dynamic quorum's voters as
        DescribeQuorum named them), until the log holds a voter set."""
        if node_id < 0:
            raise RaftUsageError(f"node id {node_id} is negative; give every node a node.id >= 0")
        if not voters:
            raise RaftUsageError("the voter set is empty; configure controller.quorum.voters")
        self.node_id = node_id
        # The configured set (controller.quorum.voters, or the bootstrap set):
        # in force until the log holds a voter-set record.
        self.static_voters = frozenset(voters)
        self.directory_id = directory_id
        self._static_directory_ids = dict(voter_directory_ids or {})
        self.log = log
        self.rng = rng
        self.config = config or QuorumConfig()
        self.cluster_id = cluster_id
        self.high_watermark: int | None = None
        self._known_voters = (self.voters, self.may_stand)
        self._messages: list[Outbound] = []
        self._next_correlation = rng.getrandbits(31)
        # A non-voter keeps what it persisted too: it may have voted when a
        # candidate asked it by name (it was added by a record it lacks).
        self._persisted = election_state
        self._snapshot_installed: SnapshotId | None = None
        self._bytes_since_snapshot = 0
        self._observer_flush_at_ms = now_ms
        self.state: EpochState = self._initial_state(election_state, now_ms)
        self.state.on_enter(self, now_ms)

    def _initial_state(self, persisted: ElectionState | None, now_ms: int) -> EpochState:
        log_epoch = self.log.last_fetched_epoch
        if not self.may_stand and persisted is not None and persisted.epoch >= log_epoch \
                and persisted.voted_id not in (None, self.node_id):
            # It must not vote twice in this epoch.
            return VotedState(persisted.epoch, persisted.voted_id, core=self, now_ms=now_ms)
        if not self.may_stand or persisted is None or persisted.epoch < log_epoch:
            # An epoch seen only in the log (its records reached the disk, the
            # quorum-state write did not) carries no vote and no leader to trust.
            epoch = max(log_epoch, persisted.epoch if persisted else 0)
            return UnattachedState(epoch, core=self, now_ms=now_ms)
        epoch = persisted.epoch
        if persisted.leader_id == self.node_id:
            # Kafka's rule: a voter that was leader comes back Resigned, never
            # Leader; its unflushed tail may be gone, and followers may have
            # moved on. It helps elect a successor instead.
            return ResignedState(epoch, [], core=self, now_ms=now_ms)
        if persisted.leader_id is not None:
            return FollowerState(epoch, persisted.leader_id, persisted.voted_id, core=self, now_ms=now_ms)
        if persisted.voted_id == self.node_id:
            return CandidateState(epoch, core=self, now_ms=now_ms)
        if persisted.voted_id is not None:
            return VotedState(epoch, persisted.voted_id, core=self, now_ms=now_ms)
        return UnattachedState(epoch, core=self, now_ms=now_ms)

    # --- views ---------------------------------------------------------------

    @property
    def voters(self) -> frozenset[int]:
        """The voter set of the latest voter-set record in the log, committed
        or not (KIP-853, as Raft's single-server changes: a node uses the
        newest configuration it has, the moment it has it)."""
        sets = self.log.voter_sets()
        return sets[-1][1] if sets else self.static_voters

    @property
    def is_voter(self) -> bool:
        return self.is_voter_key(self.node_id, self.directory_id)

    def recorded_directory_id(self, node_id: int) -> uuid.UUID | None:  # noqa: F821
        """The directory id the voter set in force records for voter
        `node_id`; None when it records none (a static quorum's voters)."""
        latest = getattr(self.log, "latest_voters", None)
        infos = latest() if latest is not None else None
        if infos is None:
            return self._static_directory_ids.get(node_id)
        return next((v.directory_id for v in infos if v.node_id == node_id), None)

    def is_voter_key(self, node_id: int, directory_id: uuid.UUID | None) -> bool:  # noqa: F821
        """KIP-853: a voter is a node id *and* a directory id. A node whose
        disk was wiped and formatted again comes back with the old id and a
        new directory id; it is not that voter: it neither stands, nor
        votes, nor counts toward the high watermark under the old identity,
        which its empty log would betray (it would vote for any candidate,
        so a candidate missing committed records could win). It serves as
        an observer until it is removed and added again with its new id."""
        if node_id not in self.voters:
            return False
        return self.same_directory(self.recorded_directory_id(node_id), directory_id)

    @staticmethod
    def same_directory(recorded: uuid.UUID | None, given: uuid.UUID | None) -> bool:  # noqa: F821
        # Either side unknown (a static voter; a peer or a caller that names
        # none) is no evidence of another disk.
        return recorded is None or given is None or recorded == given

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def may_stand(self) -> bool:
        """Whether this node times out and stands for election: a voter, or
        a voter removed by a record not committed yet, which may still be
        needed to commit it (Raft §4.2.2). It counts its own vote only if it
        is in the latest set."""
        if self.is_voter:
            return True
        sets = self.log.voter_sets()
        if not sets or not self.voter_change_pending or self.node_id in self.voters:
            return False  # (in the set under another directory id: another disk's voter)
        previous = sets[-2][1] if len(sets) > 1 else self.static_voters
        if self.node_id not in previous:
            return False
        records = getattr(self.log, "voter_records", None)
        if records is not None and len(sets) > 1:
            recorded = next((v.directory_id for v in records()[-2][1] if v.node_id == self.node_id), None)
        else:
            # The previous set is the configured one: its directory ids too. A
            # wiped controller whose log holds only the record removing its
            # old identity, not committed in its eyes (after a restart its HW
            # is unknown), must not stand as that identity.
            recorded = self._static_directory_ids.get(self.node_id)
        return self.same_directory(recorded, self.directory_id)

    @property
    def _flushes_eagerly(self) -> bool:
        """A voter flushes before it acks. So does any node that was a voter
        (configured, or named in a voter-set record): one removed may have
        truncated an uncommitted tail, which must not come back after a
        crash, and a lost record of its own removal would make it a voter
        again in its own eyes."""
        if self.may_stand or self.node_id in self.static_voters:
            return True
        return any(self.node_id in v for _, v in self.log.voter_sets())

    @property
    def voter_change_pending(self) -> bool:
        """The latest voter-set record is not committed yet: no other change
        may start until it is (one change at a time)."""
        sets = self.log.voter_sets()
        if not sets:
            return False
        return self.high_watermark is None or sets[-1][0] >= self.high_watermark

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def role(self) -> str:
        return self.state.name

    @property
    def is_leader(self) -> bool:
        return isinstance(self.state, LeaderState)

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        leader = self.state.leader_id
        if isinstance(self.state, (ResignedState, ProspectiveState)):
            # Resigned led this epoch but no longer accepts appends; a
            # Prospective suspects the leader it remembers is gone.
            leader = None
        return LeaderAndEpoch(leader, self.epoch)

    @property
    def leader_epoch_start_offset(self) -> int | None:
        """On the leader, the offset of its LeaderChange record: once the HW
        passes it, every record before it is committed and applied state is
        complete (the moment an active controller may start deciding)."""
        return self.state.epoch_start_offset if isinstance(self.state, LeaderState) else None

    def describe(self, now_ms: int) -> QuorumStatus:
        return describe(self, now_ms)

    # --- entry points ----------------------------------------------------------

    def tick(self, now_ms: int) -> Output:
        self.state.on_tick(self, now_ms)
        if len(self.log.snapshot_ids) > 2:
            self._retain_snapshots(now_ms)  # a download may have ended
        return self._finish(now_ms)

    def handle(self, inbound: Inbound, now_ms: int) -> Output:
        message = inbound.message
        if isinstance(message, RESPONSE_TYPES):
            self._on_response(inbound, now_ms)
        elif self.cluster_id is not None and message.cluster_id not in (None, self.cluster_id):
            requests.reply(self, inbound, ErrorCode.INCONSISTENT_CLUSTER_ID)
        elif isinstance(message, VoteRequest):
            requests.on_vote_request(self, inbound, now_ms)
        elif isinstance(message, BeginQuorumEpochRequest):
            requests.on_begin_quorum_epoch(self, inbound, now_ms)
        elif isinstance(message, EndQuorumEpochRequest):
            requests.on_end_quorum_epoch(self, inbound, now_ms)
        else:
            requests.on_leader_only_request(self, inbound, now_ms)
        return self._finish(now_ms)

    def propose(self, records: Sequence[bytes], now_ms: int) -> tuple[AppendResult, Output]:
        """Append `records` as one batch. Raises NotLeaderError elsewhere.
        The records are committed when the high watermark passes
        `last_offset` (and the log still holds them in this epoch)."""
        if not isinstance(self.state, LeaderState):
            raise NotLeaderError(self.leader_and_epoch.leader_id, self.epoch)
        if not records:
            raise RaftUsageError("propose needs at least one record")
        result = self.state.propose(self, records, now_ms)
        return result, self._finish(now_ms)

    def change_voters(self, voters: frozenset[int] | set[int], now_ms: int, *,
                      same_set: bool = False) -> tuple[AppendResult, Output]:
        """Append a voter-set record adding or removing exactly one voter
        (leader only). Refused while the previous change is uncommitted, or
        before this leader committed a record of its own epoch (Raft's
        single-server change rule). The new set counts from the append on; a
        leader that removed itself leads until the record is committed, then
        resigns."""
        if not isinstance(self.state, LeaderState):
            raise NotLeaderError(self.leader_and_epoch.leader_id, self.epoch)
        result = self.state.change_voters(self, frozenset(voters), now_ms, same_set=same_set)
        return result, self._finish(now_ms)

    def resign(self, now_ms: int) -> Output:
        """Graceful shutdown: a leader resigns and hands over (EndQuorumEpoch)."""
        if isinstance(self.state, LeaderState):
            self.become_resigned(self.state.preferred_successors(), now_ms)
        return self._finish(now_ms)

    def create_snapshot(self, end_offset: int, data: bytes, now_ms: int) -> tuple[SnapshotId, Output]:
        """Store the state machine's image of [0, end_offset); only committed
        state may be snapshotted. Older snapshots and log go as
        `_retain_snapshots` says."""
        hw = self.high_watermark
        if hw is None or end_offset > hw:
            raise RaftUsageError(
                f"snapshot end offset {end_offset} is above the high watermark {hw}: "
                "snapshot only state applied from committed records"
            )
        latest = self.log.latest_snapshot_id
        if latest is not None and end_offset <= latest.end_offset:
            return latest, self._finish(now_ms)
        if end_offset < self.log.log_start_offset:
            raise RaftUsageError(f"snapshot end offset {end_offset} is below the log start offset")
        snapshot_id = self.log.create_snapshot(end_offset, data)
        self._retain_snapshots(now_ms)
        self._bytes_since_snapshot = 0
        return snapshot_id, self._finish(now_ms)

    def _retain_snapshots(self, now_ms: int) -> None:
        """Keep the two newest snapshots and any a fetcher is downloading
        from this leader right now; delete the others, and the log below the
        oldest one kept. So a fetcher that installs any kept snapshot can
        fetch on from the log after it, and a download is not pulled from
        under a slow fetcher by the next snapshot (which would make it chase
        snapshots forever)."""
        log = self.log
        ids = log.snapshot_ids
        if not ids:
            return
        in_use = self.state.snapshots_in_use(self, now_ms) if isinstance(self.state, LeaderState) else set()
        keep = [s for s in ids if (s in ids[-2:] or s in in_use) and s.end_offset >= log.log_start_offset]
        log.delete_before(min(keep))
        for snapshot_id in ids:
            if snapshot_id not in keep:
                log.delete_snapshot(snapshot_id)

    def _on_voters_changed(self, now_ms: int) -> None:
        """A voter-set record was appended or truncated away: a node that left
        the set stops taking part in elections; one that joined starts."""
        (_, was_voter), self._known_voters = self._known_voters, (self.voters, self.may_stand)
        is_voter = self.may_stand
        st = self.state
        if isinstance(st, LeaderState):
            st.on_voters_changed(self, now_ms)
        elif isinstance(st, VotedState) and was_voter != is_voter:
            # Keep the vote: one binding vote per epoch, voter or not.
            self._transition(VotedState(self.epoch, st.voted_id, core=self, now_ms=now_ms), now_ms)
        elif was_voter and not is_voter and not isinstance(st, (FollowerState, UnattachedState)):
            if st.voted_id is not None:  # a Candidate voted for itself
                self._transition(VotedState(self.epoch, st.voted_id, core=self, now_ms=now_ms), now_ms)
            else:
                self._transition(UnattachedState(self.epoch, core=self, now_ms=now_ms), now_ms)
        elif was_voter != is_voter and isinstance(st, UnattachedState):
            # An Unattached observer looks for the leader; a voter waits to stand.
            self._transition(UnattachedState(self.epoch, core=self, now_ms=now_ms), now_ms)

    def notice_voters_changed(self, now_ms: int) -> None:
        if (self.voters, self.may_stand) != self._known_voters:
            self._on_voters_changed(now_ms)

    def _finish(self, now_ms: int) -> Output:
        self.notice_voters_changed(now_ms)
        messages, self._messages = tuple(self._messages), []
        persist = None
        if self.may_stand or self.state.voted_id is not None:
            election = self.state.election_state(self.voters)
            if election != self._persisted:
                persist = self._persisted = election
        log = self.log
        installed, self._snapshot_installed = self._snapshot_installed, None
        latest = log.latest_snapshot_id
        flush_to = None
        if log.flushed_offset < log.log_end_offset and (self._flushes_eagerly or now_ms >= self._observer_flush_at_ms):
            flush_to = log.log_end_offset
            self._observer_flush_at_ms = now_ms + OBSERVER_FLUSH_INTERVAL_MS
        suggested = (
            self._bytes_since_snapshot >= self.config.metadata_log_max_record_bytes_between_snapshots
            and self.high_watermark is not None
            and self.high_watermark > (latest.end_offset if latest else 0)
        )
        return Output(
            messages=messages,
            persist_election_state=persist,
            flush_log_to_offset=flush_to,
            high_watermark=self.high_watermark,
            leader=self.leader_and_epoch,
            role=self.state.name,
            snapshot_installed=installed,
            snapshot_suggested=suggested,
            wake_at_ms=max(now_ms, self.state.wake_at_ms(self, now_ms)),
        )

    # --- services for the roles ----------------------------------------------------

    def send_request(self, destination_id: int, message: Message) -> int:
        self._next_correlation += 1
        self._messages.append(Outbound(destination_id, message, self._next_correlation))
        return self._next_correlation

    def respond(self, destination_id: int, message: Message, correlation: Hashable) -> None:
        self._messages.append(Outbound(destination_id, message, correlation))

    def random_election_timeout_ms(self) -> int:
        timeout = self.config.controller_quorum_election_timeout_ms
        return timeout + self.rng.randrange(timeout)

    def random_voter(self) -> int:
        # Never this node: one that shares a voter's id but not its directory
        # id (a wiped disk) would fetch from itself.
        others = sorted(self.voters - {self.node_id})
        return self.rng.choice(others or sorted(self.voters))

    def note_appended(self, size_in_bytes: int) -> None:
        self._bytes_since_snapshot += size_in_bytes

    def learn_high_watermark(self, offset: int) -> None:
        """Raise the HW; it never goes down (a stale leader may report less)."""
        if self.high_watermark is None or offset > self.high_watermark:
            assert offset <= self.log.log_end_offset, (offset, self.log.log_end_offset)
            self.high_watermark = offset

    def install_snapshot(self, snapshot_id: SnapshotId, data: bytes, now_ms: int) -> None:
        self.log.install_snapshot(snapshot_id, data)
        self._snapshot_installed = snapshot_id
        self._bytes_since_snapshot = 0
        # The leader only holds snapshots of committed records.
        self.learn_high_watermark(snapshot_id.end_offset)
        self._retain_snapshots(now_ms)

    # --- transitions (see the table in state.py) -------------------------------

    def _transition(self, new_state: EpochState, now_ms: int) -> None:
        assert new_state.epoch >= self.state.epoch, (self.state, new_state)
        old, self.state = self.state, new_state
        old.on_exit(self, now_ms)
        new_state.on_enter(self, now_ms)

    def become_unattached(self, epoch: int, now_ms: int, election_delay_ms: int | None = None) -> None:
        assert epoch > self.epoch or not self.may_stand, (self.state, epoch)
        self._transition(UnattachedState(epoch, core=self, now_ms=now_ms, election_delay_ms=election_delay_ms), now_ms)

    def become_voted(self, candidate_id: int, now_ms: int) -> None:
        assert self.state.voted_id is None
        self._transition(VotedState(self.epoch, candidate_id, core=self, now_ms=now_ms), now_ms)

    def become_prospective(self, now_ms: int) -> None:
        assert self.may_stand
        st = self.state
        self._transition(
            ProspectiveState(st.epoch, leader_id=st.leader_id, voted_id=st.voted_id, core=self, now_ms=now_ms), now_ms
        )

    def become_candidate(self, now_ms: int) -> None:
        assert isinstance(self.state, ProspectiveState)
        self._transition(CandidateState(self.epoch + 1, core=self, now_ms=now_ms), now_ms)

    def become_leader(self, granting_voters: Sequence[int], now_ms: int) -> None:
        assert isinstance(self.state, CandidateState)
        self._transition(LeaderState(self.epoch, granting_voters, core=self, now_ms=now_ms), now_ms)

    def become_follower(self, epoch: int, leader_id: int, now_ms: int) -> None:
        assert leader_id != self.node_id
        voted_id = self.state.voted_id if epoch == self.epoch else None
        self._transition(FollowerState(epoch, leader_id, voted_id, core=self, now_ms=now_ms), now_ms)

    def become_resigned(self, preferred_successors: Sequence[int], now_ms: int) -> None:
        assert isinstance(self.state, LeaderState)
        self._transition(ResignedState(self.epoch, preferred_successors, core=self, now_ms=now_ms), now_ms)

    # --- epochs and leaders learned from any message ------------------------

    def learn_leader(self, leader_id: int, epoch: int, now_ms: int) -> None:
        """Someone reports `leader_id` (or NO_LEADER) leads `epoch`."""
        if epoch > self.epoch:
            # Any reported leader, not only one of our voters: a voter added by
            # a record we have not fetched yet may have been elected.
            if leader_id != NO_LEADER and leader_id != self.node_id:
                self.become_follower(epoch, leader_id, now_ms)
            else:
                self.become_unattached(epoch, now_ms)
            return
        if epoch < self.epoch or leader_id == NO_LEADER or leader_id == self.node_id:
            return
        st = self.state
        # Raft's Election Safety: one leader per epoch.
        assert st.leader_id in (None, leader_id), f"epoch {epoch} has leaders {st.leader_id} and {leader_id}"
        # A Prospective that already knows this leader timed out on it; only
        # news of a leader it did not know makes it follow (see candidate.py).
        if st.leader_id is None:
            self.become_follower(epoch, leader_id, now_ms)

    def _on_response(self, inbound: Inbound, now_ms: int) -> None:
        response = inbound.message
        before = self.state
        self.learn_leader(response.leader_id, response.leader_epoch, now_ms)
        if self.state is not before:
            return  # the response belonged to the role just left
        if isinstance(response, VoteResponse):
            before.on_vote_response(self, inbound, now_ms)
        elif isinstance(response, FetchResponse):
            before.on_fetch_response(self, inbound, now_ms)
        elif isinstance(response, FetchSnapshotResponse):
            before.on_fetch_snapshot_response(self, inbound, now_ms)
        elif isinstance(response, BeginQuorumEpochResponse):
            before.on_begin_quorum_epoch_response(self, inbound, now_ms)
        else:
            before.on_end_quorum_epoch_response(self, inbound, now_ms)

    def answer_as_non_leader(
        self, source_id: int, request: FetchRequest | FetchSnapshotRequest, correlation: Hashable
    ) -> None:
        requests.answer_as_non_leader(self, source_id, request, correlation)
