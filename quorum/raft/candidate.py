"""ProspectiveState and CandidateState: asking the other voters for votes.

Prospective (KIP-996 pre-vote) asks "would you vote for me?" in its current
epoch, without bumping the epoch or persisting anything; receivers answer
from the same rules as a real vote, except that a follower that is fetching
from a live leader says no. Only with a majority of pre-votes does the node
become a Candidate: it bumps the epoch, votes for itself (persisted before
any request leaves), and asks for binding votes (Raft §5.2). A majority
makes it Leader. A node cut off by a partition thus stays Prospective in its
old epoch, and when the partition heals it does not force the healthy
quorum into a new election.

Unanswered (pre-)vote requests are sent again after `controller_quorum_request_timeout_ms`;
at the election timeout (randomized in [T, 2T)) a new pre-vote round starts.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode
from quorum.raft.messages import Inbound, VoteRequest, VoteResponse
from quorum.raft.state import EpochState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


class _Election(EpochState):
    """A round of (pre-)vote requests to every other voter."""

    pre_vote: bool

    def __init__(
        self, epoch: int, *, leader_id: int | None, voted_id: int | None, core: RaftCore, now_ms: int
    ) -> None:
        super().__init__(epoch, leader_id=leader_id, voted_id=voted_id)
        self.granted: set[int] = {core.node_id}
        self.rejected: set[int] = set()
        self.in_flight: dict[Hashable, int] = {}
        self.next_send_ms: dict[int, int] = {}  # voter -> when to (re)send its request
        self.election_deadline_ms = now_ms + core.random_election_timeout_ms()

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        if not self._tally(core, now_ms):
            self._send_requests(core, now_ms)

    def _send_requests(self, core: RaftCore, now_ms: int) -> None:
        log = core.log
        for voter in sorted(core.voters - self.granted - self.rejected):
            if now_ms < self.next_send_ms.get(voter, now_ms):
                continue
            request = VoteRequest(
                cluster_id=core.cluster_id,
                voter_id=voter,
                replica_id=core.node_id,
                replica_epoch=self.epoch,
                last_offset_epoch=log.last_fetched_epoch,
                last_offset=log.log_end_offset,
                pre_vote=self.pre_vote,
                voter_directory_id=core.recorded_directory_id(voter),
                replica_directory_id=core.directory_id,
            )
            self.in_flight[core.send_request(voter, request)] = voter
            self.next_send_ms[voter] = now_ms + core.config.controller_quorum_request_timeout_ms

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        if now_ms >= self.election_deadline_ms:
            core.become_prospective(now_ms)
            return
        self._send_requests(core, now_ms)

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        pending = [self.next_send_ms.get(v, now_ms) for v in core.voters - self.granted - self.rejected]
        return min([self.election_deadline_ms, *pending])

    def on_vote_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        voter = self.in_flight.pop(inbound.correlation, None)
        if voter is None:
            return
        response = inbound.message
        assert isinstance(response, VoteResponse)
        if response.error_code != ErrorCode.NONE or response.leader_epoch != self.epoch:
            # Ask again after the retry backoff, not a whole request timeout.
            self.next_send_ms[voter] = now_ms + core.config.controller_quorum_retry_backoff_ms
            return
        (self.granted if response.vote_granted else self.rejected).add(voter)
        if not response.vote_granted and self.on_rejected(core, response, now_ms):
            return
        if not self._tally(core, now_ms) and len(self.rejected & core.voters) >= core.majority:
            self.on_lost(core, now_ms)

    def _tally(self, core: RaftCore, now_ms: int) -> bool:
        # Only votes of the latest set count; a removed voter standing to
        # commit its removal does not count its own.
        if len(self.granted & core.voters) >= core.majority:
            self.on_won(core, now_ms)
            return True
        return False

    def on_won(self, core: RaftCore, now_ms: int) -> None:
        raise NotImplementedError

    def on_rejected(self, core: RaftCore, response: VoteResponse, now_ms: int) -> bool:
        """React to one rejection; True if that ended this role."""
        return False

    def on_lost(self, core: RaftCore, now_ms: int) -> None:
        """A majority said no: wait for the election deadline."""


class ProspectiveState(_Election):
    name = "Prospective"
    pre_vote = True

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        if pre_vote:
            return log_up_to_date
        if self.leader_id is not None:
            return False
        if self.voted_id is not None:
            return candidate_id == self.voted_id
        return log_up_to_date

    def on_won(self, core: RaftCore, now_ms: int) -> None:
        core.become_candidate(now_ms)

    def on_rejected(self, core: RaftCore, response: VoteResponse, now_ms: int) -> bool:
        # The voter still fetches from the leader we gave up on: it is alive
        # after all (we were cut off, or a fetch got lost). Follow it again.
        if response.leader_id == self.leader_id and self.leader_id not in (None, core.node_id):
            core.become_follower(self.epoch, response.leader_id, now_ms)
            return True
        return False


class CandidateState(_Election):
    name = "Candidate"
    pre_vote = False

    def __init__(self, epoch: int, *, core: RaftCore, now_ms: int) -> None:
        super().__init__(epoch, leader_id=None, voted_id=core.node_id, core=core, now_ms=now_ms)

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        # It voted for itself in this epoch; a pre-vote only asks whether it would.
        return pre_vote and log_up_to_date

    def on_won(self, core: RaftCore, now_ms: int) -> None:
        core.become_leader(sorted(self.granted), now_ms)

    def on_lost(self, core: RaftCore, now_ms: int) -> None:
        # Back off a random while, at most election.backoff.max.ms, then start
        # over with a pre-vote: a lost election should not be retried in lockstep.
        backoff = core.rng.randrange(core.config.controller_quorum_election_backoff_max_ms + 1)
        self.election_deadline_ms = min(self.election_deadline_ms, now_ms + backoff)
