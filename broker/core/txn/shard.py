"""The transaction coordinator of one `__transaction_state` partition (pure core).

Theory of operation
-------------------
A `TransactionCoordinatorShard` holds every transactional id that hashes
to its partition (`partition_for_transactional_id`), like the part of
Kafka's `TransactionStateManager` for one partition plus the decisions of
its `TransactionCoordinator`. It does no I/O and reads no clock: the shell
gives it calls and the time, and every call returns one `Step`:

- `records`: append these to the partition, in order, as one batch, as
  leader with acks=all rules;
- `response`: the answer to the call, and `markers`: WriteTxnMarkers jobs.
  Both are held by the shell until the partition's high watermark covers
  the records of this step and of every step before it. So nothing acts on
  a transition before it is in the log: the client learns of a
  PrepareCommit, and a partition gets a COMMIT marker, only once the
  PrepareCommit record is committed. A coordinator that fails over
  in between rebuilds from the log and sends the markers itself.

The state in memory moves at once, when the step is taken (as the group
coordinator does); answers of later steps wait behind the same high
watermark, so no one sees a state that is not yet committed. If an append
fails, the shell drops the shard and loads it again from the log.

Life of a shard:

    (new)   => loading: this broker became leader of the partition; the
                        shell calls `replay(key, value)` for each record
    loading => active:  `on_loaded(now_ms)`; its step carries the markers
                        of every PrepareCommit/PrepareAbort found (a
                        previous coordinator logged them but may not have
                        written every marker)
    active  => (gone):  leadership moved or an append failed; the shell
                        drops the shard and its marker jobs

While loading, calls are answered COORDINATOR_LOAD_IN_PROGRESS.

Markers carry the coordinator epoch, the partition's leader epoch when the
shard was loaded: a partition refuses markers of an older coordinator.
When every partition of a job answered, `markers_written(job)` logs
CompleteCommit/CompleteAbort. The state machine is `state.TxnState`'s
docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from broker.core.txn.config import TransactionCoordinatorConfig
from broker.core.txn.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from broker.core.txn.state import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionMetadata,
    TxnState,
)


@dataclass(frozen=True, slots=True)
class MarkerJob:
    """Write a COMMIT (`commit`) or ABORT marker for one transaction on
    each of `partitions`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: frozenset[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class TxnRecord:
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Step:
    records: tuple[TxnRecord, ...] = ()
    response: Any = None
    markers: tuple[MarkerJob, ...] = ()


@dataclass(frozen=True, slots=True)
class InitProducerIdAnswer:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class AddPartitionsAnswer:
    """One error for the whole call (`error`), or one per partition."""

    error: ErrorCode
    partitions: dict[tuple[str, int], ErrorCode] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EndTxnAnswer:
    """EndTxn v5+ (transactions v2): the error, and the producer id and
    epoch the client goes on with (the bumped ones)."""

    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    transactional_id: str
    error: ErrorCode
    state: str = ""
    transaction_timeout_ms: int = 0
    start_timestamp_ms: int = -1
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    state: str


class TransactionCoordinatorShard:
    """The transactional ids of one `__transaction_state` partition."""

    def __init__(self, partition: int, coordinator_epoch: int, config: TransactionCoordinatorConfig) -> None:
        self.partition = partition
        self.coordinator_epoch = coordinator_epoch
        self.config = config
        self.txns: dict[str, TransactionMetadata] = {}
        self.loaded = False
        self._next_abort_check_ms: int | None = None
        self._next_expiry_check_ms: int | None = None

    # --- loading -------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one stored record (in log order) while loading."""
        assert not self.loaded, "replay is for loading"
        transactional_id = decode_key(key)
        decoded = decode_value(value)
        if decoded is None:
            self.txns.pop(transactional_id, None)
            return
        txn = TransactionMetadata(
            transactional_id, decoded.producer_id, decoded.producer_epoch, decoded.transaction_timeout_ms,
            decoded.state, {(t, p) for t, ps in decoded.partitions for p in ps},
            decoded.start_timestamp_ms, decoded.last_update_timestamp_ms, decoded.previous_producer_id,
            next_producer_id=decoded.next_producer_id,
            client_transaction_version=decoded.client_transaction_version)
        previous = self.txns.get(transactional_id)
        if previous is not None and previous.producer_id != txn.producer_id and txn.previous_producer_id < 0:
            # Value v0 has no previous producer id: the record before says it.
            txn.previous_producer_id = previous.producer_id
        self.txns[transactional_id] = txn

    def on_loaded(self, now_ms: int) -> Step:
        """Loading is over: resend the markers of every transaction a
        previous coordinator left preparing."""
        assert not self.loaded, "on_loaded is called once"
        self.loaded = True
        self._next_abort_check_ms = now_ms + self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        self._next_expiry_check_ms = now_ms + self.config.transaction_remove_expired_transaction_cleanup_interval_ms
        jobs = tuple(self._marker_job(txn) for _, txn in sorted(self.txns.items()) if txn.state.is_preparing)
        return Step(markers=jobs)

    def unload(self) -> None:
        self.txns = {}
        self.loaded = False
        self._next_abort_check_ms = self._next_expiry_check_ms = None

    # --- InitProducerId ------------------------------------------------------

    def needs_producer_id(self, transactional_id: str, producer_id: int, producer_epoch: int) -> bool:
        """Whether `init_producer_id` for these arguments will need a new
        producer id (the shell allocates one from the controller first)."""
        txn = self.txns.get(transactional_id)
        if txn is None:
            return True
        return txn.state.is_complete and txn.epoch_exhausted and (
            producer_id == NO_PRODUCER_ID or producer_epoch == txn.producer_epoch)

    def init_producer_id(self, transactional_id: str, transaction_timeout_ms: int, producer_id: int,
                         producer_epoch: int, now_ms: int, new_producer_id: int | None = None) -> Step:
        """InitProducerId with a transactional id (KIP-98; KIP-360 when the
        request names the producer id and epoch it had)."""
        def answer(error: ErrorCode, txn: TransactionMetadata | None = None, **kw: Any) -> Step:
            if txn is None:
                return Step(response=InitProducerIdAnswer(error), **kw)
            return Step(response=InitProducerIdAnswer(error, txn.producer_id, txn.producer_epoch), **kw)

        if not self.loaded:
            return answer(ErrorCode.coordinator_load_in_progress)
        if not transactional_id:
            return answer(ErrorCode.invalid_request)
        if not 0 < transaction_timeout_ms <= self.config.transaction_max_timeout_ms:
            return answer(ErrorCode.invalid_transaction_timeout)
        expected = producer_id != NO_PRODUCER_ID
        txn = self.txns.get(transactional_id)
        if txn is None:
            if new_producer_id is None:
                return answer(ErrorCode.concurrent_transactions)
            txn = TransactionMetadata(transactional_id, new_producer_id, NO_PRODUCER_EPOCH, transaction_timeout_ms,
                                      last_update_timestamp_ms=now_ms)
            new_producer_id = None
            self.txns[transactional_id] = txn
        elif expected and not (
                txn.producer_epoch == NO_PRODUCER_EPOCH or producer_id == txn.producer_id
                or (producer_id == txn.previous_producer_id and producer_epoch >= MAX_PRODUCER_EPOCH)):
            return answer(ErrorCode.producer_fenced)

        if txn.state.is_preparing:
            # The previous transaction's markers are being written: retry.
            return answer(ErrorCode.concurrent_transactions)
        if txn.state is TxnState.ONGOING:
            # A new instance of the producer: fence the old one (its epoch
            # is now stale) and abort what it left open. This epoch is not
            # handed out: the client retries and gets a second bump once the
            # abort is complete (as Kafka does).
            if txn.producer_epoch < 32767:
                txn.producer_epoch += 1
            txn.last_producer_epoch = NO_PRODUCER_EPOCH
            txn.transition(TxnState.PREPARE_EPOCH_FENCE)
            txn.transition(TxnState.PREPARE_ABORT)
            txn.last_update_timestamp_ms = now_ms
            return answer(ErrorCode.concurrent_transactions, records=(self._record(txn),),
                          markers=(self._marker_job(txn),))
        assert txn.state.is_complete, txn.state
        if txn.epoch_exhausted and (not expected or producer_epoch == txn.producer_epoch):
            if new_producer_id is None:
                return answer(ErrorCode.concurrent_transactions)
            txn.previous_producer_id = txn.producer_id
            txn.producer_id = new_producer_id
            # A retry of this request (same old id and exhausted epoch) is
            # recognised by the epoch it named.
            txn.last_producer_epoch = producer_epoch if expected else NO_PRODUCER_EPOCH
            txn.producer_epoch = 0
        elif not expected or txn.producer_epoch == NO_PRODUCER_EPOCH or producer_epoch == txn.producer_epoch:
            txn.last_producer_epoch = txn.producer_epoch
            txn.producer_epoch = 0 if txn.producer_epoch == NO_PRODUCER_EPOCH else txn.producer_epoch + 1
        elif producer_id in (txn.producer_id, txn.previous_producer_id) and producer_epoch == txn.last_producer_epoch:
            # A retry of the InitProducerId that already bumped: same answer.
            return answer(ErrorCode.none, txn)
        else:
            return answer(ErrorCode.producer_fenced)
        txn.transition(TxnState.EMPTY)
        txn.partitions = set()
        txn.transaction_timeout_ms = transaction_timeout_ms
        txn.start_timestamp_ms = -1
        txn.last_update_timestamp_ms = now_ms
        return answer(ErrorCode.none, txn, records=(self._record(txn),))

    # --- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------

    def _check_owner(self, transactional_id: str, producer_id: int, producer_epoch: int
                     ) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not self.loaded:
            return ErrorCode.coordinator_load_in_progress, None
        if not transactional_id:
            return ErrorCode.invalid_request, None
        txn = self.txns.get(transactional_id)
        if txn is not None and txn.state.is_preparing and txn.next_producer_id == producer_id != NO_PRODUCER_ID:
            # Transactions v2 moved the producer to a new id at the end of
            # its last transaction, whose markers are still being written.
            return ErrorCode.concurrent_transactions, None
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if txn.producer_epoch != producer_epoch:
            return ErrorCode.producer_fenced, None
        if txn.state.is_preparing:
            return ErrorCode.concurrent_transactions, None
        return ErrorCode.none, txn

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: frozenset[tuple[str, int]], now_ms: int, transaction_version: int = 0) -> Step:
        """Add partitions to the producer's transaction (opening it).
        `transaction_version` 2: a partition leader adds them for a client
        of transactions v2 (Produce v12, TxnOffsetCommit v5)."""
        error, txn = self._check_owner(transactional_id, producer_id, producer_epoch)
        if txn is None:
            return Step(response=AddPartitionsAnswer(error, {tp: error for tp in partitions}))
        ok = AddPartitionsAnswer(ErrorCode.none, {tp: ErrorCode.none for tp in partitions})
        if txn.state is TxnState.ONGOING and partitions <= txn.partitions:
            return Step(response=ok)
        if txn.state is not TxnState.ONGOING:
            txn.partitions = set()
            txn.start_timestamp_ms = now_ms
            txn.client_transaction_version = transaction_version
        txn.transition(TxnState.ONGOING)
        txn.partitions |= partitions
        txn.last_update_timestamp_ms = now_ms
        return Step(records=(self._record(txn),), response=ok)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: frozenset[tuple[str, int]]) -> Step:
        """AddPartitionsToTxn v4+ with verify_only (KIP-890): whether each
        partition is in the producer's open transaction; nothing changes."""
        error, txn = self._check_owner(transactional_id, producer_id, producer_epoch)
        if txn is None:
            return Step(response=AddPartitionsAnswer(error, {tp: error for tp in partitions}))
        return Step(response=AddPartitionsAnswer(ErrorCode.none, {
            tp: ErrorCode.none if tp in txn.partitions else ErrorCode.transaction_abortable for tp in partitions}))

    # --- EndTxn --------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int) -> Step:
        """EndTxn: log PrepareCommit/PrepareAbort; the answer and the markers
        go out once it is committed; CompleteCommit/CompleteAbort follows the
        markers (`markers_written`). A retry finds the transaction preparing
        (CONCURRENT_TRANSACTIONS) or complete (NONE)."""
        if not self.loaded:
            return Step(response=ErrorCode.coordinator_load_in_progress)
        if not transactional_id:
            return Step(response=ErrorCode.invalid_request)
        txn = self.txns.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return Step(response=ErrorCode.invalid_producer_id_mapping)
        if txn.producer_epoch != producer_epoch:
            return Step(response=ErrorCode.producer_fenced)
        state = txn.state
        if state is TxnState.ONGOING:
            txn.transition(TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
            txn.last_update_timestamp_ms = now_ms
            return Step(records=(self._record(txn),), response=ErrorCode.none, markers=(self._marker_job(txn),))
        if state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT):
            return Step(response=ErrorCode.none)
        if state is (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
            return Step(response=ErrorCode.concurrent_transactions)
        return Step(response=ErrorCode.invalid_txn_state)

    def end_txn_needs_producer_id(self, transactional_id: str, producer_id: int, producer_epoch: int) -> bool:
        """Whether `end_txn_v2` for these arguments will bump an exhausted
        epoch, so the producer moves to a new producer id (the shell
        allocates one from the controller first)."""
        txn = self.txns.get(transactional_id)
        return (txn is not None and txn.producer_id == producer_id and txn.producer_epoch == producer_epoch
                and not txn.state.is_preparing and txn.epoch_exhausted)

    def end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                   now_ms: int, new_producer_id: int | None = None) -> Step:
        """EndTxn v5+ (transactions v2, KIP-890 part 2): as `end_txn`, but
        the Prepare record bumps the producer epoch, the markers carry the
        bumped epoch, and the answer (an `EndTxnAnswer`) gives the client
        the producer id and epoch of its next transaction.

        A retry is told apart from the next EndTxn by its epoch: the
        retried request names the epoch before the bump (or, after an
        overflow, the previous producer id at the last epoch); a request at
        the current epoch is the next transaction's."""
        def fail(error: ErrorCode) -> Step:
            return Step(response=EndTxnAnswer(error))

        if not self.loaded:
            return fail(ErrorCode.coordinator_load_in_progress)
        if not transactional_id:
            return fail(ErrorCode.invalid_request)
        txn = self.txns.get(transactional_id)
        if txn is None:
            return fail(ErrorCode.invalid_producer_id_mapping)
        state = txn.state
        v2 = txn.supports_epoch_bump
        retry_on_overflow = v2 and txn.previous_producer_id == producer_id and \
            producer_epoch == MAX_PRODUCER_EPOCH and txn.producer_epoch == 0
        retry_on_bump = v2 and txn.producer_id == producer_id and txn.producer_epoch == producer_epoch + 1
        retry = retry_on_bump or retry_on_overflow
        if state.is_preparing:
            valid_epoch = retry_on_bump
        elif state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            valid_epoch = retry or producer_epoch == txn.producer_epoch
        else:
            valid_epoch = producer_epoch == txn.producer_epoch
        if txn.producer_id != producer_id and not retry_on_overflow:
            return fail(ErrorCode.invalid_producer_id_mapping)
        if not valid_epoch:
            return fail(ErrorCode.producer_fenced)
        if state.is_preparing:
            if state is (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT):
                return fail(ErrorCode.concurrent_transactions)
            return fail(ErrorCode.invalid_txn_state)
        if state is TxnState.ONGOING:
            pass
        elif state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT) and retry:
            return Step(response=EndTxnAnswer(ErrorCode.none, txn.producer_id, txn.producer_epoch))
        elif commit or retry:
            # Nothing open to commit, or a retried commit finding an abort
            # (or the reverse): the client's state is wrong.
            return fail(ErrorCode.invalid_txn_state)
        if txn.epoch_exhausted:
            if new_producer_id is None:
                return fail(ErrorCode.concurrent_transactions)
            txn.next_producer_id = new_producer_id
        txn.client_transaction_version = 2
        txn.last_producer_epoch = txn.producer_epoch
        if txn.producer_epoch < 32767:
            txn.producer_epoch += 1
        txn.last_update_timestamp_ms = now_ms
        if state is not TxnState.ONGOING:
            # An abort with nothing open (v2 allows it): nothing to mark,
            # so it completes at once; the epoch bump still fences.
            txn.partitions = set()
            txn.start_timestamp_ms = now_ms
            txn.transition(TxnState.PREPARE_ABORT)
            prepare = self._record(txn)
            self._complete(txn, now_ms)
            return Step(records=(prepare, self._record(txn)), response=self._end_answer(txn))
        txn.transition(TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
        answer = self._end_answer(txn)
        return Step(records=(self._record(txn),), response=answer, markers=(self._marker_job(txn),))

    @staticmethod
    def _end_answer(txn: TransactionMetadata) -> EndTxnAnswer:
        if txn.state.is_preparing and txn.next_producer_id != NO_PRODUCER_ID:
            # The epoch overflowed: the next transaction is the new id's.
            return EndTxnAnswer(ErrorCode.none, txn.next_producer_id, 0)
        return EndTxnAnswer(ErrorCode.none, txn.producer_id, txn.producer_epoch)

    def _complete(self, txn: TransactionMetadata, now_ms: int) -> None:
        txn.transition(TxnState.COMPLETE_COMMIT if txn.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT)
        txn.partitions = set()
        txn.last_update_timestamp_ms = now_ms
        if txn.next_producer_id != NO_PRODUCER_ID:
            # Transactions v2 overflow: the producer goes on with a new id.
            txn.previous_producer_id = txn.producer_id
            txn.producer_id = txn.next_producer_id
            txn.producer_epoch = 0
            txn.last_producer_epoch = MAX_PRODUCER_EPOCH
            txn.next_producer_id = NO_PRODUCER_ID

    def markers_written(self, job: MarkerJob, now_ms: int) -> Step:
        """Every partition of `job` has its marker: complete the transaction
        (if it is still the one the job was for)."""
        if not self.loaded or job.coordinator_epoch != self.coordinator_epoch:
            return Step()
        txn = self.txns.get(job.transactional_id)
        want = TxnState.PREPARE_COMMIT if job.commit else TxnState.PREPARE_ABORT
        if txn is None or txn.state is not want or txn.producer_id != job.producer_id \
                or txn.producer_epoch != job.producer_epoch:
            return Step()
        self._complete(txn, now_ms)
        return Step(records=(self._record(txn),))

    # --- timers --------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        if not self.loaded:
            return None
        return min(self._next_abort_check_ms, self._next_expiry_check_ms)

    def tick(self, now_ms: int) -> Step:
        """Abort transactions open longer than their `transaction.timeout.ms`
        (fencing their producer: the epoch is bumped), and forget
        transactional ids idle for `transactional.id.expiration.ms`."""
        if not self.loaded:
            return Step()
        records: list[TxnRecord] = []
        markers: list[MarkerJob] = []
        if now_ms >= self._next_abort_check_ms:
            self._next_abort_check_ms = now_ms + \
                self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
            for _, txn in sorted(self.txns.items()):
                if txn.state is TxnState.ONGOING and txn.start_timestamp_ms + txn.transaction_timeout_ms < now_ms:
                    records.append(self._fence_and_abort(txn, now_ms))
                    markers.append(self._marker_job(txn))
        if now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + \
                self.config.transaction_remove_expired_transaction_cleanup_interval_ms
            for tid, txn in sorted(self.txns.items()):
                if txn.state.is_complete and \
                        txn.last_update_timestamp_ms + self.config.transactional_id_expiration_ms <= now_ms:
                    txn.transition(TxnState.DEAD)
                    del self.txns[tid]
                    records.append(TxnRecord(encode_key(tid), None))
        return Step(records=tuple(records), markers=tuple(markers))

    def abort_open(self, transactional_id: str, now_ms: int) -> Step:
        """Fence the producer of an open transaction and abort it (what a
        timeout does), now; CONCURRENT_TRANSACTIONS if it is completing,
        INVALID_TXN_STATE if none is open."""
        txn = self.txns.get(transactional_id) if self.loaded else None
        if txn is None:
            return Step(response=ErrorCode.transactional_id_not_found)
        if txn.state.is_preparing:
            return Step(response=ErrorCode.concurrent_transactions)
        if txn.state is not TxnState.ONGOING:
            return Step(response=ErrorCode.invalid_txn_state)
        record = self._fence_and_abort(txn, now_ms)
        return Step(records=(record,), response=ErrorCode.none, markers=(self._marker_job(txn),))

    def _fence_and_abort(self, txn: TransactionMetadata, now_ms: int) -> TxnRecord:
        if txn.producer_epoch < 32767:
            txn.producer_epoch += 1
        txn.last_producer_epoch = NO_PRODUCER_EPOCH
        txn.transition(TxnState.PREPARE_EPOCH_FENCE)
        txn.transition(TxnState.PREPARE_ABORT)
        txn.last_update_timestamp_ms = now_ms
        return self._record(txn)

    # --- administration ------------------------------------------------------

    def describe(self, transactional_id: str) -> DescribedTransaction:
        if not self.loaded:
            return DescribedTransaction(transactional_id, ErrorCode.coordinator_load_in_progress)
        txn = self.txns.get(transactional_id)
        if txn is None:
            return DescribedTransaction(transactional_id, ErrorCode.transactional_id_not_found)
        return DescribedTransaction(transactional_id, ErrorCode.none, txn.state.display,
                                    txn.transaction_timeout_ms, txn.start_timestamp_ms, txn.producer_id,
                                    txn.producer_epoch, txn.sorted_partitions())

    def list_transactions(self, states: frozenset[TxnState] = frozenset(), producer_ids: frozenset[int] = frozenset(),
                          min_duration_ms: int = -1, now_ms: int = 0) -> list[ListedTransaction]:
        out = []
        for tid, txn in sorted(self.txns.items()):
            if states and txn.state not in states:
                continue
            if producer_ids and txn.producer_id not in producer_ids:
                continue
            # KIP-664's duration filter: running longer than this (Kafka
            # compares the start time whatever the state).
            if min_duration_ms >= 0 and now_ms - txn.start_timestamp_ms <= min_duration_ms:
                continue
            out.append(ListedTransaction(tid, txn.producer_id, txn.state.display))
        return out

    # --- helpers -------------------------------------------------------------

    def _record(self, txn: TransactionMetadata) -> TxnRecord:
        value = TransactionLogValue(
            txn.producer_id, txn.producer_epoch, txn.transaction_timeout_ms, txn.state,
            () if txn.state is TxnState.EMPTY else txn.sorted_partitions(),
            txn.last_update_timestamp_ms, txn.start_timestamp_ms, txn.previous_producer_id,
            txn.next_producer_id, txn.client_transaction_version)
        return TxnRecord(encode_key(txn.transactional_id), encode_value(value))

    def _marker_job(self, txn: TransactionMetadata) -> MarkerJob:
        assert txn.state.is_preparing, txn.state
        return MarkerJob(txn.transactional_id, txn.producer_id, txn.producer_epoch,
                         txn.state is TxnState.PREPARE_COMMIT, self.coordinator_epoch, frozenset(txn.partitions))
