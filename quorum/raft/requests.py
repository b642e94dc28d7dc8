"""The requests every role answers the same way, and their validation.

Vote (Raft §5.2, §5.4.1; KIP-996 pre-vote), BeginQuorumEpoch and
EndQuorumEpoch (KIP-595) change a voter's epoch, vote or leader whatever its
role, so they are handled here; the role only says whether it grants a vote
(`EpochState.grant_vote`). Fetch and FetchSnapshot are checked here
(epochs, arguments) and then served by the leader (`leader.py`). Every
answer carries this node's view of (leader id, epoch), so a fetcher or
candidate that is behind learns where the quorum is.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode
from quorum.raft.leader import LeaderState
from quorum.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Inbound,
    Message,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


def reply(core: RaftCore, inbound: Inbound, error: ErrorCode, *, vote_granted: bool = False) -> None:
    """Answer `inbound` with `error` (NONE for a plain success) and our view."""
    request = inbound.message
    leader = core.leader_and_epoch
    leader_id = NO_LEADER if leader.leader_id is None else leader.leader_id
    response: Message
    if isinstance(request, VoteRequest):
        response = VoteResponse(
            error_code=error, leader_id=leader_id, leader_epoch=core.epoch, vote_granted=vote_granted
        )
    elif isinstance(request, BeginQuorumEpochRequest):
        response = BeginQuorumEpochResponse(error_code=error, leader_id=leader_id, leader_epoch=core.epoch)
    elif isinstance(request, EndQuorumEpochRequest):
        response = EndQuorumEpochResponse(error_code=error, leader_id=leader_id, leader_epoch=core.epoch)
    elif isinstance(request, FetchRequest):
        response = FetchResponse(
            error_code=error,
            leader_id=leader_id,
            leader_epoch=core.epoch,
            high_watermark=-1,
            log_start_offset=core.log.log_start_offset,
        )
    else:
        assert isinstance(request, FetchSnapshotRequest)
        response = FetchSnapshotResponse(
            error_code=error,
            leader_id=leader_id,
            leader_epoch=core.epoch,
            snapshot_id=request.snapshot_id,
            size=-1,
            position=request.position,
            unaligned_records=b"",
        )
    core.respond(inbound.source_id, response, inbound.correlation)


def _voter_only_error(core: RaftCore, sender_id: int, receiver_id: int, sender_epoch: int,
                      receiver_directory_id: uuid.UUID | None = None) -> ErrorCode | None:  # noqa: F821
    # The sender need not be in our voter set: a voter added by a record we
    # have not fetched yet may stand or lead. Nor need we be in it, if the
    # sender names us: we may be that added voter (KIP-853; Raft §4.2.3
    # lets servers answer without consulting their configuration).
    if not core.may_stand and receiver_id != core.node_id:
        return ErrorCode.INCONSISTENT_VOTER_SET
    if receiver_id != NO_LEADER and receiver_id != core.node_id:
        return ErrorCode.INVALID_VOTER_KEY
    if not core.same_directory(receiver_directory_id, core.directory_id):
        # The sender means this node id on another disk (KIP-853): this one
        # was wiped and formatted again, and its log may lack what that voter
        # acknowledged, so it must not vote in its place.
        return ErrorCode.INVALID_VOTER_KEY
    if sender_epoch < core.epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    return None


def on_vote_request(core: RaftCore, inbound: Inbound, now_ms: int) -> None:
    request = inbound.message
    assert isinstance(request, VoteRequest)
    # A candidate bumped its epoch past its log's; a pre-vote did not (KIP-996).
    if request.pre_vote:
        illegal_epoch = request.last_offset_epoch > request.replica_epoch
    else:
        illegal_epoch = request.last_offset_epoch >= request.replica_epoch
    if request.last_offset < 0 or request.last_offset_epoch < 0 or illegal_epoch:
        reply(core, inbound, ErrorCode.INVALID_REQUEST)
        return
    error = _voter_only_error(core, request.replica_id, request.voter_id, request.replica_epoch,
                              request.voter_directory_id)
    if error is not None:
        reply(core, inbound, error)
        return
    if request.replica_epoch > core.epoch:
        core.become_unattached(request.replica_epoch, now_ms)
    # Raft §5.4.1: vote only for a candidate whose log is at least as up to
    # date as ours, so the winner holds every committed record.
    candidate_log = OffsetAndEpoch(request.last_offset_epoch, request.last_offset)
    our_log = OffsetAndEpoch(core.log.last_fetched_epoch, core.log.log_end_offset)
    granted = core.state.grant_vote(core, request.replica_id, candidate_log >= our_log, request.pre_vote)
    if granted and request.pre_vote and core.state.name == "Prospective" and candidate_log == our_log \
            and request.replica_id > core.node_id:
        # Two voters that saw the leader die at about the same time, both
        # asking with the same log, would grant each other's pre-vote, both
        # stand, split the binding vote and wait out a whole election
        # timeout. Between such two the lower id goes first (a pre-vote
        # only decides who stands, never who may win: Raft's safety does
        # not depend on it, KIP-996); the higher one follows its Vote.
        granted = False
    if granted and not request.pre_vote and core.state.voted_id is None:
        core.become_voted(request.replica_id, now_ms)  # persisted before the answer leaves
    reply(core, inbound, ErrorCode.NONE, vote_granted=granted)


def on_begin_quorum_epoch(core: RaftCore, inbound: Inbound, now_ms: int) -> None:
    request = inbound.message
    assert isinstance(request, BeginQuorumEpochRequest)
    error = _voter_only_error(core, request.leader_id, request.voter_id, request.leader_epoch,
                              request.voter_directory_id)
    if error is None:
        core.learn_leader(request.leader_id, request.leader_epoch, now_ms)
    reply(core, inbound, error or ErrorCode.NONE)


def on_end_quorum_epoch(core: RaftCore, inbound: Inbound, now_ms: int) -> None:
    request = inbound.message
    assert isinstance(request, EndQuorumEpochRequest)
    error = _voter_only_error(core, request.leader_id, NO_LEADER, request.leader_epoch)
    if error is None:
        delay = _successor_delay_ms(core, request.preferred_successors)
        if request.leader_epoch > core.epoch:
            core.become_unattached(request.leader_epoch, now_ms, election_delay_ms=delay)
        elif core.state.leader_id == request.leader_id != core.node_id:
            core.state.on_leader_resigned(core, delay, now_ms)
    reply(core, inbound, error or ErrorCode.NONE)


def _successor_delay_ms(core: RaftCore, preferred_successors: Sequence[int]) -> int:
    """KIP-595: the first preferred successor stands at once, the next ones
    after exponentially longer pauses, so the most caught-up voter
    usually wins; a voter not listed waits a random backoff."""
    cap = core.config.controller_quorum_election_backoff_max_ms
    if core.node_id not in preferred_successors:
        return core.rng.randrange(cap + 1)
    position = list(preferred_successors).index(core.node_id)
    return 0 if position == 0 else min(cap, core.config.controller_quorum_retry_backoff_ms << position)


def on_leader_only_request(core: RaftCore, inbound: Inbound, now_ms: int) -> None:
    request = inbound.message
    assert isinstance(request, (FetchRequest, FetchSnapshotRequest))
    if isinstance(request, FetchRequest) and (
        request.fetch_offset < 0
        or request.last_fetched_epoch < 0
        or request.last_fetched_epoch > request.current_leader_epoch
    ):
        reply(core, inbound, ErrorCode.INVALID_REQUEST)
        return
    if request.current_leader_epoch != core.epoch or not isinstance(core.state, LeaderState):
        core.answer_as_non_leader(inbound.source_id, request, inbound.correlation)
    elif isinstance(request, FetchRequest):
        core.state.on_fetch_request(core, inbound, now_ms)
    else:
        core.state.on_fetch_snapshot_request(core, inbound, now_ms)


def answer_as_non_leader(
    core: RaftCore, source_id: int, request: FetchRequest | FetchSnapshotRequest, correlation: Hashable
) -> None:
    """The error a Fetch gets from a node that is not its epoch's leader."""
    if request.current_leader_epoch < core.epoch:
        error = ErrorCode.FENCED_LEADER_EPOCH
    elif request.current_leader_epoch > core.epoch:
        error = ErrorCode.UNKNOWN_LEADER_EPOCH
    else:
        error = ErrorCode.NOT_LEADER_OR_FOLLOWER
    reply(core, Inbound(source_id, request, correlation), error)
