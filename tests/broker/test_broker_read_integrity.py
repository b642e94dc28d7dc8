"""A stored batch that cannot be read fails its partition, never the request
or the connection; a follower does not copy a batch whose records do not
parse.

Such a batch can no longer be produced (tests/broker/test_broker_record_integrity.py);
it stands here for a log written by an older version or damaged on disk:
it is appended to the leader's log directly, or its bytes are edited in the
segment file while the broker runs or while it is stopped.
"""

from __future__ import annotations

import datetime
import logging
import os
import struct

import trio
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7 import request as lr
from kio.schema.produce.v9 import request as pr

from broker import Broker, BrokerConfig
from local_controller import LocalController
from broker_testing import (
    BASE_TIMESTAMP_MS,
    CLUSTER_ID,
    RunningBroker,
    batch,
    fetch_request,
    only_partition,
    produce_request,
    start_broker,
)
from common.wire import connect
from storage.batch import CRC_OFFSET, CRC_START_OFFSET, HEADER_SIZE, build_batch, iter_batch_headers
from storage.checkpoint import OffsetCheckpointFile
from storage.fs import OsFileSystem
from test_broker_restart import BrokerProcess

TOPIC = "t"


def unparsable_batch(base_timestamp: int) -> bytes:
    """A batch whose CRC holds and whose header claims 3 records over a
    2-byte records section: what the produce path once let through."""
    out = bytearray(struct.pack(">qiibIhiqqqhii", 0, HEADER_SIZE - 12 + 2, -1, 2, 0, 0, 2, base_timestamp,
                                base_timestamp + 2, -1, -1, -1, 3) + b"\x00\x00")
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(memoryview(out)[CRC_START_OFFSET:]))
    return bytes(out)


def plant(rb: RunningBroker, partition: int, data: bytes, now_ms: int = 0) -> None:
    """Append `data` to the leader's log as an older version would have
    (no record checks), and move the HW past it."""
    hp = rb.partition(TOPIC, partition)
    hp.log.append(data, now_ms, leader_epoch=hp.state.leader_epoch)
    rb.broker.replicas.act(hp, hp.state.on_leader_append(hp.log.log_end_offset, now_ms))
    hp.notify()


def list_offsets(*partitions: tuple[int, int]):
    """One ListOffsets v7 for (partition, timestamp) pairs of TOPIC."""
    return lr.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(lr.ListOffsetsTopic(
        name=TOPIC, partitions=tuple(lr.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                                              timestamp=ts) for p, ts in partitions)),))


async def test_list_offsets_answers_corrupt_message_for_that_partition_and_serves_the_others(
        nursery, tmp_path, caplog):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic(TOPIC, 2)
    conn = await rb.connect(nursery)
    for partition in (0, 1):
        response = await conn.request(produce_request(TOPIC, partition, batch(2)))
        assert only_partition(response).error_code == ErrorCode.none
    plant(rb, 0, unparsable_batch(BASE_TIMESTAMP_MS + 10))
    with caplog.at_level(logging.ERROR, logger="broker.replica_manager"):
        for _ in range(3):
            response = await conn.request(list_offsets((0, BASE_TIMESTAMP_MS + 5), (1, BASE_TIMESTAMP_MS + 1)))
            (topic,) = response.topics
            bad, good = topic.partitions
            assert bad.error_code == ErrorCode.corrupt_message and bad.offset == -1
            assert (good.error_code, good.offset, good.timestamp) == (ErrorCode.none, 1, BASE_TIMESTAMP_MS + 1)
        # The largest timestamp is in the batch that does not parse.
        response = await conn.request(list_offsets((0, -3)))
        assert only_partition(response).error_code == ErrorCode.corrupt_message
    # Before the bad batch, lookups still work; the connection is still served.
    response = await conn.request(list_offsets((0, BASE_TIMESTAMP_MS + 1)))
    assert (only_partition(response).error_code, only_partition(response).offset) == (ErrorCode.none, 1)
    failures = [r for r in caplog.records if "a read failed" in r.getMessage()]
    assert len(failures) == 1
    assert "t-0" in failures[0].getMessage() and "base_offset 2" in failures[0].getMessage()


