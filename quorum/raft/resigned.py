"""ResignedState: a leader that stepped down, still in its epoch.

A leader resigns on graceful shutdown and when check-quorum fails; a voter
that restarts and finds itself the persisted leader comes back Resigned too:
it no longer accepts appends, and it never becomes leader of that epoch
again. It sends EndQuorumEpoch to the other voters, listing them most
caught up first (KIP-595's preferred successors); the first one starts an
election at once, the others after a growing delay, so the most caught-up
voter usually wins. Its own election timer runs too: if nobody else is
elected, it tries again itself (through a pre-vote).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode
from quorum.raft.messages import EndQuorumEpochRequest, EndQuorumEpochResponse, Inbound
from quorum.raft.state import EpochState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


class ResignedState(EpochState):
    name = "Resigned"

    def __init__(self, epoch: int, preferred_successors: Sequence[int], *, core: RaftCore, now_ms: int) -> None:
        super().__init__(epoch, leader_id=core.node_id, voted_id=core.node_id)
        self.preferred_successors = tuple(preferred_successors)
        self.unacked_voters = set(core.voters) - {core.node_id}
        self.next_send_ms: dict[int, int] = {}
        self.in_flight: dict[Hashable, int] = {}
        self.election_deadline_ms = now_ms + core.random_election_timeout_ms()

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        self._send_end_quorum_epoch(core, now_ms)

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        if now_ms >= self.election_deadline_ms:
            if core.may_stand:
                core.become_prospective(now_ms)
            else:  # a leader that removed itself looks for its successor
                core.become_unattached(self.epoch, now_ms)
            return
        self._send_end_quorum_epoch(core, now_ms)

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        return min([self.election_deadline_ms, *(self.next_send_ms.get(v, now_ms) for v in self.unacked_voters)])

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        return pre_vote and log_up_to_date

    def _send_end_quorum_epoch(self, core: RaftCore, now_ms: int) -> None:
        for voter in sorted(self.unacked_voters):
            if now_ms < self.next_send_ms.get(voter, now_ms):
                continue
            request = EndQuorumEpochRequest(
                cluster_id=core.cluster_id,
                leader_id=core.node_id,
                leader_epoch=self.epoch,
                preferred_successors=self.preferred_successors,
            )
            self.in_flight[core.send_request(voter, request)] = voter
            self.next_send_ms[voter] = now_ms + core.config.controller_quorum_request_timeout_ms

    def on_end_quorum_epoch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        voter = self.in_flight.pop(inbound.correlation, None)
        response = inbound.message
        assert isinstance(response, EndQuorumEpochResponse)
        if voter is not None and response.error_code == ErrorCode.NONE:
            self.unacked_voters.discard(voter)
