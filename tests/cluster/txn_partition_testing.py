"""Raw Kafka-protocol requests for the partition side of transactions.

Until a transaction coordinator drives them, a test plays the coordinator
itself: it takes a producer id from a plain InitProducerId, produces
transactional batches with it (built by hand), and ends each transaction
with a WriteTxnMarkers request, as the coordinator would. Each call opens
its own connection (`common.wire.open_connection`) in a fresh trio run, so
the blocking tests can call them between client runs.
"""

from __future__ import annotations

import datetime
import time

import trio
from kio.schema.describe_producers.v0 import request as dp_req
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as ip_req
from kio.schema.list_offsets.v7 import request as lo_req
from kio.schema.produce.v9 import request as produce_req
from kio.schema.write_txn_markers.v1 import request as wtm_req

from common.wire import open_connection
from storage.batch import build_batch

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


def _address(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


def rpc(bootstrap: str, request, timeout_ms: int = 30_000):
    async def run():
        async with open_connection(*_address(bootstrap)) as conn:
            return await conn.request(request, timeout_ms=timeout_ms)

    return trio.run(run)


def init_producer_id(bootstrap: str) -> tuple[int, int]:
    response = rpc(bootstrap, ip_req.InitProducerIdRequest(
        transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60)))
    assert response.error_code == ErrorCode.none, response
    return response.producer_id, response.producer_epoch


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes], *, producer_id: int = -1,
            producer_epoch: int = -1, sequence: int = -1, transactional: bool = False) -> tuple[ErrorCode, int]:
    """One batch of `values`; (error, base offset)."""
    batch = build_batch([(None, v, (), int(time.time() * 1000)) for v in values], producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=sequence, is_transactional=transactional)
    response = rpc(bootstrap, produce_req.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(produce_req.TopicProduceData(name=topic, partition_data=(
            produce_req.PartitionProduceData(index=partition, records=batch),)),)))
    (p,) = response.responses[0].partition_responses
    return p.error_code, p.base_offset


def write_markers(bootstrap: str, producer_id: int, producer_epoch: int, commit: bool,
                  partitions: dict[str, list[int]], coordinator_epoch: int = 0) -> dict[tuple[str, int], ErrorCode]:
    response = rpc(bootstrap, wtm_req.WriteTxnMarkersRequest(markers=(wtm_req.WritableTxnMarker(
        producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
        coordinator_epoch=coordinator_epoch,
        topics=tuple(wtm_req.WritableTxnMarkerTopic(name=t, partition_indexes=tuple(ps))
                     for t, ps in partitions.items())),)))
    (marker,) = response.markers
    assert marker.producer_id == producer_id
    return {(t.name, p.partition_index): p.error_code for t in marker.topics for p in t.partitions}


def latest_offset(bootstrap: str, topic: str, partition: int, isolation_level: int) -> int:
    response = rpc(bootstrap, lo_req.ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation_level,
        topics=(lo_req.ListOffsetsTopic(name=topic, partitions=(
            lo_req.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1),)),)))
    (p,) = response.topics[0].partitions
    assert p.error_code == ErrorCode.none, p
    return p.offset


def describe_producers(bootstrap: str, topic: str, partition: int):
    response = rpc(bootstrap, dp_req.DescribeProducersRequest(
        topics=(dp_req.TopicRequest(name=topic, partition_indexes=(partition,)),)))
    (p,) = response.topics[0].partitions
    assert p.error_code == ErrorCode.none, p
    return {s.producer_id: s for s in p.active_producers}


# --- consumers, each client's read_committed / read_uncommitted -------------

def consume(client: str, bootstrap: str, topic: str, partition: int, isolation: str, expected: int,
            settle_s: float = 0.5) -> list[tuple[int, bytes]]:
    """(offset, value) of what `client` reads from the start of the
    partition with `isolation` ("read_committed"/"read_uncommitted"): at
    least `expected` records, then whatever else comes within `settle_s`."""
    return _CONSUMERS[client](bootstrap, topic, partition, isolation, expected, settle_s)


