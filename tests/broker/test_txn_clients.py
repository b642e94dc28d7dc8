"""Transactional producers of the three clients against a real broker's
transaction coordinator, in process.

The broker serves FindCoordinator for transactional ids,
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn itself
(`broker.api.txn`, `broker.shell.txn_runtime`): `__transaction_state` is
created on first use, every transition is a record there before the
client hears of it, and the coordinator sends WriteTxnMarkers to the
partitions' leader. The receiving side of WriteTxnMarkers is the
partition's work (another module); here `MarkerRecorder` stands in for it
and records what the coordinator sent.
"""

from __future__ import annotations

import asyncio

import pytest
import trio
from broker_testing import in_thread, start_broker
from txn_testing import GROUP_CONFIG, TXN_CONFIG, MarkerRecorder, transaction_log

from broker.core.group import OFFSETS_TOPIC_NAME
from broker.core.txn import TxnState

PARTITIONS = 3


async def txn_broker(nursery, tmp_path, **config):
    running = await start_broker(nursery, tmp_path, txn_coordinator=config.pop("txn", TXN_CONFIG),
                                 group_coordinator=GROUP_CONFIG, **config)
    recorder = MarkerRecorder(running.broker).install()
    await running.create_topic("a", partitions=PARTITIONS)
    await running.create_topic("b", partitions=PARTITIONS)
    return running, recorder


async def wait_until(predicate, timeout_s: float = 15.0, what: str = "condition") -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.02)


def states_of(running, tid: str) -> list[TxnState]:
    return [v.state for k, v in transaction_log(running) if k == tid and v is not None]


def confluent_transaction(bootstrap: str, tid: str, commit: bool, *, group: str | None = None) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(20)
    producer.begin_transaction()
    for i in range(30):
        producer.produce("a" if i % 2 else "b", key=str(i).encode(), value=b"v%d" % i, partition=i % PARTITIONS)
    # Written before the end: an abort would otherwise just drop them unsent.
    producer.flush(10)
    if group is not None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            producer.send_offsets_to_transaction([TopicPartition("a", 0, 7)], consumer.consumer_group_metadata(), 20)
        finally:
            consumer.close()
    if commit:
        producer.commit_transaction(20)
    else:
        producer.abort_transaction(20)
    producer.flush(5)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_confluent_transaction_is_logged_then_marked(tmp_path, commit):
    async with trio.open_nursery() as nursery:
        running, recorder = await txn_broker(nursery, tmp_path)
        await in_thread(confluent_transaction, running.bootstrap, "tx-confluent", commit)
        prepared = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        completed = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        await wait_until(lambda: completed in states_of(running, "tx-confluent"), what="complete")
        states = states_of(running, "tx-confluent")
        # Init (Empty), partitions added (Ongoing, maybe more than once), prepare, complete.
        assert states[0] is TxnState.EMPTY and states[-2:] == [prepared, completed], states
        assert set(states[1:-2]) == {TxnState.ONGOING}, states
        # One marker per partition of both topics, of the transaction's producer, on the right side.
        wanted = {(t, p) for t in ("a", "b") for p in range(PARTITIONS)}
        assert {(t, p) for t, p, *_ in recorder.written} == wanted
        assert {(pid, commit) for _t, _p, pid, _e, commit, _c in recorder.written} == \
            {(transaction_log(running)[-1][1].producer_id, commit)}
        nursery.cancel_scope.cancel()


def prepared_before_markers(running, recorder) -> None:
    """Every marker request followed a logged Prepare record of its transaction."""
    assert recorder.requests
    for request, logged in zip(recorder.requests, recorder.logged_before):
        for marker in request.markers:
            want = TxnState.PREPARE_COMMIT if marker.transaction_result else TxnState.PREPARE_ABORT
            assert any(v is not None and v.state is want and v.producer_id == marker.producer_id
                       and v.producer_epoch == marker.producer_epoch for _tid, v in logged), (marker, logged)


