"""The leader's view of the ISR while changes to it travel to the controller (KIP-497).

Theory of operation
-------------------
Only the controller changes the ISR. A leader that wants a follower in or
out sends AlterPartition with the partition epoch and leader epoch it knows,
and learns the outcome from the response or from the metadata log, which
ever comes first. Until then the change is *pending*, and the leader must
not count on either outcome:

- for the high watermark it counts the **maximal ISR**, the union of the
  committed ISR and the proposed one: a pending shrink never lets the HW
  pass a replica that may still be in the ISR, and a pending expansion
  makes the HW wait for the newcomer too (Kafka's PendingShrinkIsr /
  PendingExpandIsr);
- for `min.insync.replicas` it counts the **guaranteed ISR**, their
  intersection: the members that are in the ISR whatever the controller
  decides.

States (`IsrState`), one change in flight at a time:

    Committed      => Pending       the leader proposes an expansion or a
                                    shrink (`propose`)
    Pending        => Committed     a response or metadata update shows a
                                    newer partition epoch (`commit`), or
                                    the controller refused the change without
                                    applying it (INELIGIBLE_REPLICA,
                                    INVALID_REQUEST: `revert`)
    Pending        => Pending       a retriable failure (no answer,
                                    NOT_CONTROLLER): send again after a
                                    backoff; INVALID_UPDATE_VERSION or
                                    FENCED_LEADER_EPOCH: our state is stale and
                                    the change may even have been applied by
                                    an earlier attempt, so stay pending until
                                    the metadata log says what happened

Reverting on an ambiguous error would be unsafe: if the first attempt of an
expansion was applied and only its response was lost, the retry fails with
INVALID_UPDATE_VERSION, and a leader that then forgot the newcomer could let
the HW pass it while the controller counts it in the ISR.
"""

from __future__ import annotations

import dataclasses

from broker.core.replication.messages import AlterPartitionProposal

#: `retry_at_ms` of a pending change that waits for the metadata log instead
#: of being sent again.
AWAIT_METADATA = -1


@dataclasses.dataclass(frozen=True, slots=True)
class PendingIsrChange:
    proposal: AlterPartitionProposal
    #: None: sent, awaiting its answer; AWAIT_METADATA: answered, waiting for
    #: the metadata log to tell the outcome; else when to send it again.
    retry_at_ms: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class IsrState:
    """The committed ISR at `partition_epoch`, and the change in flight, if any."""

    isr: tuple[int, ...]
    partition_epoch: int
    pending: PendingIsrChange | None = None

    @property
    def in_flight(self) -> bool:
        return self.pending is not None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """Committed plus proposed members: what the high watermark waits for."""
        if self.pending is None:
            return self.isr
        return self.isr + tuple(b for b in self.pending.proposal.isr if b not in self.isr)

    @property
    def guaranteed_isr(self) -> tuple[int, ...]:
        """Members of both the committed and the proposed ISR: what
        `min.insync.replicas` counts."""
        if self.pending is None:
            return self.isr
        proposed = self.pending.proposal.isr
        return tuple(b for b in self.isr if b in proposed)

    def propose(self, proposal: AlterPartitionProposal) -> IsrState:
        assert self.pending is None, "one ISR change in flight at a time"
        assert proposal.partition_epoch == self.partition_epoch
        return dataclasses.replace(self, pending=PendingIsrChange(proposal))

    def commit(self, isr: tuple[int, ...], partition_epoch: int) -> IsrState:
        assert partition_epoch > self.partition_epoch, (partition_epoch, self.partition_epoch)
        return IsrState(tuple(isr), partition_epoch)

    def revert(self) -> IsrState:
        return IsrState(self.isr, self.partition_epoch)

    def with_retry_at(self, retry_at_ms: int | None) -> IsrState:
        """Schedule a resend (a time), mark it sent (None) or wait for metadata (AWAIT_METADATA)."""
        assert self.pending is not None
        return dataclasses.replace(self, pending=PendingIsrChange(self.pending.proposal, retry_at_ms))