async def test_fetch_answers_corrupt_message_for_a_damaged_partition_and_serves_the_others(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic(TOPIC, 2)
    conn = await rb.connect(nursery)
    for i in range(20):
        response = await conn.request(produce_request(TOPIC, 0, batch(1, base_timestamp=BASE_TIMESTAMP_MS + i)))
        assert only_partition(response).base_offset == i
    await conn.request(produce_request(TOPIC, 1, batch(2)))
    # A disk fault in the segment: the magic byte of the batch at offset 3.
    segment = rb.partition(TOPIC, 0).log.segments[0]
    path = segment.path(".log")
    with open(path, "rb") as f:
        positions = [p for p, _ in iter_batch_headers(f.read())]
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\x00", positions[3] + 16)
    finally:
        os.close(fd)
    # Offset 5 is neither indexed nor one of the last batches appended: the
    # read scans the headers from the start of the segment and meets it.
    for _ in range(2):
        response = await conn.request(fetch_request([(TOPIC, 0, 5, 1 << 20, -1), (TOPIC, 1, 0, 1 << 20, -1)]))
        (topic,) = response.responses
        damaged, healthy = topic.partitions
        assert damaged.error_code == ErrorCode.corrupt_message and not damaged.records
        assert healthy.error_code == ErrorCode.none and healthy.records
    # Before the damage, and on the other partition, reads go on.
    response = await conn.request(fetch_request([(TOPIC, 0, 0, 100, -1)]))
    assert only_partition(response).error_code == ErrorCode.none


async def two_brokers(nursery, tmp_path) -> tuple[RunningBroker, Broker]:
    """Broker 1 leads both partitions of TOPIC; broker 2 follows them."""
    controller = LocalController(cluster_id=CLUSTER_ID)
    running = []
    for node_id in (1, 2):
        config = BrokerConfig(node_id=node_id, log_dirs=(str(tmp_path / f"broker-{node_id}"),),
                              cluster_id=CLUSTER_ID, port=0)
        broker = Broker(config, controller)
        controller.subscribe(broker.on_metadata_update)
        server = await nursery.start(broker.run)
        broker.on_metadata_update(controller.image)
        await controller.register_broker(node_id, "127.0.0.1", server.port)
        running.append((broker, server.port))
    (leader, port), (follower, _) = running
    rb = RunningBroker(leader, controller, port, nursery.cancel_scope)
    await rb.create_topic(TOPIC, assignments=[(1, 2), (1, 2)])
    return rb, follower


async def wait_for(condition, within_s: float = 10) -> None:
    with trio.fail_after(within_s):
        while not condition():
            await trio.sleep(0.05)


async def test_a_follower_does_not_copy_a_batch_whose_records_do_not_parse(nursery, tmp_path, caplog):
    rb, follower = await two_brokers(nursery, tmp_path)
    conn = await rb.connect(nursery)

    def follower_log_end(partition: int) -> int:
        hp = follower.replicas.partitions.get((TOPIC, partition))
        return -1 if hp is None else hp.log.log_end_offset

    for partition in (0, 1):
        await conn.request(produce_request(TOPIC, partition, batch(2)))
    await wait_for(lambda: follower_log_end(0) == 2 and follower_log_end(1) == 2)
    with caplog.at_level(logging.WARNING, logger="broker.replica_fetcher"):
        plant(rb, 0, unparsable_batch(BASE_TIMESTAMP_MS))
        response = await conn.request(produce_request(TOPIC, 1, batch(3)))
        assert only_partition(response).error_code == ErrorCode.none
        await wait_for(lambda: follower_log_end(1) == 5)
        await wait_for(lambda: "follower append failed" in caplog.text)
        await trio.sleep(0.5)
    assert follower_log_end(0) == 2
    assert "t-0" in caplog.text and "record 0 of 3" in caplog.text


async def test_the_produce_answer_names_the_record_at_fault(nursery, tmp_path):
    """KIP-467 over the wire: INVALID_RECORD with the record's index and why."""
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic(TOPIC, 1, configs={"cleanup.policy": "compact"})
    conn = await rb.connect(nursery)
    records = build_batch([(b"a", b"1", (), BASE_TIMESTAMP_MS), (None, b"2", (), BASE_TIMESTAMP_MS),
                           (b"c", b"3", (), BASE_TIMESTAMP_MS)])
    response = await conn.request(pr.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(pr.TopicProduceData(name=TOPIC, partition_data=(
            pr.PartitionProduceData(index=0, records=records),)),)))
    partition = only_partition(response)
    assert partition.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in partition.record_errors] == [1]
    assert "no key" in partition.record_errors[0].batch_index_error_message
    assert "compacted" in partition.error_message
    assert rb.partition(TOPIC, 0).log.log_end_offset == 0