async def test_markers_are_retried_until_written_and_follow_the_prepare_record(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder = await txn_broker(nursery, tmp_path)
        recorder.fail_next = 4
        await in_thread(confluent_transaction, running.bootstrap, "tx-retry", True)
        await wait_until(lambda: TxnState.COMPLETE_COMMIT in states_of(running, "tx-retry"))
        assert len(recorder.requests) >= 2
        wanted = {(t, p) for t in ("a", "b") for p in range(PARTITIONS)}
        assert {(t, p) for t, p, *_ in recorder.written} == wanted
        prepared_before_markers(running, recorder)
        nursery.cancel_scope.cancel()


def confluent_fenced(bootstrap: str, tid: str) -> str:
    """The older of two producers with one transactional id tries to commit."""
    from confluent_kafka import KafkaException, Producer
    old = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    old.init_transactions(20)
    old.begin_transaction()
    old.produce("a", value=b"old", partition=0)
    old.flush(10)
    new = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    new.init_transactions(30)
    new.begin_transaction()
    new.produce("a", value=b"new", partition=1)
    new.flush(10)
    new.commit_transaction(20)
    try:
        old.commit_transaction(10)
    except KafkaException as exc:
        error = exc.args[0]
        assert error.fatal(), error
        return error.name()
    return "committed"


async def test_a_second_producer_fences_the_first(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder = await txn_broker(nursery, tmp_path)
        outcome = await in_thread(confluent_fenced, running.bootstrap, "tx-fence")
        assert outcome in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), outcome
        # The commit was answered at PrepareCommit; its completion follows the markers.
        await wait_until(lambda: states_of(running, "tx-fence")[-1] is TxnState.COMPLETE_COMMIT)
        # The old producer's transaction was aborted (its epoch fenced), the new one's committed.
        aborts = {(t, p) for t, p, _pid, _e, commit, _c in recorder.written if not commit}
        commits = {(t, p) for t, p, _pid, _e, commit, _c in recorder.written if commit}
        assert aborts == {("a", 0)} and commits == {("a", 1)}
        states = states_of(running, "tx-fence")
        assert TxnState.COMPLETE_ABORT in states and states[-1] is TxnState.COMPLETE_COMMIT, states
        abort_epoch = max(e for _t, _p, _pid, e, commit, _c in recorder.written if not commit)
        commit_epoch = max(e for _t, _p, _pid, e, commit, _c in recorder.written if commit)
        assert commit_epoch > abort_epoch > 0
        prepared_before_markers(running, recorder)
        nursery.cancel_scope.cancel()


def kafka_python_transaction(bootstrap: str, tid: str, commit: bool) -> None:
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send("a", value=b"kp%d" % i, partition=i % PARTITIONS)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    finally:
        producer.close(timeout=5)


def aiokafka_transaction(bootstrap: str, tid: str, commit: bool) -> None:
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        await producer.start()
        try:
            await producer.begin_transaction()
            for i in range(10):
                await producer.send_and_wait("b", value=b"ak%d" % i, partition=i % PARTITIONS)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
async def test_python_clients_commit_and_abort(tmp_path, client):
    run = kafka_python_transaction if client == "kafka-python" else aiokafka_transaction
    topic = "a" if client == "kafka-python" else "b"
    async with trio.open_nursery() as nursery:
        running, recorder = await txn_broker(nursery, tmp_path)
        for commit in (True, False, True):
            await in_thread(run, running.bootstrap, f"tx-{client}-{commit}", commit)
        await wait_until(lambda: len(recorder.written) == 3 * PARTITIONS)
        await wait_until(lambda: all(states_of(running, f"tx-{client}-{c}")[-1].is_complete for c in (True, False)))
        done = {tid: states_of(running, tid)[-1] for tid in (f"tx-{client}-True", f"tx-{client}-False")}
        assert done == {f"tx-{client}-True": TxnState.COMPLETE_COMMIT, f"tx-{client}-False": TxnState.COMPLETE_ABORT}
        assert {(t, p) for t, p, *_ in recorder.written} == {(topic, p) for p in range(PARTITIONS)}
        # The second transaction of the same id bumped the epoch of the first (InitProducerId again).
        epochs = sorted(e for _t, _p, _pid, e, commit, _c in recorder.written if commit)
        assert epochs[0] < epochs[-1]
        prepared_before_markers(running, recorder)
        nursery.cancel_scope.cancel()


def _serves_txn_offset_commit() -> bool:
    from broker.shell.broker import _APIS
    return 28 in _APIS


@pytest.mark.skipif(not _serves_txn_offset_commit(),
                    reason="TxnOffsetCommit (the group coordinator's side of send_offsets_to_transaction) "
                           "is not served by this broker yet")
async def test_confluent_send_offsets_to_transaction(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder = await txn_broker(nursery, tmp_path)
        await in_thread(confluent_transaction, running.bootstrap, "tx-offsets", True, group="g-eos")
        await wait_until(lambda: TxnState.COMPLETE_COMMIT in states_of(running, "tx-offsets"))
        ongoing = [v for k, v in transaction_log(running) if k == "tx-offsets" and v.state is TxnState.ONGOING]
        assert any(t == OFFSETS_TOPIC_NAME for t, _ps in ongoing[-1].partitions)
        assert any(t == OFFSETS_TOPIC_NAME and commit for t, _p, _pid, _e, commit, _c in recorder.written)
        nursery.cancel_scope.cancel()
