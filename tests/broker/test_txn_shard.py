"""The transaction coordinator's pure core: its records in Kafka's format,
and its state machine call by call (Kafka's TransactionCoordinator is the
oracle for each answer)."""

from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode

from broker.core.txn import (
    TransactionCoordinatorConfig,
    TransactionCoordinatorShard,
    TransactionRecordError,
    TxnState,
    partition_for_transactional_id,
)
from broker.core.txn.records import (
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from broker.core.txn.state import MAX_PRODUCER_EPOCH

CONFIG = TransactionCoordinatorConfig(transaction_max_timeout_ms=60_000, transactional_id_expiration_ms=100_000,
                                      transaction_abort_timed_out_transaction_cleanup_interval_ms=1000,
                                      transaction_remove_expired_transaction_cleanup_interval_ms=1000)
A0, A1 = ("a", 0), ("a", 1)


def loaded(epoch: int = 0) -> TransactionCoordinatorShard:
    shard = TransactionCoordinatorShard(0, epoch, CONFIG)
    shard.on_loaded(0)
    return shard


def init(shard, tid="t", pid=-1, epoch=-1, now=0, new_pid=100, timeout=10_000):
    return shard.init_producer_id(tid, timeout, pid, epoch, now, new_pid)


def replayed(steps, epoch: int = 1) -> TransactionCoordinatorShard:
    shard = TransactionCoordinatorShard(0, epoch, CONFIG)
    for step in steps:
        for r in step.records:
            shard.replay(r.key, r.value)
    return shard


# --- records ---------------------------------------------------------------------


def test_records_round_trip_in_kafkas_layout():
    key = encode_key("my-txn")
    assert key == struct.pack(">hh", 0, 6) + b"my-txn"
    assert decode_key(key) == "my-txn"
    value = TransactionLogValue(7, 3, 60_000, TxnState.ONGOING, (("a", (0, 2)), ("b", (1,))), 1234, 1000)
    raw = encode_value(value)
    # version, producer id, epoch, timeout, status, then the partitions array.
    assert raw[:17] == struct.pack(">hqhib", 0, 7, 3, 60_000, 1)
    assert decode_value(raw) == value
    empty = TransactionLogValue(7, 4, 60_000, TxnState.EMPTY, (), 1234, -1)
    assert struct.unpack_from(">i", encode_value(empty), 17)[0] == -1  # null partitions when Empty
    assert decode_value(encode_value(empty)) == empty
    assert decode_value(None) is None


def test_value_v1_with_tagged_fields_is_read():
    # Flexible: compact array of (compact string, compact int32 array, tags), then tags.
    body = struct.pack(">hqhib", 1, 9, 2, 5000, 2) + bytes([2]) + bytes([2]) + b"a" + bytes([2]) + \
        struct.pack(">i", 4) + bytes([0]) + struct.pack(">qq", 77, 66) + bytes([1, 0, 8]) + struct.pack(">q", 5)
    value = decode_value(body)
    assert value == TransactionLogValue(9, 2, 5000, TxnState.PREPARE_COMMIT, (("a", (4,)),), 77, 66, 5)


def test_damaged_records_say_so():
    with pytest.raises(TransactionRecordError):
        decode_key(b"\x00\x05abc")
    with pytest.raises(TransactionRecordError):
        decode_value(struct.pack(">h", 9))


def test_partition_for_transactional_id_is_kafkas():
    # Java's String.hashCode by its definition, wrapped to a signed int.
    h = sum(ord(c) * 31 ** i for i, c in enumerate(reversed("my-txn"))) % 2**32
    h = h - 2**32 if h >= 2**31 else h
    assert partition_for_transactional_id("my-txn", 50) == abs(h) % 50


# --- the state machine -------------------------------------------------------------


def test_init_add_commit_complete():
    shard = loaded()
    step = init(shard)
    assert step.response.error == ErrorCode.none and (step.response.producer_id, step.response.producer_epoch) == (100, 0)
    assert [decode_value(r.value).state for r in step.records] == [TxnState.EMPTY]
    step = shard.add_partitions("t", 100, 0, frozenset({A0, A1}), 10)
    assert step.response.error == ErrorCode.none and len(step.records) == 1
    assert shard.add_partitions("t", 100, 0, frozenset({A0}), 11).records == ()  # already in: nothing to log
    step = shard.end_txn("t", 100, 0, True, 20)
    assert step.response == ErrorCode.none
    assert decode_value(step.records[0].value).state is TxnState.PREPARE_COMMIT
    (job,) = step.markers
    assert job.commit and job.partitions == {A0, A1} and job.coordinator_epoch == 0
    # A retry while the markers are written; the other outcome is illegal.
    assert shard.end_txn("t", 100, 0, True, 21).response == ErrorCode.concurrent_transactions
    assert shard.end_txn("t", 100, 0, False, 21).response == ErrorCode.invalid_txn_state
    assert shard.add_partitions("t", 100, 0, frozenset({A0}), 21).response.error == ErrorCode.concurrent_transactions
    assert init(shard, now=21).response.error == ErrorCode.concurrent_transactions
    step = shard.markers_written(job, 30)
    assert decode_value(step.records[0].value).state is TxnState.COMPLETE_COMMIT
    assert shard.end_txn("t", 100, 0, True, 31).response == ErrorCode.none  # a retry after completion
    assert shard.end_txn("t", 100, 0, False, 31).response == ErrorCode.invalid_txn_state
    assert shard.markers_written(job, 32).records == ()  # a late duplicate changes nothing


def test_errors_of_wrong_owner_state_and_timeout():
    shard = loaded()
    assert init(shard, timeout=60_001).response.error == ErrorCode.invalid_transaction_timeout
    assert init(shard, timeout=0).response.error == ErrorCode.invalid_transaction_timeout
    assert init(shard, tid="").response.error == ErrorCode.invalid_request
    assert shard.end_txn("nope", 1, 0, True, 0).response == ErrorCode.invalid_producer_id_mapping
    init(shard)
    assert shard.end_txn("t", 100, 0, True, 1).response == ErrorCode.invalid_txn_state  # Empty
    assert shard.end_txn("t", 101, 0, True, 1).response == ErrorCode.invalid_producer_id_mapping
    assert shard.end_txn("t", 100, 5, True, 1).response == ErrorCode.producer_fenced
    assert shard.add_partitions("t", 100, 1, frozenset({A0}), 1).response.error == ErrorCode.producer_fenced
    assert shard.describe("nope").error == ErrorCode.transactional_id_not_found
    unloaded = TransactionCoordinatorShard(0, 0, CONFIG)
    assert init(unloaded).response.error == ErrorCode.coordinator_load_in_progress


def test_a_new_instance_fences_and_aborts_the_open_transaction():
    shard = loaded()
    init(shard)
    shard.add_partitions("t", 100, 0, frozenset({A0}), 1)
    step = init(shard, now=2)
    # The open transaction is aborted at a bumped epoch; the client retries.
    assert step.response.error == ErrorCode.concurrent_transactions
    value = decode_value(step.records[0].value)
    assert value.state is TxnState.PREPARE_ABORT and value.producer_epoch == 1
    (job,) = step.markers
    assert not job.commit and job.producer_epoch == 1
    # The old producer is fenced at once.
    assert shard.end_txn("t", 100, 0, True, 3).response == ErrorCode.producer_fenced
    assert init(shard, now=3).response.error == ErrorCode.concurrent_transactions
    shard.markers_written(job, 4)
    step = init(shard, now=5)
    assert (step.response.error, step.response.producer_id, step.response.producer_epoch) == (ErrorCode.none, 100, 2)


def test_kip360_epoch_bump_retry_and_fencing():
    shard = loaded()
    init(shard)
    # The producer asks for a bump of its own epoch: granted.
    step = init(shard, pid=100, epoch=0, now=1)
    assert (step.response.error, step.response.producer_epoch) == (ErrorCode.none, 1)
    # The same request again (the answer was lost): the same answer, nothing logged.
    step = init(shard, pid=100, epoch=0, now=2)
    assert (step.response.error, step.response.producer_epoch, step.records) == (ErrorCode.none, 1, ())
    # An older epoch than that: fenced. Another producer id: fenced.
    assert init(shard, pid=100, epoch=7, now=3).response.error == ErrorCode.producer_fenced
    assert init(shard, pid=55, epoch=0, now=3).response.error == ErrorCode.producer_fenced


def test_an_exhausted_epoch_gets_a_new_producer_id():
    shard = loaded()
    first = init(shard)
    shard.txns["t"].producer_epoch = MAX_PRODUCER_EPOCH
    assert shard.needs_producer_id("t", -1, -1)
    step = init(shard, pid=100, epoch=MAX_PRODUCER_EPOCH, now=1, new_pid=200)
    assert (step.response.producer_id, step.response.producer_epoch) == (200, 0)
    retry = init(shard, pid=100, epoch=MAX_PRODUCER_EPOCH, now=2, new_pid=None)
    assert (retry.response.error, retry.response.producer_id, retry.response.producer_epoch, retry.records) == \
        (ErrorCode.none, 200, 0, ())
    # The retry of the old id at its exhausted epoch finds the new one (KIP-360).
    shard2 = replayed([first, step], epoch=1)
    assert shard2.txns["t"].previous_producer_id == 100


def test_timed_out_transactions_are_aborted_and_their_producer_fenced():
    shard = loaded()
    init(shard, timeout=5000)
    shard.add_partitions("t", 100, 0, frozenset({A0}), 100)
    assert shard.tick(1000).records == ()  # within its timeout
    step = shard.tick(5200)
    (job,) = step.markers
    assert not job.commit and job.producer_epoch == 1
    assert shard.end_txn("t", 100, 0, True, 5300).response == ErrorCode.producer_fenced
    shard.markers_written(job, 5400)
    assert shard.txns["t"].state is TxnState.COMPLETE_ABORT
    # Idle past transactional.id.expiration.ms: forgotten with a tombstone.
    step = shard.tick(5400 + 100_000 + 1000)
    assert [r.value for r in step.records] == [None] and "t" not in shard.txns


def test_verify_only_checks_membership_without_logging():
    shard = loaded()
    init(shard)
    shard.add_partitions("t", 100, 0, frozenset({A0}), 1)
    step = shard.verify_partitions("t", 100, 0, frozenset({A0, A1}))
    assert step.records == () and step.response.partitions == {
        A0: ErrorCode.none, A1: ErrorCode.transaction_abortable}
    assert shard.verify_partitions("t", 100, 3, frozenset({A0})).response.partitions == {
        A0: ErrorCode.producer_fenced}


def test_replay_rebuilds_and_resends_the_markers_of_a_prepared_transaction():
    shard = loaded()
    steps = [init(shard), shard.add_partitions("t", 100, 0, frozenset({A0, A1}), 1),
             init(shard, tid="u", new_pid=101), shard.add_partitions("u", 101, 0, frozenset({A1}), 2),
             shard.end_txn("t", 100, 0, False, 3)]
    rebuilt = replayed(steps, epoch=4)
    step = rebuilt.on_loaded(10)
    (job,) = step.markers
    assert (job.transactional_id, job.commit, job.partitions, job.coordinator_epoch) == ("t", False, {A0, A1}, 4)
    assert rebuilt.txns["u"].state is TxnState.ONGOING and rebuilt.txns["u"].partitions == {A1}
    assert [t.transactional_id for t in rebuilt.list_transactions(frozenset({TxnState.ONGOING}))] == ["u"]
    assert rebuilt.describe("t").state == "PrepareAbort"
    # Markers of the old coordinator epoch no longer complete anything.
    assert rebuilt.markers_written(steps[-1].markers[0], 11).records == ()
    assert rebuilt.markers_written(job, 11).records


def test_config_reads_kafkas_keys():
    from common.errors import ConfigError

    config = TransactionCoordinatorConfig.from_properties({
        "transaction.state.log.num.partitions": "7", "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1", "transaction.max.timeout.ms": "1000",
        "transactional.id.expiration.ms": "5000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200", "num.partitions": "9"})
    assert (config.transaction_state_log_num_partitions, config.transaction_state_log_replication_factor,
            config.transaction_max_timeout_ms, config.transactional_id_expiration_ms,
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms) == (7, 1, 1000, 5000, 200)
    assert config.topic_configs()["cleanup.policy"] == "compact"
    assert config.topic_configs()["min.insync.replicas"] == "1"
    assert TransactionCoordinatorConfig().transaction_state_log_num_partitions == 50
    with pytest.raises(ConfigError, match="transaction.state.log.num.partitions"):
        TransactionCoordinatorConfig.from_properties({"transaction.state.log.num.partitions": "0"})
    with pytest.raises(ConfigError, match="integer"):
        TransactionCoordinatorConfig.from_properties({"transaction.max.timeout.ms": "soon"})
