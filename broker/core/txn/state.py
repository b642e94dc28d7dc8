"""A transactional id's state in the coordinator (pure).

Theory of operation
-------------------
Each transactional id has one `TransactionMetadata`: the producer id and
epoch that own it, the transaction's partitions, and where the current
transaction stands. The states and their ids are Kafka's (the id is what
`__transaction_state` stores):

    Empty (0)          no transaction open
    Ongoing (1)        AddPartitionsToTxn/AddOffsetsToTxn added partitions
    PrepareCommit (2)  EndTxn(commit) logged; COMMIT markers being written
    PrepareAbort (3)   EndTxn(abort), a fence or a timeout logged; ABORT markers
    CompleteCommit (4) every COMMIT marker written
    CompleteAbort (5)  every ABORT marker written
    Dead (6)           the id expired (a tombstone follows)
    PrepareEpochFence (7) an open transaction is being fenced

Transitions (each one a record in `__transaction_state` before anything
acts on it):

    Empty/CompleteCommit/CompleteAbort => Empty:   InitProducerId (epoch bump,
                                          or a new producer id once the epoch is exhausted)
    Empty/CompleteCommit/CompleteAbort/Ongoing => Ongoing: AddPartitionsToTxn with new partitions
    Ongoing => PrepareCommit:             EndTxn(commit)
    Ongoing => PrepareAbort:              EndTxn(abort)
    Ongoing => PrepareEpochFence => PrepareAbort: InitProducerId of a new
                                          producer instance, or the transaction timed out;
                                          the epoch is bumped, so the old producer is fenced.
                                          Only PrepareAbort is logged, as in Kafka
    PrepareCommit => CompleteCommit:      every partition has its COMMIT marker
    PrepareAbort => CompleteAbort:        every partition has its ABORT marker
    Empty/CompleteCommit/CompleteAbort => Dead: transactional.id.expiration.ms passed

Transactions v2 (KIP-890 part 2, EndTxn v5+): EndTxn bumps the producer
epoch in the PrepareCommit/PrepareAbort record itself, so the markers carry
the new epoch and every partition of the transaction fences the old one: a
late write of the ended transaction can neither land nor be added to the
next one. The answer hands the client the new epoch; at an exhausted epoch
the markers take the last value and the producer moves to a new producer id
(`next_producer_id`, taken on at the Complete transition). A v2 abort with
no transaction open is allowed (Empty/CompleteCommit/CompleteAbort =>
PrepareAbort => CompleteAbort, no marker to write), and bumps the epoch too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

#: Kafka's RecordBatch.NO_PRODUCER_ID / NO_PRODUCER_EPOCH.
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: An epoch at this value cannot be bumped: the next InitProducerId gets a
#: new producer id (Kafka's `Short.MaxValue - 1`: one value is left for the
#: fencing bump that aborts a transaction open at the last epoch).
MAX_PRODUCER_EPOCH = 32767 - 1


class TxnState(enum.Enum):
    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    def __init__(self, id_: int, display: str) -> None:
        self.id = id_
        self.display = display

    @classmethod
    def from_id(cls, id_: int) -> TxnState:
        for s in cls:
            if s.id == id_:
                return s
        raise ValueError(f"unknown transaction state id {id_}")

    @classmethod
    def from_name(cls, name: str) -> TxnState | None:
        for s in cls:
            if s.display.lower() == name.strip().lower():
                return s
        return None

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def is_preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


#: state -> the states it may be reached from (the table above).
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                 TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE, TxnState.EMPTY,
                                       TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


@dataclass
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    state: TxnState = TxnState.EMPTY
    #: (topic, partition) of the open (or completing) transaction.
    partitions: set[tuple[str, int]] = field(default_factory=set)
    start_timestamp_ms: int = -1
    last_update_timestamp_ms: int = -1
    #: The producer id before the last rotation (KIP-360: a retried
    #: InitProducerId of the old id with an exhausted epoch gets the new one).
    previous_producer_id: int = NO_PRODUCER_ID
    #: The epoch before the last bump (not logged, as in Kafka: a retry of
    #: the InitProducerId that bumped it gets the same answer).
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    #: Transactions v2 at an exhausted epoch: the producer id the producer
    #: moves to once the transaction completes (logged, as in Kafka).
    next_producer_id: int = NO_PRODUCER_ID
    #: The transaction version the client's requests speak (2: KIP-890
    #: part 2, EndTxn v5+; 0 otherwise), logged in value v1.
    client_transaction_version: int = 0

    def transition(self, to: TxnState) -> None:
        assert self.state in VALID_PREVIOUS[to], \
            f"{self.transactional_id}: illegal transition {self.state.display} => {to.display}"
        self.state = to

    @property
    def supports_epoch_bump(self) -> bool:
        return self.client_transaction_version >= 2

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_PRODUCER_EPOCH

    def sorted_partitions(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        by_topic: dict[str, list[int]] = {}
        for topic, p in self.partitions:
            by_topic.setdefault(topic, []).append(p)
        return tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items()))
