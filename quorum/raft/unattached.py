"""UnattachedState and VotedState: an epoch with no known leader.

A voter waits a random election timeout in [T, 2T) (Raft §5.2: randomized
timeouts make split votes rare), then probes with a pre-vote (Prospective).
Voted is Unattached after granting a binding vote: the vote is persisted and
binds for the whole epoch (Raft §5.2: at most one vote per term).

An observer never votes or stands; while Unattached it asks voters, one at a
time and at random, by Fetch; whichever answers names the leader (every
answer carries the responder's leader id and epoch), and the observer
follows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorum.raft.fetcher import Fetcher
from quorum.raft.messages import Inbound
from quorum.raft.state import EpochState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


class UnattachedState(EpochState):
    name = "Unattached"

    def __init__(self, epoch: int, *, core: RaftCore, now_ms: int, election_delay_ms: int | None = None) -> None:
        super().__init__(epoch)
        delay = core.random_election_timeout_ms() if election_delay_ms is None else election_delay_ms
        self.election_deadline_ms = now_ms + delay
        self.discovery: Fetcher | None = None
        if not core.may_stand:
            self.discovery = Fetcher(core.random_voter(), max_wait_ms=0)

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        if self.discovery is not None:
            self.discovery.maybe_send(core, self.epoch, now_ms)

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        if self.discovery is not None:
            if self.discovery.in_flight is not None and now_ms >= self.discovery.wake_at_ms(core):
                self.discovery.target_id = core.random_voter()
            self.discovery.maybe_send(core, self.epoch, now_ms)
        elif now_ms >= self.election_deadline_ms:
            core.become_prospective(now_ms)

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        if self.discovery is not None:
            return self.discovery.wake_at_ms(core)
        return self.election_deadline_ms

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        return log_up_to_date

    def on_fetch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        # Reached only when the answer named no leader we could follow: ask another voter.
        if self.discovery is not None and self.discovery.take(inbound.correlation):
            self.discovery.target_id = core.random_voter()
            self.discovery.back_off(core, now_ms)

    def on_leader_resigned(self, core: RaftCore, delay_ms: int, now_ms: int) -> None:
        self.election_deadline_ms = min(self.election_deadline_ms, now_ms + delay_ms)


class VotedState(UnattachedState):
    """Unattached with a binding vote in this epoch. A node outside its own
    voter set may hold one too: a voter added by a record it has not fetched
    yet is asked to vote by name (KIP-853); it keeps the vote, and, like an
    Unattached observer, looks for the leader instead of standing."""

    name = "Voted"

    def __init__(self, epoch: int, voted_id: int, *, core: RaftCore, now_ms: int) -> None:
        super().__init__(epoch, core=core, now_ms=now_ms)
        self.voted_id = voted_id

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        if pre_vote:
            return log_up_to_date
        # Granting the same vote again is safe (a retried or duplicated request).
        return candidate_id == self.voted_id

    def on_leader_resigned(self, core: RaftCore, delay_ms: int, now_ms: int) -> None:
        self.election_deadline_ms = min(self.election_deadline_ms, now_ms + delay_ms)
