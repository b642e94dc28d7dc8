"""Transactions v2 (KIP-890 part 2) over the wire, on one broker, with a
raw-protocol client speaking what Kafka's own 4.0 client sends (librdkafka,
kafka-python and aiokafka do not speak v2 yet): ApiVersions finalizes
`transaction.version` 2; Produce v12 adds its partition to the transaction
(no AddPartitionsToTxn), TxnOffsetCommit v5 its offsets partition (no
AddOffsetsToTxn); EndTxn v5 bumps the epoch and answers it. A late write
of an aborted transaction cannot land in the next one, on a partition of
the old transaction or on one only the next has; a read_committed consumer
(librdkafka) sees exactly the committed records."""

from __future__ import annotations

import datetime
import time

import trio
from broker_testing import in_thread, list_offsets_request, only_partition, start_broker
from kio.schema.api_versions.v3 import request as av3
from kio.schema.describe_transactions.v0 import request as dt0
from kio.schema.end_txn.v5 import request as et5
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as fc3
from kio.schema.init_producer_id.v5 import request as ip5
from kio.schema.offset_fetch.v7 import request as of7
from kio.schema.produce.v12 import request as pr12
from kio.schema.txn_offset_commit.v5 import request as toc5
from txn_testing import GROUP_CONFIG, TXN_CONFIG

from broker.core.group import OFFSETS_TOPIC_NAME

MS = datetime.timedelta(milliseconds=1)
TID = "v2"


