"""Idempotent producer state of one partition (KIP-98): sequence checks.

Theory of operation
-------------------
An idempotent producer numbers the batches it sends to each partition:
`base_sequence` of the first record, consecutive across batches, per
producer id (pid) and producer epoch. The partition leader remembers, per
pid, the epoch and the metadata of the producer's last
`MAX_BATCHES_PER_PRODUCER` (5) batches: first and last sequence, first and
last offset, max timestamp. Five, because a producer keeps at most five
requests in flight per connection (`max.in.flight.requests.per.connection
<= 5` with idempotence, KAFKA-5494), so a retry is always one of the last
five batches.

`check(header, base_offset)` decides a client batch before it is written;
`update(header, base_offset)` records a batch once it is in the log. The
leader calls both (`check_and_update` when nothing can fail in between);
a follower, and a rebuild from the log, call `update` only: what the
leader wrote is history, not a request (Kafka's `AppendOrigin.REPLICATION`).

The answers of `check`, in Kafka 3.x's order (ProducerAppendInfo):

| situation                                   | answer                      |
| ------------------------------------------- | --------------------------- |
| same epoch, (first_seq, last_seq) equal to  | DUPLICATE_SEQUENCE_NUMBER   |
| one of the 5 remembered batches             | with that batch's offsets   |
| epoch older than the remembered one         | INVALID_PRODUCER_EPOCH (47) |
| newer epoch, first_seq != 0                 | OUT_OF_ORDER_SEQUENCE (45)  |
| same epoch, first_seq != last_seq + 1       | OUT_OF_ORDER_SEQUENCE (45)  |
| unknown pid, any first_seq                  | OK                          |
| otherwise                                   | OK                          |

- A duplicate is not an error on the wire: the broker answers NONE with
  the original batch's base offset, as Kafka >= 1.0 does; the client
  then completes the retried send with the offset it first got.
- A stale epoch is INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED: since
  Kafka 2.7 (KIP-588) the produce path returns that, so the client can
  abort and retry; PRODUCER_FENCED comes from the transaction coordinator.
- An epoch bump starts the sequence again at 0 (KIP-360 bumps the epoch
  exactly to reset sequences).
- Unknown pid: since Kafka 2.5 (KIP-360) the broker accepts any first
  sequence from a producer it has no state for, because that state may
  have been lost legitimately (retention deleted the producer's batches,
  or `producer.id.expiration.ms` passed). Older brokers answered
  UNKNOWN_PRODUCER_ID for a first sequence other than 0, which forced the
  client to reset its sequences and reorder in-flight batches; we do as
  Kafka 3.x does and never answer UNKNOWN_PRODUCER_ID.
- Sequences are int32 and wrap: after 2**31 - 1 comes 0. A batch's last
  sequence is `base_sequence + last_offset_delta` modulo that wrap. It is
  computed from the offset delta, not the record count, so it survives
  compaction, which keeps a batch's offsets but drops records.

State is removed only by `remove_expired_producers(now_ms)` (no batch
for `producer.id.expiration.ms`, default one day, measured like Kafka on
the batches' max timestamps) and by truncation (see
`storage.producer_snapshot`, which also persists this state). Not by
retention: KIP-360 keeps a producer's state after its batches are gone.

Transactions (KIP-98)
--------------------
A transactional batch (attribute bit 4) of a producer with no open
transaction opens one at the batch's first offset
(`current_txn_first_offset`); a transaction marker (a control batch,
COMMIT or ABORT, written by the coordinator through WriteTxnMarkers)
closes it and comes back from `update` as a `CompletedTxn`. The partition's
last stable offset (LSO) is

    min(HW, the first offset of the earliest transaction that is open,
            or whose marker is not below the HW yet)

(`last_stable_offset(hw)`): a read_committed consumer reads nothing of a
transaction until its marker is replicated, as Kafka keeps a completed
transaction "unreplicated" until the HW passes its marker. `ongoing`
holds the open transactions by producer id, in the order they opened
(which is the order of their first offsets: offsets only grow), so the
earliest is the first; `unreplicated` the completed ones still above the
HW, in marker order.

More answers of `check`, for transactions:

| situation                                      | answer                   |
| ---------------------------------------------- | ------------------------ |
| a non-transactional batch while the producer   | INVALID_TXN_STATE (48)   |
| has a transaction open                         |                          |
| a transactional batch opening a transaction    | INVALID_TXN_STATE (48)   |
| that the coordinator has not verified, when    |                          |
| `require_verification` is set (KIP-890)        |                          |

and of `check_marker` (a marker the leader is asked to write):

| situation                                      | answer                   |
| ---------------------------------------------- | ------------------------ |
| marker's producer epoch older than the entry's | INVALID_PRODUCER_EPOCH   |
| coordinator epoch older than the last marker's | TRANSACTION_COORDINATOR_ |
|                                                | FENCED (52)              |

KIP-890's partition-side verification: the coordinator may tell a
partition that a producer id and epoch are in an ongoing transaction
(`mark_verified`); with `require_verification` on, only such a producer may
open a transaction here, so a late write of an aborted transaction cannot
open a new one. A producer once verified here needs it for every later
transaction too (until the broker restarts), whatever
`require_verification` says: a marker ends the verification, so a write
that arrives after the marker of the transaction it was verified for is
refused. The broker's produce path asks the coordinator when
`needs_verification` says so (`broker.shell.txn_verification`), and
`ReplicaManager.mark_txn_verified` is its door in.

Pure: headers in, answers out; no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from storage.batch import CONTROL_MASK, TRANSACTIONAL_MASK, BatchHeader, ControlRecordType
from storage.errors import StorageError

MAX_BATCHES_PER_PRODUCER = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
INT32_MAX = (1 << 31) - 1
NO_SEQUENCE = -1
NO_PRODUCER_EPOCH = -1
ABORT = ControlRecordType.ABORT
COMMIT = ControlRecordType.COMMIT


class ProduceCheck(enum.IntEnum):
    """The answer of `check`, valued as Kafka's error code."""

    OK = 0
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    TRANSACTION_COORDINATOR_FENCED = 52


