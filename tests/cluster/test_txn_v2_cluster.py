"""Transactions v2 (KIP-890 part 2) across brokers, with a raw-protocol
client: the partitions' leaders are other brokers than the transaction
coordinator, so each adds its partition to the transaction over the wire
(AddPartitionsToTxn v5) on the producer's first Produce v12. EndTxn v5
bumps the epoch; a late write of the aborted transaction, sent to a
partition only the next transaction has, is refused by its leader (the
coordinator does not add it), and nothing of it is visible."""

from __future__ import annotations

import datetime
import time

import trio
from kio.schema.describe_transactions.v0 import request as dt
from kio.schema.end_txn.v5 import request as et5
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as fc
from kio.schema.init_producer_id.v5 import request as ip5
from kio.schema.list_offsets.v7 import request as lo
from kio.schema.metadata.v8 import request as md8
from kio.schema.produce.v12 import request as pr12

from cluster import LocalCluster
from common.wire import ConnectionFailedError, open_connection
from storage.batch import build_batch

SETTINGS = {"transaction.state.log.num.partitions": "3", "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1"}
TID = "v2-across"
PARTITIONS = 6


async def request(address: str, req):
    host, port = address.rsplit(":", 1)
    async with open_connection(host, int(port)) as conn:
        return await conn.request(req)


async def retry(address: str, req, ok, timeout_s: float = 60):
    with trio.fail_after(timeout_s):
        while True:
            try:
                answer = await request(address, req)
                if ok(answer):
                    return answer
            except (ConnectionFailedError, OSError):
                pass
            await trio.sleep(0.2)


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("t", PARTITIONS, 1)], operation_timeout=30)["t"].result(60)


def produce(partition: int, pid: int, epoch: int, sequence: int, value: bytes):
    batch = build_batch([(None, value, (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                        base_sequence=sequence, is_transactional=True)
    return pr12.ProduceRequest(transactional_id=TID, acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(
        pr12.TopicProduceData(name="t", partition_data=(pr12.PartitionProduceData(index=partition, records=batch),)),))


def error_of(answer) -> ErrorCode:
    return answer.responses[0].partition_responses[0].error_code


async def ends(address: str, partition: int) -> tuple[int, int]:
    """(read_uncommitted end, read_committed end)."""
    out = []
    for isolation in (0, 1):
        answer = await request(address, lo.ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=(
            lo.ListOffsetsTopic(name="t", partitions=(
                lo.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1),)),)))
        out.append(answer.topics[0].partitions[0].offset)
    return out[0], out[1]


async def test_leaders_on_other_brokers_add_partitions_and_fence_a_late_write(tmp_path):
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        await trio.to_thread.run_sync(cluster.wait_ready, 120)
        by_id = {b.node_id: b.address for b in cluster.brokers}
        any_broker = next(iter(by_id.values()))
        await trio.to_thread.run_sync(create_topic, cluster.bootstrap)
        found = await retry(any_broker, fc.FindCoordinatorRequest(key=TID, key_type=1),
                            lambda a: a.error_code == ErrorCode.none)
        coordinator = by_id[found.node_id]
        metadata = await retry(any_broker, md8.MetadataRequest(
            topics=(md8.MetadataRequestTopic(name="t"),), allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False, include_topic_authorized_operations=False),
            lambda a: all(p.leader_id in by_id for p in a.topics[0].partitions))
        remote = sorted((p.partition_index, p.leader_id) for p in metadata.topics[0].partitions
                        if p.leader_id != found.node_id)
        assert len(remote) >= 2, f"every partition is led by the coordinator's broker: {metadata}"
        (first, first_leader), (second, second_leader) = remote[0], remote[1]

        init = await retry(coordinator, ip5.InitProducerIdRequest(
            transactional_id=TID, transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
            producer_epoch=-1), lambda a: a.error_code == ErrorCode.none)
        pid, epoch = init.producer_id, init.producer_epoch

        # Transaction 1 writes `first` (its leader adds it) and aborts.
        assert error_of(await request(by_id[first_leader], produce(first, pid, epoch, 0, b"aborted"))) == \
            ErrorCode.none
        ended = await request(coordinator, et5.EndTxnRequest(transactional_id=TID, producer_id=pid,
                                                             producer_epoch=epoch, committed=False))
        assert (ended.error_code, ended.producer_epoch) == (ErrorCode.none, epoch + 1)
        await retry(coordinator, dt.DescribeTransactionsRequest(transactional_ids=(TID,)),
                    lambda a: a.transaction_states[0].transaction_state == "CompleteAbort")

        # Transaction 2 writes `second`; the late write of transaction 1 to
        # `second` (its old epoch) is refused there, and nothing of it shows.
        assert error_of(await request(by_id[second_leader], produce(second, pid, epoch + 1, 0, b"committed"))) \
            == ErrorCode.none
        late = error_of(await request(by_id[second_leader], produce(second, pid, epoch, 1, b"late")))
        assert late in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced), late
        described = (await request(coordinator, dt.DescribeTransactionsRequest(transactional_ids=(TID,)))
                     ).transaction_states[0]
        assert [(t.topic, tuple(t.partitions)) for t in described.topics] == [("t", (second,))]
        ended = await request(coordinator, et5.EndTxnRequest(transactional_id=TID, producer_id=pid,
                                                             producer_epoch=epoch + 1, committed=True))
        assert (ended.error_code, ended.producer_epoch) == (ErrorCode.none, epoch + 2)
        with trio.fail_after(30):
            while await ends(by_id[second_leader], second) != (2, 2):  # the record and its COMMIT marker
                await trio.sleep(0.1)
        assert await ends(by_id[first_leader], first) == (2, 2)  # the aborted record and its ABORT marker
