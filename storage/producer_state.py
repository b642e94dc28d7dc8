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

Transactions are not supported: a control batch (transaction marker) of a
producer only moves its epoch forward.

Pure: headers in, answers out; no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from storage.batch import BatchHeader
from storage.errors import StorageError

MAX_BATCHES_PER_PRODUCER = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
INT32_MAX = (1 << 31) - 1
NO_SEQUENCE = -1
NO_PRODUCER_EPOCH = -1


class ProduceCheck(enum.IntEnum):
    """The answer of `check`, valued as Kafka's error code."""

    OK = 0
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47


class CheckResult(NamedTuple):
    """`check`'s answer. For a duplicate, the original batch's offsets."""

    error: ProduceCheck
    message: str = ""
    first_offset: int = -1
    last_offset: int = -1


_OK = CheckResult(ProduceCheck.OK)


class ProducerStateError(StorageError):
    """A produce refused by the idempotence checks; `error_code` is the
    Kafka error code the broker answers with (45 or 47)."""

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
        return ProducerStateEntry(self.producer_id, self.producer_epoch, list(self.batches), self.last_timestamp)


class ProducerState:
    """Per-partition producer id -> `ProducerStateEntry`."""

    def __init__(self, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.producers: dict[int, ProducerStateEntry] = {}
        self.producer_id_expiration_ms = producer_id_expiration_ms

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    def check(self, header: BatchHeader, base_offset: int | None = None) -> CheckResult:
        """Decide a client batch (see the module's table); changes nothing.
        `base_offset` is the offset the log will give it (messages only)."""
        pid, epoch, first_seq = header[9], header[10], header[11]
        if pid < 0:
            return _OK
        entry = self.producers.get(pid)
        if entry is None:
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
        if epoch == current:
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
        return _OK

    def update(self, header: BatchHeader, base_offset: int | None = None) -> None:
        """Record a batch that is in the log (leader after the write,
        follower, rebuild). No checks: the log is the truth."""
        pid = header[9]
        if pid < 0:
            return
        base = header[0] if base_offset is None else base_offset
        epoch, max_timestamp = header[10], header[8]
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerStateEntry(pid, epoch)
        if header.is_control:
            # A transaction marker moves the epoch forward (KIP-98); it
            # carries no sequence.
            if epoch > entry.producer_epoch:
                entry.producer_epoch = epoch
                entry.batches.clear()
            entry.last_timestamp = max(entry.last_timestamp, max_timestamp)
            return
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

    def check_and_update(self, header: BatchHeader, base_offset: int | None = None) -> CheckResult:
        """`check`, and `update` if the batch is accepted (OK)."""
        result = self.check(header, base_offset)
        if result.error is ProduceCheck.OK:
            self.update(header, base_offset)
        return result

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers with no batch for `producer.id.expiration.ms`;
        return their ids."""
        limit = self.producer_id_expiration_ms
        expired = [pid for pid, e in self.producers.items() if now_ms - e.last_timestamp >= limit]
        for pid in expired:
            del self.producers[pid]
        return expired

    def last_batch_offsets(self) -> dict[int, int]:
        """Producer id -> last offset of its newest batch: the batches the
        cleaner must keep (as empty batches if need be) so that a rebuild
        from the log finds every producer's last sequence."""
        return {pid: e.last_offset for pid, e in self.producers.items() if e.batches}

    def clear(self) -> None:
        self.producers.clear()

    def snapshot_entries(self) -> list[ProducerStateEntry]:
        """Deep copies of the entries, sorted by producer id."""
        return [self.producers[pid].copy() for pid in sorted(self.producers)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerState):
            return NotImplemented
        return self.producers == other.producers

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.producers)} producers)"