def _until(expected: int, settle_s: float, poll) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    settle_end = None
    while time.monotonic() < deadline:
        out += poll()
        if len(out) >= expected:
            if settle_end is None:
                settle_end = time.monotonic() + settle_s
            elif time.monotonic() >= settle_end:
                break
    return out


def _confluent(bootstrap, topic, partition, isolation, expected, settle_s):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-test", "enable.auto.commit": False,
                         "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])

        def poll():
            got = []
            for m in consumer.consume(num_messages=100, timeout=0.2):
                if m.error() is not None:
                    raise KafkaException(m.error())
                got.append((m.offset(), m.value()))
            return got

        return _until(expected, settle_s, poll)
    finally:
        consumer.close()


def _kafka_python(bootstrap, topic, partition, isolation, expected, settle_s):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation)
    try:
        consumer.assign([TopicPartition(topic, partition)])
        consumer.seek_to_beginning()

        def poll():
            return [(m.offset, m.value) for ms in consumer.poll(timeout_ms=200).values() for m in ms]

        return _until(expected, settle_s, poll)
    finally:
        consumer.close()


def _aiokafka(bootstrap, topic, partition, isolation, expected, settle_s):
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level=isolation)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, partition)])
            await consumer.seek_to_beginning()
            out: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 30
            settle_end = None
            while time.monotonic() < deadline:
                for ms in (await consumer.getmany(timeout_ms=200)).values():
                    out += [(m.offset, m.value) for m in ms]
                if len(out) >= expected:
                    if settle_end is None:
                        settle_end = time.monotonic() + settle_s
                    elif time.monotonic() >= settle_end:
                        break
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


_CONSUMERS = {"confluent-kafka": _confluent, "kafka-python": _kafka_python, "aiokafka": _aiokafka}
CONSUMERS = tuple(_CONSUMERS)


# --- the group coordinator's side ----------------------------------------------

def txn_offset_commit(bootstrap: str, group: str, producer_id: int, producer_epoch: int,
                      offsets: dict[tuple[str, int], int], timeout_s: float = 30) -> set[ErrorCode]:
    """TxnOffsetCommit v3; retried while the coordinator is not ready yet
    (its `__consumer_offsets` partition is being created or loaded)."""
    from kio.schema.txn_offset_commit.v3 import request as toc_req

    request = toc_req.TxnOffsetCommitRequest(
        transactional_id="tx", group_id=group, producer_id=producer_id, producer_epoch=producer_epoch,
        generation_id=-1, member_id="", group_instance_id=None,
        topics=tuple(toc_req.TxnOffsetCommitRequestTopic(name=t, partitions=(
            toc_req.TxnOffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                                    committed_metadata=""),))
            for (t, p), o in offsets.items()))
    from kio.schema.find_coordinator.v3 import request as fc_req

    retry = {ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator}
    deadline = time.monotonic() + timeout_s
    while True:
        # As a client does first: this also creates `__consumer_offsets` on first use.
        rpc(bootstrap, fc_req.FindCoordinatorRequest(key=group, key_type=0))
        response = rpc(bootstrap, request)
        codes = {p.error_code for t in response.topics for p in t.partitions}
        if not codes & retry or time.monotonic() > deadline:
            return codes
        time.sleep(0.2)


def offset_fetch(bootstrap: str, group: str, topic: str, partition: int, require_stable: bool) -> tuple[int, ErrorCode]:
    """OffsetFetch v7: (committed offset, partition error)."""
    from kio.schema.offset_fetch.v7 import request as of_req

    response = rpc(bootstrap, of_req.OffsetFetchRequest(
        group_id=group, require_stable=require_stable,
        topics=(of_req.OffsetFetchRequestTopic(name=topic, partition_indexes=(partition,)),)))
    assert response.error_code == ErrorCode.none, response
    (p,) = response.topics[0].partitions
    return p.committed_offset, p.error_code


def offsets_partition(group: str, partitions: int = 50) -> int:
    from broker.core.group import partition_for_group

    return partition_for_group(group, partitions)