def damage_records(path, batch_index: int) -> tuple[int, int]:
    """Make the records of a segment's batch unparsable, the CRC recomputed so
    it holds (a log an older version wrote, or a disk fault the CRC kept);
    return the batch's position and base offset."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        position, header = list(iter_batch_headers(bytes(data)))[batch_index]
        data[position + HEADER_SIZE] = 0x01  # the first record's length varint: -1
        end = position + header.size_in_bytes
        struct.pack_into(">I", data, position + CRC_OFFSET, crc32c(memoryview(data)[position + CRC_START_OFFSET : end]))
        f.seek(0)
        f.write(data)
    return position, header.base_offset


async def test_a_damaged_batch_below_the_recovery_point_fails_its_partition_after_a_restart(nursery, tmp_path):
    """A broker process stopped cleanly (the recovery point at the end of the
    log, so the next start re-reads nothing); a batch in the middle of a
    segment is edited on disk to hold records that do not parse, CRC intact.
    After the restart, Fetch serves the batches before it, answers
    CORRUPT_MESSAGE at it while the other partition in the same request is
    served, and serves the batches after it; ListOffsets by a timestamp in
    it answers CORRUPT_MESSAGE on a connection that stays up. The broker
    logs the partition, position, base offset and reason once."""
    first = BrokerProcess(tmp_path, f"{TOPIC}:2")
    host, port = first.bootstrap.split(":")
    async with trio.open_nursery() as inner:
        conn = await connect(inner, host, int(port))
        for partition in (0, 1):
            for i in range(3):
                response = await conn.request(produce_request(
                    TOPIC, partition, batch(2, base_timestamp=BASE_TIMESTAMP_MS + 10 * i), acks=-1))
                assert only_partition(response).base_offset == 2 * i
        inner.cancel_scope.cancel()
    first.stop()
    assert OffsetCheckpointFile(OsFileSystem(), str(tmp_path / "recovery-point-offset-checkpoint")).read()[
        (TOPIC, 0)] == 6
    position, bad_offset = damage_records(tmp_path / f"{TOPIC}-0" / f"{0:020d}.log", 1)
    assert bad_offset == 2

    second = BrokerProcess(tmp_path, f"{TOPIC}:2")
    host, port = second.bootstrap.split(":")
    try:
        async with trio.open_nursery() as inner:
            conn = await connect(inner, host, int(port))

            async def fetch(offset: int):
                response = await conn.request(fetch_request([(TOPIC, 0, offset, 1 << 20, -1),
                                                              (TOPIC, 1, 0, 1 << 20, -1)]))
                (topic,) = response.responses
                damaged, healthy = topic.partitions
                assert healthy.error_code == ErrorCode.none
                assert [h.base_offset for _, h in iter_batch_headers(bytes(healthy.records))] == [0, 2, 4]
                return damaged

            damaged = await fetch(0)  # the batch before the damage is served
            assert damaged.error_code == ErrorCode.none
            assert [h.base_offset for _, h in iter_batch_headers(bytes(damaged.records))] == [0]
            for _ in range(3):
                damaged = await fetch(bad_offset)
                assert damaged.error_code == ErrorCode.corrupt_message and not damaged.records
            damaged = await fetch(4)  # and the batch after it
            assert damaged.error_code == ErrorCode.none
            assert [h.base_offset for _, h in iter_batch_headers(bytes(damaged.records))] == [4]

            response = await conn.request(list_offsets((0, BASE_TIMESTAMP_MS + 10), (1, BASE_TIMESTAMP_MS + 10)))
            bad, good = response.topics[0].partitions
            assert bad.error_code == ErrorCode.corrupt_message and bad.offset == -1
            assert (good.error_code, good.offset) == (ErrorCode.none, 2)
            response = await conn.request(list_offsets((0, -1)))  # the same connection
            assert (only_partition(response).error_code, only_partition(response).offset) == (ErrorCode.none, 6)
            inner.cancel_scope.cancel()
    finally:
        stderr = second.stop()
    failures = [line for line in stderr.splitlines() if "a read failed" in line]
    assert len(failures) == 1, stderr
    assert f"{TOPIC}-0: a read failed" in failures[0]
    assert f"position {position}" in failures[0] and "base_offset 2" in failures[0]
    assert "record 0 of 2" in failures[0]
