"""EpochState: the base of the roles a node plays in one epoch.

Each role is its own class in its own module; `RaftCore` holds exactly one
and replaces it on every transition (after Kafka's `QuorumState`). The
transitions a voter makes (KIP-595, with KIP-996 pre-vote):

    Unattached  => Voted:        after granting a (binding) vote in its epoch
                => Prospective:  after the election timeout expires
                => Follower:     after discovering a leader of an equal or larger epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Voted       => Prospective:  after the election timeout expires
                => Follower:     after discovering a leader of an equal or larger epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Prospective => Candidate:    after a majority granted its pre-vote
                => Prospective:  after the election timeout expires (a new round)
                => Follower:     after discovering a leader of an equal or larger epoch
                => Voted:        after granting a binding vote in its epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Candidate   => Leader:       after receiving a majority of votes
                => Prospective:  after the election timeout expires (or a lost election's backoff)
                => Follower:     after discovering a leader of an equal or larger epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Leader      => Resigned:     on graceful shutdown, or when no majority fetched
                                 within the fetch timeout (check-quorum)
                => Follower / Unattached: after learning of a larger epoch
    Follower    => Prospective:  after the fetch timeout expires
                => Follower:     after discovering a leader of a larger epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Resigned    => Prospective:  after the election timeout expires
                => Follower / Unattached: after learning of a larger epoch

An observer (not in the voter set) is only ever Unattached or Follower:

    Unattached  => Follower:     after discovering a leader of an equal or larger epoch
                => Unattached:   after learning of a larger epoch with no known leader
    Follower    => Unattached:   after the fetch timeout expires, or a larger epoch with no leader
                => Follower:     after discovering a leader of a larger epoch

A restarted voter resumes from its persisted `ElectionState`: Resigned if it
was the leader (it must never lead an epoch twice from a log it may have
lost the tail of), Candidate if it had voted for itself, Voted, Follower, or
Unattached otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from quorum.raft.election import ElectionState
from quorum.raft.messages import Inbound

if TYPE_CHECKING:
    from quorum.raft.core import RaftCore


class EpochState:
    """One role in one epoch. Handlers that a role does not override do
    nothing: a message a role has no use for is dropped."""

    name: ClassVar[str]

    def __init__(self, epoch: int, *, leader_id: int | None = None, voted_id: int | None = None) -> None:
        self.epoch = epoch
        self.leader_id = leader_id
        self.voted_id = voted_id

    def __repr__(self) -> str:
        return f"{self.name}(epoch={self.epoch}, leader={self.leader_id}, voted={self.voted_id})"

    def election_state(self, voters: frozenset[int]) -> ElectionState:
        return ElectionState(self.epoch, self.leader_id, self.voted_id, voters)

    # --- lifecycle ---------------------------------------------------------

    def on_enter(self, core: RaftCore, now_ms: int) -> None:
        """Send what the role sends first."""

    def on_exit(self, core: RaftCore, now_ms: int) -> None:
        """Release what the role holds (e.g. parked fetches)."""

    def on_tick(self, core: RaftCore, now_ms: int) -> None:
        """Fire the timers that expired by `now_ms`."""

    def wake_at_ms(self, core: RaftCore, now_ms: int) -> int:
        """When `on_tick` must run next at the latest."""
        raise NotImplementedError

    # --- votes ---------------------------------------------------------------

    def grant_vote(self, core: RaftCore, candidate_id: int, log_up_to_date: bool, pre_vote: bool) -> bool:
        """Whether this role grants a (pre-)vote in its own epoch (Raft §5.2,
        §5.4.1; KIP-996). Only called for a request of this role's epoch."""
        raise NotImplementedError

    # --- responses to requests this role sent ------------------------------

    def on_vote_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        pass

    def on_begin_quorum_epoch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        pass

    def on_end_quorum_epoch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        pass

    def on_fetch_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        pass

    def on_fetch_snapshot_response(self, core: RaftCore, inbound: Inbound, now_ms: int) -> None:
        pass

    # --- a same-epoch EndQuorumEpoch from the leader -------------------------

    def on_leader_resigned(self, core: RaftCore, delay_ms: int, now_ms: int) -> None:
        """The leader of this epoch resigned; start an election after `delay_ms`."""