class CheckResult(NamedTuple):
    """`check`'s answer. For a duplicate, the original batch's offsets."""

    error: ProduceCheck
    message: str = ""
    first_offset: int = -1
    last_offset: int = -1


_OK = CheckResult(ProduceCheck.OK)


class ProducerStateError(StorageError):
    """A produce or marker refused by the producer checks; `error_code` is
    the Kafka error code the broker answers with (45, 47, 48 or 52)."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.error_code = int(result.error)
        self.result = result


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record, with Kafka's int32 wrap."""
    if base_sequence > INT32_MAX - last_offset_delta:
        return last_offset_delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerStateEntry:
    """What the partition remembers of one producer id."""

    producer_id: int
    producer_epoch: int
    batches: list[BatchMetadata] = field(default_factory=list)
    last_timestamp: int = -1
    #: The coordinator epoch of the last marker written for this producer.
    coordinator_epoch: int = -1
    #: The first offset of the producer's open transaction, -1 if none.
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(self.producer_id, self.producer_epoch, list(self.batches), self.last_timestamp,
                                  self.coordinator_epoch, self.current_txn_first_offset)


class CompletedTxn(NamedTuple):
    """A transaction a marker ended: its producer, its first offset, the
    marker's offset (its last), and whether it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class ProducerState:
    """Per-partition producer id -> `ProducerStateEntry`."""

    def __init__(self, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.producers: dict[int, ProducerStateEntry] = {}
        self.producer_id_expiration_ms = producer_id_expiration_ms
        #: Open transactions: producer id -> first offset, earliest first.
        self.ongoing: dict[int, int] = {}
        #: Completed transactions whose marker the HW has not passed yet.
        self.unreplicated: deque[CompletedTxn] = deque()
        #: `ongoing or unreplicated`, kept as one attribute: every consumer
        #: fetch reads it for the LSO, and most partitions have neither.
        self.unstable = False
        #: KIP-890 hook (module doc): producer id -> epoch the coordinator
        #: says is in an ongoing transaction.
        self.verified: dict[int, int] = {}
        self.require_verification = False
        #: Producers verified here once: each of their transactions must be.
        self.verification_required: set[int] = set()

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    def check(self, header: BatchHeader, base_offset: int | None = None, check_sequence: bool = True) -> CheckResult:
        """Decide a client batch (see the module's tables); changes nothing.
        `base_offset` is the offset the log will give it (messages only).
        `check_sequence=False`: a coordinator's batch (no sequence of its
        own): only the epoch and transaction rules apply."""
        pid, epoch, first_seq = header[9], header[10], header[11]
        if pid < 0:
            return _OK
        entry = self.producers.get(pid)
        transactional = header[5] & TRANSACTIONAL_MASK
        if entry is None:
            if transactional:
                return self._check_opens_txn(pid, epoch)
            return _OK  # KIP-360: accept any sequence from an unknown producer
        offset = header[0] if base_offset is None else base_offset
        current = entry.producer_epoch
        if epoch < current:
            return CheckResult(
                ProduceCheck.INVALID_PRODUCER_EPOCH,
                f"producer {pid} sent epoch {epoch} at offset {offset}, older than its current epoch "
                f"{current}: a newer instance of this producer took over (fenced)",
            )
        seq_last = last_sequence(first_seq, header[6])
        if not check_sequence:
            pass
        elif epoch == current:
            dup = entry.find_duplicate(epoch, first_seq, seq_last)
            if dup is not None:
                return CheckResult(
                    ProduceCheck.DUPLICATE_SEQUENCE_NUMBER,
                    f"producer {pid} epoch {epoch} resent sequences {first_seq}..{seq_last}, "
                    f"already at offsets {dup.first_offset}..{dup.last_offset}",
                    dup.first_offset,
                    dup.last_offset,
                )
            if not in_sequence(entry.last_seq, first_seq):
                return CheckResult(
                    ProduceCheck.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {pid} epoch {epoch} sent sequence {first_seq} at offset {offset}, "
                    f"expected {last_sequence(entry.last_seq, 1)}: a batch before it was lost",
                )
        elif first_seq != 0:
            return CheckResult(
                ProduceCheck.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} bumped its epoch {current} -> {epoch} but started at sequence "
                f"{first_seq}: a new epoch starts at sequence 0",
            )
        if entry.current_txn_first_offset >= 0:
            if not transactional:
                return CheckResult(
                    ProduceCheck.INVALID_TXN_STATE,
                    f"producer {pid} sent a non-transactional batch at offset {offset} while its "
                    f"transaction from offset {entry.current_txn_first_offset} is open",
                )
        elif transactional:
            return self._check_opens_txn(pid, epoch)
        return _OK

    def _check_opens_txn(self, pid: int, epoch: int) -> CheckResult:
        """A transactional batch that opens a transaction: the KIP-890 hook."""
        if (self.require_verification or pid in self.verification_required) and self.verified.get(pid) != epoch:
            return CheckResult(
                ProduceCheck.INVALID_TXN_STATE,
                f"producer {pid} epoch {epoch} opened a transaction here that its coordinator has not "
                "verified: a late write of a transaction already ended?",
            )
        return _OK

    def mark_verified(self, producer_id: int, producer_epoch: int) -> None:
        """The coordinator says `producer_id` at `producer_epoch` is in an
        ongoing transaction that includes this partition (KIP-890 hook)."""
        self.verified[producer_id] = producer_epoch
        self.verification_required.add(producer_id)

    def needs_verification(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether a transactional batch of `producer_id` at `producer_epoch`
        would open a transaction here that the coordinator has not verified."""
        entry = self.producers.get(producer_id)
        if entry is not None and entry.current_txn_first_offset >= 0 and entry.producer_epoch == producer_epoch:
            return False  # it continues the open transaction
        return self.verified.get(producer_id) != producer_epoch

    def check_epoch(self, producer_id: int, producer_epoch: int, what: str = "write") -> CheckResult:
        """INVALID_PRODUCER_EPOCH if `producer_epoch` is older than the
        producer's current one here."""
        entry = self.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.producer_epoch:
            return CheckResult(
                ProduceCheck.INVALID_PRODUCER_EPOCH,
                f"{what} for producer {producer_id} has epoch {producer_epoch}, older than its current "
                f"epoch {entry.producer_epoch}",
            )
        return _OK

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> CheckResult:
        """Decide a transaction marker the leader is asked to write."""
        checked = self.check_epoch(producer_id, producer_epoch, "marker")
        if checked.error:
            return checked
        entry = self.producers.get(producer_id)
        if entry is None:
            return _OK
        if coordinator_epoch < entry.coordinator_epoch:
            return CheckResult(
                ProduceCheck.TRANSACTION_COORDINATOR_FENCED,
                f"marker for producer {producer_id} comes from coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch} of its last marker: a newer coordinator took over",
            )
        return _OK

    def update(self, header: BatchHeader, base_offset: int | None = None,
               marker: tuple[int, int] | None = None) -> CompletedTxn | None:
        """Record a batch that is in the log (leader after the write,
        follower, rebuild). No checks: the log is the truth. For a
        transaction marker, `marker` is `(control type, coordinator
        epoch)` read from its record; the transaction it ends comes back
        (None if the producer had none open)."""
        pid = header[9]
        if pid < 0:
            return None
        base = header[0] if base_offset is None else base_offset
        epoch, max_timestamp = header[10], header[8]
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerStateEntry(pid, epoch)
        if header[5] & CONTROL_MASK:
            # A transaction marker moves the epoch forward (KIP-98); it
            # carries no sequence.
            if epoch > entry.producer_epoch:
                entry.producer_epoch = epoch
                entry.batches.clear()
            entry.last_timestamp = max(entry.last_timestamp, max_timestamp)
            if marker is None or marker[0] not in (ABORT, COMMIT):
                return None
            entry.coordinator_epoch = max(entry.coordinator_epoch, marker[1])
            self.verified.pop(pid, None)
            first = entry.current_txn_first_offset
            if first < 0:
                # A marker with no data before it here: nothing to stabilise
                # and nothing for the aborted-transaction index.
                return None
            entry.current_txn_first_offset = -1
            self.ongoing.pop(pid, None)
            completed = CompletedTxn(pid, first, base, marker[0] == ABORT)
            self.unreplicated.append(completed)
            self.unstable = True
            return completed
        if epoch != entry.producer_epoch:
            entry.producer_epoch = epoch
            entry.batches.clear()
        first_seq = header[11]
        entry.batches.append(
            BatchMetadata(first_seq, last_sequence(first_seq, header[6]), base, base + header[6], max_timestamp)
        )
        if len(entry.batches) > MAX_BATCHES_PER_PRODUCER:
            del entry.batches[0]
        entry.last_timestamp = max_timestamp
        if header[5] & TRANSACTIONAL_MASK and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = base
            self.ongoing[pid] = base
            self.unstable = True
        return None

    # --- transactions ---

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the earliest transaction that is open or
        whose marker is at or above `high_watermark` (module doc)."""
        unreplicated = self.unreplicated
        while unreplicated and unreplicated[0].last_offset < high_watermark:
            unreplicated.popleft()
        self.unstable = bool(self.ongoing or unreplicated)
        first = None
        if self.ongoing:
            first = next(iter(self.ongoing.values()))
        for txn in unreplicated:
            if first is None or txn.first_offset < first:
                first = txn.first_offset
        return first

    def last_stable_offset(self, high_watermark: int) -> int:
        """The LSO: read_committed consumers read below it."""
        if not self.unstable:
            return high_watermark
        first = self.first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    def index_last_stable_offset(self, completed: CompletedTxn) -> int:
        """The last stable offset an aborted-index entry records for
        `completed` (Kafka's TransactionIndex field): the first offset of
        the earliest other open transaction, or just past the marker."""
        for pid, first in self.ongoing.items():
            if pid != completed.producer_id:
                return first
        return completed.last_offset + 1

    def _rebuild_ongoing(self) -> None:
        """`ongoing` from the entries (after loading a snapshot)."""
        opened = sorted((e.current_txn_first_offset, pid) for pid, e in self.producers.items()
                        if e.current_txn_first_offset >= 0)
        self.ongoing = {pid: first for first, pid in opened}
        self.unreplicated.clear()
        self.unstable = bool(self.ongoing)

    def check_and_update(self, header: BatchHeader, base_offset: int | None = None) -> CheckResult:
        """`check`, and `update` if the batch is accepted (OK). Data
        batches only (a marker needs `check_marker`)."""
        result = self.check(header, base_offset)
        if result.error is ProduceCheck.OK:
            self.update(header, base_offset)
        return result

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers with no batch for `producer.id.expiration.ms`;
        return their ids."""
        limit = self.producer_id_expiration_ms
        # A producer with an open transaction stays (Kafka keeps it too):
        # its transaction still holds the LSO back until a marker ends it.
        expired = [pid for pid, e in self.producers.items()
                   if now_ms - e.last_timestamp >= limit and e.current_txn_first_offset < 0]
        for pid in expired:
            del self.producers[pid]
            self.verification_required.discard(pid)
            self.verified.pop(pid, None)
        return expired

    def last_batch_offsets(self) -> dict[int, int]:
        """Producer id -> last offset of its newest batch: the batches the
        cleaner must keep (as empty batches if need be) so that a rebuild
        from the log finds every producer's last sequence."""
        return {pid: e.last_offset for pid, e in self.producers.items() if e.batches}

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.unreplicated.clear()
        self.unstable = False

    def snapshot_entries(self) -> list[ProducerStateEntry]:
        """Deep copies of the entries, sorted by producer id."""
        return [self.producers[pid].copy() for pid in sorted(self.producers)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerState):
            return NotImplemented
        return self.producers == other.producers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.producers)} producers)"
