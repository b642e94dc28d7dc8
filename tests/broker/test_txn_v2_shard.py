"""Transactions v2 (KIP-890 part 2) in the coordinator's pure core: EndTxn
v5 bumps the producer epoch with every commit and abort, the markers carry
the bumped epoch, a retry is told from the next transaction by its epoch,
an exhausted epoch moves the producer to a new id, and all of it survives a
coordinator failover (value v1 records). Kafka's TransactionCoordinator is
the oracle for each answer."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from broker.core.txn import (
    EndTxnAnswer,
    TransactionCoordinatorConfig,
    TransactionCoordinatorShard,
    TxnState,
)
from broker.core.txn.records import TransactionLogValue, decode_value, encode_value
from broker.core.txn.state import MAX_PRODUCER_EPOCH

CONFIG = TransactionCoordinatorConfig(transaction_max_timeout_ms=60_000, transactional_id_expiration_ms=100_000,
                                      transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
                                      transaction_remove_expired_transaction_cleanup_interval_ms=1000)
A0, A1 = ("a", 0), ("a", 1)


def started(pid: int = 100) -> TransactionCoordinatorShard:
    shard = TransactionCoordinatorShard(0, 0, CONFIG)
    shard.on_loaded(0)
    assert shard.init_producer_id("t", 10_000, -1, -1, 0, pid).response.error == ErrorCode.none
    return shard


def add(shard, pid, epoch, partitions=frozenset({A0, A1}), now=1):
    # What a partition leader sends for a Produce v12 (AddPartitionsToTxn v5).
    return shard.add_partitions("t", pid, epoch, partitions, now, transaction_version=2).response


def test_commit_bumps_the_epoch_and_the_markers_carry_it():
    shard = started()
    assert add(shard, 100, 0).error == ErrorCode.none
    step = shard.end_txn_v2("t", 100, 0, True, 2)
    assert step.response == EndTxnAnswer(ErrorCode.none, 100, 1)
    (job,) = step.markers
    assert (job.producer_id, job.producer_epoch, job.commit, job.partitions) == (100, 1, True, {A0, A1})
    (record,) = step.records
    value = decode_value(record.value)
    assert (value.state, value.producer_epoch, value.client_transaction_version) == (TxnState.PREPARE_COMMIT, 1, 2)
    # A retry while the markers are written, then after: same transaction.
    assert shard.end_txn_v2("t", 100, 0, True, 3).response.error == ErrorCode.concurrent_transactions
    shard.markers_written(job, 4)
    assert shard.end_txn_v2("t", 100, 0, True, 5).response == EndTxnAnswer(ErrorCode.none, 100, 1)
    # The next transaction runs at the new epoch; the old one is fenced.
    assert add(shard, 100, 0).error == ErrorCode.producer_fenced
    assert add(shard, 100, 1).error == ErrorCode.none
    assert shard.end_txn_v2("t", 100, 1, False, 6).response == EndTxnAnswer(ErrorCode.none, 100, 2)


def test_a_late_write_of_an_aborted_transaction_cannot_join_the_next():
    shard = started()
    add(shard, 100, 0, frozenset({A0}))
    (job,) = shard.end_txn_v2("t", 100, 0, False, 2).markers
    shard.markers_written(job, 3)
    add(shard, 100, 1, frozenset({A0}))
    # The aborted transaction's write to A1, late: its epoch is stale now,
    # so A1 is not added to the open transaction and the write is refused.
    assert add(shard, 100, 0, frozenset({A1})).error == ErrorCode.producer_fenced
    assert shard.txns["t"].partitions == {A0}


def test_retry_and_wrong_state_answers():
    shard = started()
    # A commit with nothing open is the client's mistake; an abort is fine
    # and completes at once (nothing to mark), bumping the epoch.
    assert shard.end_txn_v2("t", 100, 0, True, 1).response.error == ErrorCode.invalid_txn_state
    step = shard.end_txn_v2("t", 100, 0, False, 1)
    assert step.response == EndTxnAnswer(ErrorCode.none, 100, 1) and not step.markers
    assert [decode_value(r.value).state for r in step.records] == [TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT]
    # The retry of that abort, a commit at the old epoch, a wrong producer id.
    assert shard.end_txn_v2("t", 100, 0, False, 2).response == EndTxnAnswer(ErrorCode.none, 100, 1)
    assert shard.end_txn_v2("t", 100, 0, True, 2).response.error == ErrorCode.invalid_txn_state
    assert shard.end_txn_v2("t", 101, 1, False, 2).response.error == ErrorCode.invalid_producer_id_mapping
    assert shard.end_txn_v2("t", 100, 5, False, 2).response.error == ErrorCode.producer_fenced


def test_an_exhausted_epoch_moves_the_producer_to_a_new_id():
    shard = started()
    shard.txns["t"].producer_epoch = MAX_PRODUCER_EPOCH
    add(shard, 100, MAX_PRODUCER_EPOCH)
    assert shard.end_txn_needs_producer_id("t", 100, MAX_PRODUCER_EPOCH)
    assert shard.end_txn_v2("t", 100, MAX_PRODUCER_EPOCH, True, 2).response.error == \
        ErrorCode.concurrent_transactions
    step = shard.end_txn_v2("t", 100, MAX_PRODUCER_EPOCH, True, 2, new_producer_id=200)
    assert step.response == EndTxnAnswer(ErrorCode.none, 200, 0)
    (job,) = step.markers
    assert (job.producer_id, job.producer_epoch) == (100, MAX_PRODUCER_EPOCH + 1)
    # The new id is busy until the markers are written.
    assert add(shard, 200, 0).error == ErrorCode.concurrent_transactions
    shard.markers_written(job, 3)
    txn = shard.txns["t"]
    assert (txn.producer_id, txn.producer_epoch, txn.previous_producer_id) == (200, 0, 100)
    # The retry of the overflowing EndTxn (old id, last epoch) is recognised.
    assert shard.end_txn_v2("t", 100, MAX_PRODUCER_EPOCH, True, 4).response == EndTxnAnswer(ErrorCode.none, 200, 0)
    assert add(shard, 200, 0).error == ErrorCode.none


def test_failover_keeps_the_bumped_epoch_and_the_next_producer_id():
    shard = started()
    shard.txns["t"].producer_epoch = MAX_PRODUCER_EPOCH
    steps = [shard.add_partitions("t", 100, MAX_PRODUCER_EPOCH, frozenset({A0}), 1, transaction_version=2),
             shard.end_txn_v2("t", 100, MAX_PRODUCER_EPOCH, False, 2, new_producer_id=300)]
    successor = TransactionCoordinatorShard(0, 1, CONFIG)
    for step in steps:
        for r in step.records:
            successor.replay(r.key, r.value)
    (job,) = successor.on_loaded(5).markers
    assert (job.producer_id, job.producer_epoch, job.commit) == (100, MAX_PRODUCER_EPOCH + 1, False)
    successor.markers_written(job, 6)
    txn = successor.txns["t"]
    assert (txn.producer_id, txn.producer_epoch, txn.state) == (300, 0, TxnState.COMPLETE_ABORT)


def test_value_v1_round_trip():
    value = TransactionLogValue(7, 3, 60_000, TxnState.PREPARE_COMMIT, (("a", (0, 2)), ("b", (1,))), 1234, 1000,
                                previous_producer_id=5, next_producer_id=9, client_transaction_version=2)
    raw = encode_value(value)
    assert raw[:2] == b"\x00\x01"
    assert decode_value(raw) == value
    empty = TransactionLogValue(7, 4, 60_000, TxnState.EMPTY, (), 1234, -1, client_transaction_version=2)
    assert decode_value(encode_value(empty)) == empty