def produce(partition: int, pid: int, epoch: int, sequence: int, value: bytes):
    from storage.batch import build_batch
    records = build_batch([(None, value, (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                          base_sequence=sequence, is_transactional=True)
    return pr12.ProduceRequest(transactional_id=TID, acks=-1, timeout=5000 * MS, topic_data=(
        pr12.TopicProduceData(name="a", partition_data=(pr12.PartitionProduceData(index=partition, records=records),)),))


def end(pid: int, epoch: int, commit: bool):
    return et5.EndTxnRequest(transactional_id=TID, producer_id=pid, producer_epoch=epoch, committed=commit)


async def wait_state(conn, state: str) -> None:
    with trio.fail_after(10):
        while (await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=(TID,)))
               ).transaction_states[0].transaction_state != state:
            await trio.sleep(0.02)


def read_values(bootstrap: str, partition: int, isolation: str, expected: int) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "v2-reader", "enable.auto.commit": False,
                         "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition("a", partition, OFFSET_BEGINNING)])
        out: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(out) < expected:
            out += [m.value() for m in consumer.consume(num_messages=100, timeout=0.2) if m.error() is None]
        time.sleep(0.3)
        out += [m.value() for m in consumer.consume(num_messages=100, timeout=0.2) if m.error() is None]
        return out
    finally:
        consumer.close()


async def test_transactions_v2_fence_a_late_write_of_an_aborted_transaction(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path, txn_coordinator=TXN_CONFIG, group_coordinator=GROUP_CONFIG)
        await running.create_topic("a", partitions=2)
        conn = await running.connect(nursery)

        versions = await conn.request(av3.ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        assert ("transaction.version", 2, 2) in [
            (f.name, f.min_version_level, f.max_version_level) for f in versions.finalized_features]
        assert ("transaction.version", 2) in [(f.name, f.max_version) for f in versions.supported_features]
        assert {k.api_key: k.max_version for k in versions.api_keys if k.api_key in (0, 26, 28)} == \
            {0: 13, 26: 5, 28: 5}

        with trio.fail_after(20):
            for key, key_type in ((TID, 1), ("g", 0)):
                while (await conn.request(fc3.FindCoordinatorRequest(key=key, key_type=key_type))
                       ).error_code != ErrorCode.none:
                    await trio.sleep(0.05)
            while (init := await conn.request(ip5.InitProducerIdRequest(
                    transactional_id=TID, transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1))
                   ).error_code != ErrorCode.none:
                await trio.sleep(0.05)
        pid, epoch = init.producer_id, init.producer_epoch

        # Transaction 1 writes partition 0 (added by the leader) and aborts.
        assert only_partition(await conn.request(produce(0, pid, epoch, 0, b"aborted-1"))).error_code == \
            ErrorCode.none
        ended = await conn.request(end(pid, epoch, False))
        assert (ended.error_code, ended.producer_id, ended.producer_epoch) == (ErrorCode.none, pid, epoch + 1)
        await wait_state(conn, "CompleteAbort")

        # Transaction 2, at the bumped epoch, writes partition 1 and sends offsets.
        epoch2 = epoch + 1
        assert only_partition(await conn.request(produce(1, pid, epoch2, 0, b"committed-1"))).error_code == \
            ErrorCode.none
        # Late writes of transaction 1 (its old epoch): on the partition it
        # wrote, the ABORT marker's epoch fences it; on the partition only
        # transaction 2 has, the coordinator does (it cannot be added).
        # Partition 0 had transaction 1 (its ABORT marker carried the new
        # epoch): it takes transaction 2's batch, sequence 0 at the new epoch.
        assert only_partition(await conn.request(produce(0, pid, epoch2, 0, b"committed-0"))).error_code == \
            ErrorCode.none
        late0 = only_partition(await conn.request(produce(0, pid, epoch, 1, b"late")))
        late1 = only_partition(await conn.request(produce(1, pid, epoch, 1, b"late")))
        assert late0.error_code == ErrorCode.invalid_producer_epoch, late0
        assert late1.error_code in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced), late1
        commit_offsets = toc5.TxnOffsetCommitRequest(
            transactional_id=TID, group_id="g", producer_id=pid, producer_epoch=epoch2, generation_id=-1,
            member_id="", group_instance_id=None, topics=(toc5.TxnOffsetCommitRequestTopic(
                name="a", partitions=(toc5.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                    committed_metadata=""),)),))
        with trio.fail_after(10):  # until the group's partition is loaded
            while (committed := await conn.request(commit_offsets)).topics[0].partitions[0].error_code in (
                    ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator):
                await trio.sleep(0.05)
        assert committed.topics[0].partitions[0].error_code == ErrorCode.none
        described = (await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=(TID,)))
                     ).transaction_states[0]
        assert {(t.topic, tuple(t.partitions)) for t in described.topics} >= {("a", (0, 1))}
        assert OFFSETS_TOPIC_NAME in {t.topic for t in described.topics}
        ended = await conn.request(end(pid, epoch2, True))
        assert (ended.error_code, ended.producer_epoch) == (ErrorCode.none, epoch2 + 1)
        # A retry of that EndTxn is answered as the same commit.
        retried = await conn.request(end(pid, epoch2, True))
        assert retried.error_code in (ErrorCode.none, ErrorCode.concurrent_transactions)
        await wait_state(conn, "CompleteCommit")
        assert (await conn.request(end(pid, epoch2, True))).producer_epoch == epoch2 + 1
        # Transaction 3 starts at once after its EndTxn answers, while the
        # markers may still be written; it is aborted.
        epoch3 = epoch2 + 1
        first = only_partition(await conn.request(produce(1, pid, epoch3, 0, b"aborted-3")))
        assert first.error_code in (ErrorCode.none, ErrorCode.not_enough_replicas), first
        if first.error_code != ErrorCode.none:  # still completing past the broker's retries: the client retries
            await wait_state(conn, "CompleteCommit")
            assert only_partition(await conn.request(produce(1, pid, epoch3, 0, b"aborted-3"))).error_code == \
                ErrorCode.none
        assert (await conn.request(end(pid, epoch3, False))).producer_epoch == epoch3 + 1
        await wait_state(conn, "CompleteAbort")

        fetched = await conn.request(of7.OffsetFetchRequest(group_id="g", topics=(
            of7.OffsetFetchRequestTopic(name="a", partition_indexes=(0,)),), require_stable=True))
        assert fetched.topics[0].partitions[0].committed_offset == 42
        # Partition 0: aborted-1, ABORT, committed-0, COMMIT; partition 1:
        # committed-1, COMMIT, aborted-3, ABORT. Nothing open.
        for partition in (0, 1):
            ends = [only_partition(await conn.request(list_offsets_request("a", partition, -1, isolation_level=i)
                                                      )).offset for i in (0, 1)]
            assert ends[0] == ends[1] == 4, (partition, ends)
        assert await in_thread(read_values, running.bootstrap, 0, "read_committed", 1) == [b"committed-0"]
        assert await in_thread(read_values, running.bootstrap, 1, "read_committed", 1) == [b"committed-1"]
        assert await in_thread(read_values, running.bootstrap, 0, "read_uncommitted", 2) == [b"aborted-1",
                                                                                            b"committed-0"]
        nursery.cancel_scope.cancel()
