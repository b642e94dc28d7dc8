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

from broker.core.group import OFFSETS_TOPIC_NAME
from broker.core.txn import TxnState
from broker_testing import in_thread, start_broker
from txn_testing import GROUP_CONFIG, TXN_CONFIG, MarkerRecorder, transaction_log

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
