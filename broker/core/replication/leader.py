"""A partition leader's replication state for one leader epoch (Kafka's Partition + Replica, leader half).

Theory of operation
-------------------
A `LeaderState` lives from the moment the metadata names this broker leader
at some leader epoch until the next leader epoch; a new epoch gets a new
object, so nothing a previous term learned about the followers survives
(Kafka resets remote replica state on becoming leader).

**Followers** (`ReplicaState`, Kafka's `Replica.updateFetchState`). Each
follower Fetch that passes validation records the follower's log end offset
(its fetch offset) and when it last *caught up*: a fetch at or past the
leader's LEO as of that fetch catches up now; a fetch at or past the leader
LEO seen by the follower's previous fetch caught up at that previous fetch.
An append catches up, as of its time, every follower that was at the old
LEO: a follower in a fetch session (KIP-227) does not name a partition
whose position did not change, so its last fetch of an idle partition may
be long past. Followers in the ISR start as caught up at the start of the term.

**High watermark** (ARCHITECTURE "Replicate"). HW = min LEO over the
*maximal* ISR (see `broker.core.replication.isr`); it never moves backwards, and
it does not move at all while the *guaranteed* ISR is smaller than
`min.insync.replicas` (the KIP-966 rule: a record is committed only once at
least min.insync.replicas replicas that the controller counts in the ISR
hold it). A follower whose LEO is unknown in this term holds the HW back.

**ISR shrink** (`tick`). A follower in the ISR that is not at the leader's
LEO and has not caught up for `replica.lag.time.max.ms` is proposed out --
but never so that fewer than `min.insync.replicas` members remain (the
least-lagging followers stay). Kafka before KIP-966 shrinks down to the
leader alone; when that last replica then shuts down uncleanly, it loses
unflushed records and the controller re-elects it (the only ISR member), so
records acknowledged by min.insync.replicas replicas are lost after a single
failure. Keeping the lagging follower costs nothing here: the HW could not
advance below min.insync.replicas anyway, and it holds every acknowledged
record. Fenced brokers still leave the ISR (the controller removes them).

**ISR expansion** (on a follower fetch). A follower outside the ISR joins
once its LEO reaches the HW and the start of this leader epoch (so it has
fetched at least once in this epoch past everything the previous leaders
wrote), when it is eligible: registered, unfenced, not in controlled
shutdown, and -- when its Fetch carried one -- at the broker epoch the
metadata image knows (KIP-841, KIP-903).

Both go to the controller as an `AlterPartitionProposal`; one change is in
flight at a time. Answers come back through `on_alter_partition_result`
and metadata updates through `apply_registration`.

**Fetch validation** (`handle_replica_fetch`). Epoch checks are done by the
caller (`Partition.check_fetch`). The fetch position is validated by leader
epoch first (`divergence.validate_fetch_position`: a diverged follower gets
DivergingEpoch and its state is not updated), then by range
(OFFSET_OUT_OF_RANGE).

**acks=all** (Kafka's DelayedProduce). An append with acks=all is refused
with NOT_ENOUGH_REPLICAS while the guaranteed ISR is under
min.insync.replicas. A parked request is done once the HW passes its last
offset; if meanwhile the ISR falls under min.insync.replicas it fails
NOT_ENOUGH_REPLICAS_AFTER_APPEND (the HW cannot pass it then).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from broker.core.replication.config import ReplicationConfig
from broker.core.replication.divergence import validate_fetch_position
from broker.core.replication.isr import AWAIT_METADATA, IsrState
from broker.core.replication.messages import (
    NO_BROKER_EPOCH,
    NO_UPDATE,
    UNKNOWN_OFFSET,
    AlterPartitionProposal,
    AlterPartitionResult,
    BrokerState,
    LeaderUpdate,
    LogView,
    ReplicaFetch,
    ReplicaFetchDecision,
)

#: `handle_replica_fetch`'s usual updates, shared: it runs for every partition
#: of a follower's fetch, and building a LeaderUpdate each time costs a `__new__` call.
_HIGH_WATERMARK_MOVED = LeaderUpdate(high_watermark_moved=True)

#: Errors after which the controller did not apply the change: forget it.
_REFUSED = frozenset({ErrorCode.ineligible_replica, ErrorCode.invalid_request})
#: Errors that say our view is stale (the change may even have been applied
#: by an earlier attempt): wait for the metadata log to tell.
_STALE = frozenset({
    ErrorCode.invalid_update_version,
    ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.unknown_topic_id,
    ErrorCode.stale_broker_epoch,
    ErrorCode.new_leader_elected,
})


@dataclasses.dataclass(slots=True)
class ReplicaState:
    """What the leader knows of one follower in this leader epoch (Kafka's `Replica`)."""

    #: The follower's LEO: the fetch offset of its last valid Fetch (-1: unknown).
    log_end_offset: int = UNKNOWN_OFFSET
    #: The broker epoch its last Fetch carried (-1: unknown).
    broker_epoch: int = NO_BROKER_EPOCH
    last_fetch_ms: int = -1
    #: The leader's LEO when that Fetch arrived.
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    #: When its fetch offset last reached the leader's LEO as of that fetch.
    last_caught_up_ms: int = -1
    #: Its log start offset as its last valid Fetch said (-1: unknown).
    log_start_offset: int = UNKNOWN_OFFSET

    def update_fetch_state(self, fetch_offset: int, broker_epoch: int, now_ms: int,
                           leader_log_end_offset: int) -> None:
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset >= 0:
            # It now holds everything the leader had at its previous fetch:
            # it was caught up as of then.
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_ms = now_ms
        self.log_end_offset = fetch_offset
        if broker_epoch != NO_BROKER_EPOCH:
            self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        return self.log_end_offset >= leader_log_end_offset or now_ms - self.last_caught_up_ms <= max_lag_ms


class LeaderState:
    """Replication state of this broker as leader of one partition at one leader epoch."""

    def __init__(
        self,
        *,
        topic_id: uuid.UUID,
        partition: int,
        broker_id: int,
        leader_epoch: int,
        partition_epoch: int,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        log_end_offset: int,
        high_watermark: int,
        min_insync_replicas: int,
        eligible: Mapping[int, int],
        config: ReplicationConfig,
        now_ms: int,
    ) -> None:
        assert broker_id in isr, f"leader {broker_id} outside its ISR {isr}"
        assert set(replicas).issuperset(isr), (isr, replicas)
        self.topic_id = topic_id
        self.partition = partition
        self.broker_id = broker_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.isr_state = IsrState(tuple(isr), partition_epoch)
        self.log_end_offset = log_end_offset
        #: The first offset of this leader epoch (KIP-101: the new leader
        #: starts its epoch at its LEO).
        self.epoch_start_offset = log_end_offset
        self.high_watermark = min(high_watermark, log_end_offset)
        self.min_insync_replicas = min_insync_replicas
        self.config = config
        self.eligible: Mapping[int, int] = dict(eligible)
        # A loop, not a comprehension: a new leader is built per partition
        # a failover moves, and the comprehension's own function call cost
        # 0.3 of this constructor's 3.2 us.
        self.followers: dict[int, ReplicaState] = {}
        for r in replicas:
            if r != broker_id:
                self.followers[r] = ReplicaState(last_caught_up_ms=now_ms if r in isr else -1)
        # No proposal before this time (after the controller refused one).
        self._next_proposal_ms = now_ms

    # --- views -----------------------------------------------------------

    @property
    def isr(self) -> tuple[int, ...]:
        """The committed ISR (as of the last answer or metadata update)."""
        return self.isr_state.isr

    @property
    def partition_epoch(self) -> int:
        return self.isr_state.partition_epoch

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        return self.isr_state.maximal_isr

    @property
    def guaranteed_isr(self) -> tuple[int, ...]:
        return self.isr_state.guaranteed_isr

    def low_watermark(self, log_start_offset: int) -> int:
        """The smallest log start offset of the ISR, the leader's
        (`log_start_offset`) included: what DeleteRecords answers, once it
        is past the deletion (-1 while an ISR follower's is unknown)."""
        low = log_start_offset
        followers = self.followers
        for r in self.isr_state.isr:
            if r != self.broker_id:
                follower = followers.get(r)
                start = UNKNOWN_OFFSET if follower is None else follower.log_start_offset
                if start < low:
                    low = start
        return low

    @property
    def under_min_isr(self) -> bool:
        return len(self.isr_state.guaranteed_isr) < self.min_insync_replicas

    # --- events ----------------------------------------------------------

    def on_append(self, log_end_offset: int, now_ms: int = -1) -> LeaderUpdate:
        """The leader's log grew to `log_end_offset` at `now_ms` (-1: unknown)."""
        assert log_end_offset >= self.log_end_offset, (log_end_offset, self.log_end_offset)
        if now_ms >= 0:
            # A follower at the old LEO was caught up until now. Its fetch
            # usually says so, but a follower in a fetch session does not
            # name a partition whose position did not change (KIP-227), so
            # an idle partition's last fetch may be long past.
            for follower in self.followers.values():
                if follower.log_end_offset >= self.log_end_offset:
                    follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        self.log_end_offset = log_end_offset
        return LeaderUpdate(high_watermark_moved=self._maybe_advance_high_watermark())

    def handle_replica_fetch(self, fetch: ReplicaFetch, log: LogView, now_ms: int) -> ReplicaFetchDecision:
        """Validate and account one partition of a follower's Fetch (epochs
        already checked by the caller)."""
        log_end = log.log_end_offset
        if log_end != self.log_end_offset:  # appended since we last looked: once per partition of every fetch
            self.on_append(log_end, now_ms)
        log_start = log.log_start_offset
        follower = self.followers.get(fetch.replica_id)
        if follower is None:
            return ReplicaFetchDecision(ErrorCode.not_leader_or_follower, self.high_watermark, log_start)
        if fetch.last_fetched_epoch > log.latest_epoch:
            # The follower holds records of an epoch newer than any we know:
            # a newer leader exists and our metadata is behind.
            return ReplicaFetchDecision(ErrorCode.unknown_leader_epoch, self.high_watermark, log_start)
        diverging = validate_fetch_position(log, fetch.fetch_offset, fetch.last_fetched_epoch)
        if diverging is not None:
            # KIP-595/KIP-320: answer where the follower's last epoch ends
            # here; its position is not valid, so it is not recorded.
            return ReplicaFetchDecision(ErrorCode.none, self.high_watermark, log_start, diverging_epoch=diverging)
        if fetch.fetch_offset < log_start or fetch.fetch_offset > self.log_end_offset:
            return ReplicaFetchDecision(ErrorCode.offset_out_of_range, self.high_watermark, log_start)
        follower.update_fetch_state(fetch.fetch_offset, fetch.broker_epoch, now_ms, self.log_end_offset)
        if fetch.log_start_offset >= 0:
            follower.log_start_offset = fetch.log_start_offset
        update = _HIGH_WATERMARK_MOVED if self._maybe_advance_high_watermark() else NO_UPDATE
        # A member of the ISR has nothing to join (`_maybe_expand_isr`'s
        # first check): the common case, without the call.
        if fetch.replica_id not in self.isr_state.isr:
            proposal = self._maybe_expand_isr(fetch.replica_id, now_ms)
            if proposal is not None:
                update = update | LeaderUpdate(alter_partition=proposal)
        return ReplicaFetchDecision(ErrorCode.none, self.high_watermark, log_start, None, fetch.fetch_offset,
                                    self.log_end_offset, update)

    def tick(self, now_ms: int) -> LeaderUpdate:
        """Time passed: resend an unanswered ISR change whose backoff ran
        out, or propose a shrink of followers that lag (Kafka runs this
        every replica.lag.time.max.ms / 2)."""
        pending = self.isr_state.pending
        if pending is not None:
            if pending.retry_at_ms not in (None, AWAIT_METADATA) and now_ms >= pending.retry_at_ms:
                self.isr_state = self.isr_state.with_retry_at(None)
                return LeaderUpdate(alter_partition=pending.proposal)
            return NO_UPDATE
        if now_ms < self._next_proposal_ms:
            return NO_UPDATE
        isr = self.isr_state.isr
        lagging = [r for r in isr if r != self.broker_id
                   and not self.followers[r].is_caught_up(self.log_end_offset, now_ms,
                                                          self.config.replica_lag_time_max_ms)]
        # Never below min.insync.replicas: keep the least-lagging of them.
        keep_lagging = max(0, self.min_insync_replicas - (len(isr) - len(lagging)))
        if keep_lagging:
            lagging.sort(key=lambda r: (-self.followers[r].log_end_offset, r))
            lagging = lagging[keep_lagging:]
        if not lagging:
            return NO_UPDATE
        new_isr = tuple(r for r in isr if r not in lagging)
        # Members that stay are sent without a broker epoch: the controller
        # then only checks that they are still eligible.
        proposal = self._propose(tuple(BrokerState(r) for r in new_isr), "shrink")
        return LeaderUpdate(isr_changed=True, alter_partition=proposal)

    def next_deadline_ms(self) -> int | None:
        """The earliest time `tick` may have something to do (None: nothing)."""
        pending = self.isr_state.pending
        if pending is not None:
            return None if pending.retry_at_ms in (None, AWAIT_METADATA) else pending.retry_at_ms
        lag = self.config.replica_lag_time_max_ms
        deadlines = [self.followers[r].last_caught_up_ms + lag + 1 for r in self.isr_state.isr
                     if r != self.broker_id and self.followers[r].log_end_offset < self.log_end_offset]
        if not deadlines:
            return None
        return max(min(deadlines), self._next_proposal_ms)

    def on_alter_partition_result(self, proposal: AlterPartitionProposal, result: AlterPartitionResult,
                                  now_ms: int) -> LeaderUpdate:
        """The controller's answer to `proposal` (or the failure to get one:
        REQUEST_TIMED_OUT / NETWORK_EXCEPTION / NOT_CONTROLLER)."""
        pending = self.isr_state.pending
        if result.error == ErrorCode.none and result.leader_epoch == self.leader_epoch \
                and result.partition_epoch > self.isr_state.partition_epoch:
            # Newer than what we know: adopt it, whatever proposal it answers.
            return self._commit(result.isr, result.partition_epoch)
        if pending is None or pending.proposal != proposal:
            return NO_UPDATE  # answered already (metadata was faster), or a leftover
        before = self.isr_state.guaranteed_isr
        if result.error == ErrorCode.none or result.error in _STALE:
            # A success that is not newer than our state, or a sign our state
            # is stale: the metadata log will tell what happened.
            self.isr_state = self.isr_state.with_retry_at(AWAIT_METADATA)
            return NO_UPDATE
        if result.error in _REFUSED:
            # Not applied. Propose again (if still needed) after a backoff:
            # the metadata may change eligibility meanwhile.
            self.isr_state = self.isr_state.revert()
            self._next_proposal_ms = now_ms + self.config.alter_partition_retry_backoff_ms
            update = LeaderUpdate(isr_changed=self.isr_state.guaranteed_isr != before)
            return update | LeaderUpdate(high_watermark_moved=self._maybe_advance_high_watermark())
        # Retriable (no controller, no answer): the same proposal again, later.
        self.isr_state = self.isr_state.with_retry_at(now_ms + self.config.alter_partition_retry_backoff_ms)
        return NO_UPDATE

    def apply_registration(self, replicas: tuple[int, ...], isr: tuple[int, ...], partition_epoch: int,
                           now_ms: int) -> LeaderUpdate:
        """A metadata update for our leader epoch (an ISR change the
        controller made or confirmed, or new replicas)."""
        if partition_epoch <= self.isr_state.partition_epoch:
            return NO_UPDATE
        for r in replicas:
            if r != self.broker_id and r not in self.followers:
                self.followers[r] = ReplicaState()
        for r in [r for r in self.followers if r not in replicas]:
            del self.followers[r]
        self.replicas = tuple(replicas)
        # A follower the controller itself put in the ISR (an election, a
        # reassignment) gets replica.lag.time.max.ms from now to fetch, as a
        # new leader gives its ISR, instead of being shrunk at the next check.
        for r in isr:
            if r != self.broker_id and r not in self.isr_state.maximal_isr:
                follower = self.followers[r]
                follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        return self._commit(isr, partition_epoch)

    def update_eligibility(self, eligible: Mapping[int, int]) -> None:
        """Brokers that may join an ISR now (registered, unfenced, not
        shutting down), each with its current broker epoch (KIP-841)."""
        self.eligible = dict(eligible)

    def set_min_insync_replicas(self, min_insync_replicas: int) -> LeaderUpdate:
        self.min_insync_replicas = min_insync_replicas
        return LeaderUpdate(isr_changed=True, high_watermark_moved=self._maybe_advance_high_watermark())

    # --- acks=all ----------------------------------------------------------

    def append_error(self, acks: int) -> ErrorCode:
        """Checked before appending (Kafka's `appendRecordsToLeader`)."""
        if acks == -1 and self.under_min_isr:
            return ErrorCode.not_enough_replicas
        return ErrorCode.none

    def acks_all_status(self, required_offset: int) -> ErrorCode | None:
        """The answer to an acks=all produce whose batch ends before
        `required_offset` (its last offset + 1): None while it must wait."""
        if self.high_watermark >= required_offset:
            return ErrorCode.none
        if self.under_min_isr:
            return ErrorCode.not_enough_replicas_after_append
        return None

    # --- internals -----------------------------------------------------------

    def _commit(self, isr: tuple[int, ...], partition_epoch: int) -> LeaderUpdate:
        assert self.broker_id in isr, f"leader {self.broker_id} outside its ISR {isr}"
        before = self.isr_state.guaranteed_isr
        self.isr_state = self.isr_state.commit(tuple(isr), partition_epoch)
        return LeaderUpdate(isr_changed=self.isr_state.guaranteed_isr != before,
                            high_watermark_moved=self._maybe_advance_high_watermark())

    def _maybe_advance_high_watermark(self) -> bool:
        isr_state = self.isr_state
        if isr_state.pending is None:
            # No change in flight: the guaranteed and maximal ISRs are both
            # the committed one (`IsrState`), read once instead of through
            # two properties. Called on every partition of a follower's fetch.
            members = isr_state.isr
            if len(members) < self.min_insync_replicas:
                return False
        elif self.under_min_isr:
            return False
        else:
            members = isr_state.maximal_isr
        candidate = self.log_end_offset
        followers = self.followers
        for r in members:
            if r != self.broker_id:
                end = followers[r].log_end_offset
                if end < candidate:
                    candidate = end
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def _maybe_expand_isr(self, replica_id: int, now_ms: int) -> AlterPartitionProposal | None:
        if self.isr_state.in_flight or replica_id in self.isr_state.isr or now_ms < self._next_proposal_ms:
            return None
        follower = self.followers[replica_id]
        if follower.log_end_offset < max(self.high_watermark, self.epoch_start_offset):
            return None
        image_epoch = self.eligible.get(replica_id)
        if image_epoch is None:
            return None  # fenced, shutting down or unknown (KIP-841)
        if follower.broker_epoch not in (NO_BROKER_EPOCH, image_epoch):
            # KIP-903: the fetches came from another incarnation than the
            # one the image knows (a restart we have not seen, or a zombie).
            return None
        members = tuple(BrokerState(r) for r in self.isr_state.isr) + (BrokerState(replica_id, image_epoch),)
        return self._propose(members, "expand")

    def _propose(self, new_isr: tuple[BrokerState, ...], kind: str) -> AlterPartitionProposal:
        proposal = AlterPartitionProposal(self.topic_id, self.partition, self.leader_epoch,
                                          self.isr_state.partition_epoch, new_isr, kind)
        self.isr_state = self.isr_state.propose(proposal)
        return proposal
