"""KIP-890 partition-side verification on one broker, over the wire: a
transactional producer's batch that would open a transaction on a
partition is appended only once the coordinator confirms the partition is
in that producer's ongoing transaction. A late write of an aborted
transaction (a retry that arrives after the ABORT marker) is refused
instead of opening a transaction nobody will end; so is a write to a
partition the next transaction has not added; and the partition's LSO is
not held back by either."""

from __future__ import annotations

import dataclasses
import datetime
import time

import pytest
import trio
from broker_testing import list_offsets_request, only_partition, start_broker
from kio.schema.add_partitions_to_txn.v3 import request as apt3
from kio.schema.describe_transactions.v0 import request as dt0
from kio.schema.end_txn.v3 import request as et3
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as fc3
from kio.schema.init_producer_id.v4 import request as ip4
from kio.schema.produce.v9 import request as pr
from txn_testing import GROUP_CONFIG, TXN_CONFIG

from broker.core.txn import TransactionCoordinatorConfig
from common.errors import ConfigError
from storage.batch import build_batch
from storage.producer_state import ProducerState

MS = datetime.timedelta(milliseconds=1)
TID = "verified"


def add(pid: int, epoch: int, partitions):
    return apt3.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TID, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(apt3.AddPartitionsToTxnTopic(name="a", partitions=partitions),))


def produce(partition: int, pid: int, epoch: int, sequence: int, value: bytes, transactional_id: str | None = TID):
    records = build_batch([(None, value, (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                          base_sequence=sequence, is_transactional=True)
    return pr.ProduceRequest(transactional_id=transactional_id, acks=-1, timeout=5000 * MS, topic_data=(
        pr.TopicProduceData(name="a", partition_data=(pr.PartitionProduceData(index=partition, records=records),)),))


async def wait_state(conn, state: str) -> None:
    with trio.fail_after(10):
        while (await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=(TID,)))
               ).transaction_states[0].transaction_state != state:
            await trio.sleep(0.02)


async def stable_end(conn, partition: int) -> tuple[int, int]:
    """(read_uncommitted end, read_committed end = the LSO)."""
    ends = []
    for isolation in (0, 1):
        answer = await conn.request(list_offsets_request("a", partition, -1, isolation_level=isolation))
        ends.append(only_partition(answer).offset)
    return ends[0], ends[1]


async def test_a_late_write_of_an_aborted_transaction_cannot_open_the_next_one(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path, txn_coordinator=TXN_CONFIG, group_coordinator=GROUP_CONFIG)
        await running.create_topic("a", partitions=2)
        conn = await running.connect(nursery)
        with trio.fail_after(20):  # FindCoordinator makes __transaction_state; then it is loaded
            while (await conn.request(fc3.FindCoordinatorRequest(key=TID, key_type=1))).error_code != ErrorCode.none:
                await trio.sleep(0.05)
            while (init := await conn.request(ip4.InitProducerIdRequest(
                    transactional_id=TID, transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1))
                   ).error_code != ErrorCode.none:
                await trio.sleep(0.05)
        pid, epoch = init.producer_id, init.producer_epoch

        # A write before its partition was added to the transaction: refused.
        early = only_partition(await conn.request(produce(0, pid, epoch, 0, b"early")))
        assert early.error_code == ErrorCode.invalid_txn_state
        # Added, then written: the coordinator confirms it.
        assert (await conn.request(add(pid, epoch, (0,)))).results_by_topic_v3_and_below[0] \
            .results_by_partition[0].partition_error_code == ErrorCode.none
        assert only_partition(await conn.request(produce(0, pid, epoch, 0, b"t1"))).error_code == ErrorCode.none
        assert (await conn.request(et3.EndTxnRequest(transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                                                     committed=False))).error_code == ErrorCode.none
        await wait_state(conn, "CompleteAbort")
        end_before = await stable_end(conn, 0)
        assert end_before[0] == end_before[1] == 2  # t1 and its ABORT marker

        # The aborted transaction's late write (its next sequence): refused, nothing appended.
        late = only_partition(await conn.request(produce(0, pid, epoch, 1, b"late")))
        assert late.error_code == ErrorCode.invalid_txn_state
        assert await stable_end(conn, 0) == end_before

        # The next transaction has partition 1 only: a write to 0 still cannot join it.
        assert (await conn.request(add(pid, epoch, (1,)))).results_by_topic_v3_and_below[0] \
            .results_by_partition[0].partition_error_code == ErrorCode.none
        late = only_partition(await conn.request(produce(0, pid, epoch, 1, b"late")))
        assert late.error_code == ErrorCode.invalid_txn_state
        assert await stable_end(conn, 0) == end_before
        assert only_partition(await conn.request(produce(1, pid, epoch, 0, b"t2"))).error_code == ErrorCode.none
        # Once added, partition 0 takes the write; the commit makes it stable.
        await conn.request(add(pid, epoch, (0,)))
        assert only_partition(await conn.request(produce(0, pid, epoch, 1, b"t2-0"))).error_code == ErrorCode.none
        assert (await conn.request(et3.EndTxnRequest(transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                                                     committed=True))).error_code == ErrorCode.none
        await wait_state(conn, "CompleteCommit")
        assert await stable_end(conn, 0) == (4, 4)

        # With verification off, the late write would have opened a transaction here.
        running.broker.config = dataclasses.replace(running.broker.config, txn_coordinator=dataclasses.replace(
            running.broker.config.txn_coordinator, transaction_partition_verification_enable=False))
        hp = running.broker.replicas.partitions[("a", 1)]
        hp.log.producer_state.verification_required.clear()
        hanging = only_partition(await conn.request(produce(1, pid, epoch, 1, b"hanging")))
        assert hanging.error_code == ErrorCode.none
        uncommitted, lso = await stable_end(conn, 1)
        assert lso < uncommitted  # stuck behind a transaction no coordinator knows
        nursery.cancel_scope.cancel()


def test_a_producer_verified_once_needs_it_for_each_transaction():
    state = ProducerState()
    assert state.needs_verification(7, 0)
    state.mark_verified(7, 0)
    assert not state.needs_verification(7, 0)
    assert state.needs_verification(7, 1)  # another epoch: another transaction
    # A marker ends the verification: the next transaction needs its own.
    state.verified.pop(7)
    assert state.needs_verification(7, 0) and 7 in state.verification_required
    # Producers never verified are not held to it (require_verification is off).
    assert not state.require_verification and 8 not in state.verification_required


def test_verification_is_on_by_default_and_read_by_kafkas_key():
    assert TransactionCoordinatorConfig().transaction_partition_verification_enable
    off = TransactionCoordinatorConfig.from_properties({"transaction.partition.verification.enable": "false"})
    assert not off.transaction_partition_verification_enable
    with pytest.raises(ConfigError, match="transaction.partition.verification.enable must be true or false"):
        TransactionCoordinatorConfig.from_properties({"transaction.partition.verification.enable": "yes"})
