"""FollowerState: this node knows the leader of its epoch and fetches from it.

A voter that hears nothing from its leader for `controller_quorum_fetch_timeout_ms` becomes
Prospective (KIP-996), so a voter cut off from the leader probes with a
pre-vote instead of bumping the epoch; an observer becomes Unattached and
looks for the leader again. While it has fetched from a live leader, a
follower rejects pre-votes: that is what keeps a returning, partitioned voter
from disrupting a healthy quorum (KIP-996). It grants them again once the
leader resigned (EndQuorumEpoch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quorum.raft.errors import ErrorCode
from quorum.raft.fetcher import Fetcher
from quorum.raft.messages import FetchResponse, FetchSnapshotResponse, Inbound
from quorum.raft.state import EpochState

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


class FollowerState(EpochState):
    name = "Follower"

    def __init__(self, epoch: int, leader_id: int, voted_id: int | None, *, core: RaftCore, now_ms: int) -> None:
        super().__init__(epoch, leader_id=leader_id, voted_id=voted_id)
        self.leader_id: int = leader_id
        self.fetcher = Fetcher(leader_id, max_wait_ms=core.config.fetch_max_wait_ms)
        self.fetch_deadline_ms = now_ms + core.config.controller_quorum_fetch_timeout_ms
        self.has_fetched_from_leader = False
        self.leader_resigned = False

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        self.fetcher.maybe_send(core, self.epoch, now_ms)

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        if now_ms >= self.fetch_deadline_ms:
            if core.may_stand:
                core.become_prospective(now_ms)
            else:
                core.become_unattached(self.epoch, now_ms)
            return
        self.fetcher.maybe_send(core, self.epoch, now_ms)

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        return min(self.fetch_deadline_ms, self.fetcher.wake_at_ms(core))

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        # A binding vote in an epoch that has a leader would elect a second one.
        if not pre_vote:
            return False
        return log_up_to_date and (not self.has_fetched_from_leader or self.leader_resigned)

    def _heard_from_leader(self, core: RaftCore, now_ms: int) -> None:
        self.has_fetched_from_leader = True
        if not self.leader_resigned:
            self.fetch_deadline_ms = now_ms + core.config.controller_quorum_fetch_timeout_ms

    def on_fetch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        if not self.fetcher.take(inbound.correlation):
            return
        response = inbound.message
        assert isinstance(response, FetchResponse)
        if response.error_code != ErrorCode.NONE or response.leader_epoch != self.epoch:
            self.fetcher.back_off(core, now_ms)
            return
        self._heard_from_leader(core, now_ms)
        self.fetcher.apply_fetch(core, response)
        self.fetcher.maybe_send(core, self.epoch, now_ms)

    def on_fetch_snapshot_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        if not self.fetcher.take(inbound.correlation):
            return
        response = inbound.message
        assert isinstance(response, FetchSnapshotResponse)
        if response.leader_epoch == self.epoch and response.error_code == ErrorCode.NONE:
            self._heard_from_leader(core, now_ms)
        self.fetcher.apply_fetch_snapshot(core, response, now_ms)
        self.fetcher.maybe_send(core, self.epoch, now_ms)

    def on_leader_resigned(self, core: RaftCore, delay_ms: int, now_ms: int) -> None:
        self.leader_resigned = True
        self.fetch_deadline_ms = min(self.fetch_deadline_ms, now_ms + delay_ms)
