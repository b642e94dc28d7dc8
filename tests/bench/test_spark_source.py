"""The `raftka` Spark data source against a real `raftka dev` node: a batch
read returns exactly the topic's records; an AvailableNow stream restarted
from its checkpoint delivers every offset once, in several micro-batches."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.spark_source import register

READY_TIMEOUT_S = 60
BASE_TS_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("raftka-dev")
    process = subprocess.Popen([sys.executable, "-m", "raftka.cli", "dev", "--data-dir", str(data_dir), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield _ready_bootstrap(process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready_bootstrap(process: subprocess.Popen) -> str:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            assert process.poll() is None, f"raftka dev exited with {process.returncode} before READY"
            continue
        if line.startswith("READY bootstrap="):
            return line.strip().split("=", 1)[1]
    raise AssertionError(f"raftka dev printed no READY line within {READY_TIMEOUT_S} s")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer is in
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, counts: dict[int, int], tag: str) -> set[tuple]:
    """Produce counts[p] records to each partition p; return the rows a reader
    must see: (key, value, topic, partition, offset, timestamp ms, timestampType, headers)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    sent: list[tuple] = []

    def delivered(headers):
        def report(err, msg):
            assert err is None, err
            sent.append((msg.key(), msg.value(), msg.topic(), msg.partition(), msg.offset(),
                         msg.timestamp()[1], 0, tuple(headers)))
        return report

    n = 0
    for partition, count in counts.items():
        for i in range(count):
            n += 1
            # Every shape a record can have: no key, no value, no headers,
            # repeated header keys, a header without a value.
            key = None if i % 5 == 4 else f"{tag}-k{partition}-{i}".encode()
            value = None if i % 7 == 6 else f"{tag}-v{i}".encode() * (1 + i % 3)
            headers = [("seq", str(i).encode()), ("tag", tag.encode()), ("seq", None)][: i % 4]
            producer.produce(topic, key=key, value=value, partition=partition, headers=headers or None,
                             timestamp=BASE_TS_MS + n * 1000, on_delivery=delivered(headers))
    assert producer.flush(30) == 0
    assert len(sent) == n
    return set(sent)


def as_tuples(df) -> list[tuple]:
    from pyspark.sql import functions as F

    rows = df.select("key", "value", "topic", "partition", "offset", F.unix_millis("timestamp").alias("ts"),
                     "timestampType", "headers").collect()
    return [(r.key, r.value, r.topic, r.partition, r.offset, r.ts, r.timestampType,
             tuple((h.key, h.value) for h in r.headers)) for r in rows]


def reader(spark, bootstrap, topic, **options):
    register(spark)
    read = spark.read.format("raftka").option("bootstrap.servers", bootstrap).option("subscribe", topic)
    for key, value in options.items():
        read = read.option(key, value)
    return read.load()


@pytest.fixture(scope="module")
def events(bootstrap):
    """A 4-partition topic with known content; partition 3 stays empty."""
    create_topic(bootstrap, "events", 4)
    return produce(bootstrap, "events", {0: 25, 1: 40, 2: 7}, "e")


def test_batch_read_returns_exactly_the_topics_records(spark, bootstrap, events):
    df = reader(spark, bootstrap, "events")
    got = as_tuples(df)
    assert len(got) == len(set(got)) == 72
    assert set(got) == events
    # One Spark partition per topic partition with records (the empty one plans none).
    assert df.rdd.getNumPartitions() == 3


def test_batch_read_between_given_offsets(spark, bootstrap, events):
    df = reader(spark, bootstrap, "events",
                startingOffsets=json.dumps({"events": {"0": 5, "1": -2, "2": 7, "3": -2}}),
                endingOffsets=json.dumps({"events": {"0": 12, "1": 3, "2": -1, "3": -1}}))
    expected = {row for row in events if (row[3] == 0 and 5 <= row[4] < 12) or (row[3] == 1 and row[4] < 3)}
    got = as_tuples(df)
    assert len(got) == len(expected) == 10 and set(got) == expected


def test_batch_read_of_a_missing_topic_says_so(spark, bootstrap):
    with pytest.raises(Exception, match="topic nope cannot be read"):
        reader(spark, bootstrap, "nope").collect()


def test_available_now_stream_restarted_from_its_checkpoint_has_no_duplicates_and_no_gaps(
        spark, bootstrap, tmp_path):
    create_topic(bootstrap, "stream", 3)
    expected = produce(bootstrap, "stream", {0: 20, 1: 7, 2: 3}, "first")
    limit = 8
    checkpoint = str(tmp_path / "checkpoint")
    batches: list[tuple[int, list[tuple]]] = []

    def sink(df, batch_id):
        batches.append((batch_id, as_tuples(df)))
        if batch_id == 0:
            # Records that arrive while an AvailableNow query runs are left for the next run.
            expected.update(produce(bootstrap, "stream", {0: 4, 1: 9, 2: 2}, "second"))

    def run() -> list[tuple[int, list[tuple]]]:
        before = len(batches)
        register(spark)
        stream = (spark.readStream.format("raftka").option("bootstrap.servers", bootstrap)
                  .option("subscribe", "stream").option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", limit).load())
        query = (stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(60), "the AvailableNow query did not finish"
        assert query.exception() is None
        return batches[before:]

    first = run()
    # The limit is met exactly: ceil(30 / 8) micro-batches, all but the last full.
    assert [len(rows) for _, rows in first] == [8, 8, 8, 6]
    assert len(expected) == 45
    second = run()  # startingOffsets=earliest is ignored: the checkpoint says where to go on
    assert [len(rows) for _, rows in second] == [8, 7]
    assert [batch_id for batch_id, _ in first + second] == list(range(6))

    assert run() == []  # nothing new: no micro-batch at all

    rows = [row for _, batch in batches for row in batch]
    assert len(rows) == len(set(rows)), "a record was delivered twice"
    assert set(rows) == expected
    for partition, end in {0: 24, 1: 16, 2: 5}.items():
        assert sorted(r[4] for r in rows if r[3] == partition) == list(range(end)), f"gap in partition {partition}"
