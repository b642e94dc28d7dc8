"""Compaction of a transactional topic on a live node, read by real
consumers (librdkafka) before and after the cleaner has been over it.

A compacted topic with tiny segments gets committed and aborted
transactions (the aborted ones overwrite the committed keys), plain writes
that overwrite one committed transaction's keys, and a stream of plain
writes that keeps the cleaner busy. The cleaner must:

- drop the aborted transactions' records, without letting them shadow
  the committed values they overwrote;
- keep each transaction's marker while a record of the transaction is
  left, and remove it only once none is and `delete.retention.ms` has
  passed (Kafka's cleaner);
- leave read_committed and read_uncommitted consumers, reading from the
  start, with the same newest value of every key, and none aborted.
"""

from __future__ import annotations

import datetime
import threading
import time

import trio
from cluster_group_testing import DevNode
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from common.wire import open_connection
from storage.batch import iter_batch_headers, iter_records, read_txn_marker

TOPIC = "ledger"
DELETE_RETENTION_MS = 3000
NODE_SETTINGS = ("log.cleaner.backoff.ms=200", "log.cleaner.min.cleanable.ratio=0.01",
                 "transaction.state.log.num.partitions=1", "offsets.topic.num.partitions=1")


def transaction(producer: Producer, records: dict[bytes, bytes], commit: bool) -> None:
    producer.begin_transaction()
    for key, value in records.items():
        producer.produce(TOPIC, key=key, value=value, partition=0)
    producer.flush(30)
    (producer.commit_transaction if commit else producer.abort_transaction)(30)


def read_all(bootstrap: str, isolation: str) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{isolation}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        out = []
        while True:
            m = consumer.poll(10)
            assert m is not None, "no end of partition within 10 s"
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return out
            out.append((m.offset(), m.key(), m.value()))
    finally:
        consumer.close()


def scan(bootstrap: str) -> tuple[dict[int, bool], list[bytes]]:
    """What the partition holds, read with raw Fetch requests (which, unlike
    a consumer, show the control batches): the transaction markers (offset
    -> commit) and the values of the records."""
    from kio.schema.fetch.v12 import request as fr

    async def fetch_all():
        host, port = bootstrap.rsplit(":", 1)
        found, values, offset = {}, [], 0
        async with open_connection(host, int(port)) as conn:
            while True:
                answer = await conn.request(fr.FetchRequest(
                    replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
                    isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
                    topics=(fr.FetchTopic(topic=TOPIC, partitions=(fr.FetchPartition(
                        partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                        log_start_offset=-1, partition_max_bytes=1 << 20),)),)))
                p = answer.responses[0].partitions[0]
                assert p.error_code == ErrorCode.none, p
                data = bytes(p.records or b"")
                batches = list(iter_batch_headers(data))
                for position, header in batches:
                    if header.is_control:
                        marker = read_txn_marker(data, position) if header.records_count else None
                        if marker is not None:
                            found[header.base_offset] = marker[0] == 1
                    else:
                        values.extend(r.value for r in iter_records(data, position))
                if not batches:
                    return found, values
                offset = batches[-1][1].next_offset
                if offset >= p.high_watermark:
                    return found, values

    return trio.run(fetch_all)


def markers(bootstrap: str) -> dict[int, bool]:
    return scan(bootstrap)[0]


def newest(records) -> dict[bytes, bytes]:
    return {k: v for _o, k, v in records}


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.3)


def test_compaction_removes_aborted_records_and_then_the_markers(tmp_path) -> None:
    data_dir = tmp_path / "dev"
    node = DevNode(data_dir, *NODE_SETTINGS)
    stop = threading.Event()
    try:
        bootstrap = node.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "1024",
            "delete.retention.ms": str(DELETE_RETENTION_MS)})], operation_timeout=30)[TOPIC].result(60)
        txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ledger-writer", "linger.ms": 2})
        txn.init_transactions(30)
        plain = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
        t1 = {b"a%d" % i: b"committed-1-%d" % i for i in range(5)}
        t3 = {b"b%d" % i: b"committed-3-%d" % i for i in range(5)}
        transaction(txn, t1, True)
        transaction(txn, {k: b"aborted-2" for k in t1}, False)
        transaction(txn, t3, True)
        transaction(txn, {k: b"aborted-4" for k in t3}, False)
        overwrite = {k: b"plain-%s" % k for k in t1}  # no record of transaction 1 will be left
        for key, value in overwrite.items():
            plain.produce(TOPIC, key=key, value=value, partition=0)
        plain.flush(30)
        t5 = {b"c%d" % i: b"committed-5-%d" % i for i in range(3)}
        transaction(txn, t5, True)  # the producer's last batch: kept, and so its marker
        # The coordinator answers EndTxn before the markers are written.
        written = wait_for(lambda: len(m := markers(bootstrap)) == 5 and m, 10, "five markers were not written")
        assert list(written.values()) == [True, False, True, False, True]
        t1_marker, t2_marker, t3_marker, t4_marker, t5_marker = written
        written_at = time.monotonic()

        def filler():
            # A live topic: plain writes over a few keys keep closing
            # segments, so the cleaner keeps making passes.
            i = 0
            while not stop.is_set():
                plain.produce(TOPIC, key=b"f%d" % (i % 8), value=b"filler-%06d" % i, partition=0)
                plain.flush(10)
                i += 1
                time.sleep(0.02)

        writer = threading.Thread(target=filler, daemon=True)
        writer.start()

        wait_for(lambda: not any(v.startswith(b"aborted") for v in scan(bootstrap)[1]), 30,
                 "the aborted records were not compacted away")
        # Removed only after delete.retention.ms: the markers of the
        # transactions with no record left (1, 2, 4).
        assert time.monotonic() - written_at < DELETE_RETENTION_MS / 1000 or \
            set(markers(bootstrap)) >= {t3_marker, t5_marker}
        left = wait_for(lambda: (m := markers(bootstrap)) and t1_marker not in m and t2_marker not in m
                        and t4_marker not in m and m, DELETE_RETENTION_MS / 1000 + 30,
                        "the markers of transactions with no record left stayed")
        assert time.monotonic() - written_at >= DELETE_RETENTION_MS / 1000, "markers went before delete.retention.ms"
        # Transactions 3 and 5 still have records: their markers stay.
        assert {t3_marker, t5_marker} <= set(left)
        stop.set()
        writer.join(30)

        committed = read_all(bootstrap, "read_committed")
        uncommitted = read_all(bootstrap, "read_uncommitted")
        for read in (committed, uncommitted):
            table = newest(read)
            assert {k: table[k] for k in overwrite} == overwrite
            assert {k: table[k] for k in t3} == t3
            assert {k: table[k] for k in t5} == t5
            assert not any(v.startswith(b"aborted") for _o, _k, v in read)
        # The same newest value of every key (the cleaner may have been over
        # the filler records between the two reads).
        assert newest(committed) == newest(uncommitted)
    finally:
        stop.set()
        node.stop()
