"""The `raftka` source's I/O shell: confluent-kafka against the cluster.

- `list_bounds` (on the driver): the topics' partitions from Metadata, then
  one ListOffsets round for EARLIEST and one for LATEST over all of them.
  LATEST is asked at the consumer's `isolation.level`, so the driver plans
  up to exactly the offset the tasks can fetch to (HW, or LSO under
  read_committed, librdkafka's default).
- `read_range` (in a Python worker, one per Spark task): a consumer that
  `assign()`s one partition at the range's start offset and never commits.
  It yields the records of `[start_offset, end_offset)` and stops at the
  end offset, not at the log end. Offsets inside the range may have no
  record (compaction, transaction markers); the partition-EOF event, at an
  offset at or past the end, says the range is done all the same.
"""

from __future__ import annotations

import time
from typing import Iterator, Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from bench.spark_source.offsets import OffsetRange, PartitionBounds, SparkSourceError

LIST_TIMEOUT_S = 30.0
# How long one consume() call blocks; the range's own deadline is pollTimeoutMs.
CONSUME_WAIT_S = 0.2
BATCH_RECORDS = 10_000
BATCH_BYTES = 8 << 20

# Client-level events librdkafka recovers from by itself (a broker down, a
# leader moving); a read waits through them up to pollTimeoutMs.
_PASSING_ERRORS = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                   KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                   KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH}

# Consumer-only keys an AdminClient would warn about.
_CONSUMER_ONLY = {"group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
                  "enable.partition.eof", "isolation.level"}


def list_bounds(config: Mapping[str, str | bool], topics: tuple[str, ...]) -> dict[tuple[str, int], PartitionBounds]:
    bootstrap = config["bootstrap.servers"]
    consumer = Consumer(dict(config))
    try:
        partitions: list[TopicPartition] = []
        for topic in topics:
            try:
                metadata = consumer.list_topics(topic, timeout=LIST_TIMEOUT_S).topics[topic]
            except KafkaException as exc:
                raise SparkSourceError(f"cannot read the metadata of topic {topic} from {bootstrap}: {exc}") from None
            if metadata.error is not None:
                raise SparkSourceError(f"topic {topic} cannot be read from {bootstrap}: {metadata.error.str()} "
                                       "(create it first, e.g. `raftka topics create`)")
            partitions += [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
    finally:
        consumer.close()

    admin = AdminClient({k: v for k, v in config.items() if k not in _CONSUMER_ONLY})
    read_committed = str(config.get("isolation.level", "read_committed")).lower() == "read_committed"
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    earliest = _list_offsets(admin, partitions, OffsetSpec.earliest(), isolation, bootstrap)
    latest = _list_offsets(admin, partitions, OffsetSpec.latest(), isolation, bootstrap)
    return {tp: PartitionBounds(earliest[tp], latest[tp]) for tp in earliest}


def _list_offsets(admin: AdminClient, partitions: list[TopicPartition], spec: OffsetSpec,
                  isolation: IsolationLevel, bootstrap: str) -> dict[tuple[str, int], int]:
    futures = admin.list_offsets({tp: spec for tp in partitions}, isolation_level=isolation,
                                 request_timeout=LIST_TIMEOUT_S)
    offsets = {}
    for tp, future in futures.items():
        try:
            offsets[(tp.topic, tp.partition)] = future.result().offset
        except KafkaException as exc:
            raise SparkSourceError(f"ListOffsets for {tp.topic}-{tp.partition} on {bootstrap} failed: {exc}") from None
    return offsets


def read_range(config: Mapping[str, str | bool], rng: OffsetRange, poll_timeout_ms: int) -> Iterator[list[Message]]:
    """Yield the records of `rng` in offset order, in lists of at most BATCH_RECORDS / about BATCH_BYTES."""
    consumer = Consumer(dict(config))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start_offset)])
        reading = RangeReading(rng)
        deadline = time.monotonic() + poll_timeout_ms / 1000
        batch: list[Message] = []
        batch_bytes = 0
        while not reading.done:
            messages = consumer.consume(min(BATCH_RECORDS, rng.end_offset - reading.next_offset), CONSUME_WAIT_S)
            records = reading.accept(messages)
            if records:
                batch += records
                batch_bytes += sum(map(len, records))  # value bytes
                deadline = time.monotonic() + poll_timeout_ms / 1000
            elif not reading.done and time.monotonic() > deadline:
                last = reading.last_error.str() if reading.last_error else "none"
                raise SparkSourceError(
                    f"{rng.topic}-{rng.partition}: no record at or after offset {reading.next_offset} within "
                    f"pollTimeoutMs={poll_timeout_ms}, though the range planned reaches {rng.end_offset}; "
                    f"is the partition's leader up? (last client error: {last}; "
                    "raise pollTimeoutMs for a slow cluster)")
            if batch and (len(batch) >= BATCH_RECORDS or batch_bytes >= BATCH_BYTES or reading.done):
                yield batch
                batch, batch_bytes = [], 0
    finally:
        consumer.close()


class RangeReading:
    """Which consumed messages belong to the range, and whether it is complete."""

    def __init__(self, rng: OffsetRange) -> None:
        self.rng = rng
        self.next_offset = rng.start_offset
        self.last_error: KafkaError | None = None

    @property
    def done(self) -> bool:
        return self.next_offset >= self.rng.end_offset

    def accept(self, messages: list[Message]) -> list[Message]:
        if not messages:
            return []
        last = messages[-1]
        # The common case, checked in bulk: records only, all inside the range.
        if (last.error() is None and last.offset() < self.rng.end_offset
                and all(m.error() is None for m in messages)):
            # Within a partition offsets only go up (docs/architecture.md, invariants).
            assert messages[0].offset() >= self.next_offset, (self.rng, messages[0].offset(), self.next_offset)
            self.next_offset = last.offset() + 1
            return messages
        records = []
        for message in messages:
            error = message.error()
            if error is None:
                if message.offset() >= self.rng.end_offset:
                    self.next_offset = self.rng.end_offset
                    break
                assert message.offset() >= self.next_offset, (self.rng, message.offset(), self.next_offset)
                records.append(message)
                self.next_offset = message.offset() + 1
            elif error.code() == KafkaError._PARTITION_EOF:
                # Past the last record of the range there may be offsets without one.
                if message.offset() >= self.rng.end_offset:
                    self.next_offset = self.rng.end_offset
                    break
            elif error.code() in _PASSING_ERRORS or (error.retriable() and not error.fatal()):
                self.last_error = error  # the client retries; pollTimeoutMs bounds the wait
            else:
                raise SparkSourceError(_read_error(self.rng, self.next_offset, error))
        return records


def _read_error(rng: OffsetRange, offset: int, error: KafkaError) -> str:
    where = f"{rng.topic}-{rng.partition} at offset {offset} (range [{rng.start_offset}, {rng.end_offset}))"
    if error.code() == KafkaError._AUTO_OFFSET_RESET:
        return (f"{where}: the offset is no longer on the broker (retention deleted it, or the log was "
                f"truncated): {error.str()}. Records the read was promised are lost; restart from "
                "startingOffsets='earliest' or a new checkpoint")
    return f"{where}: {error.str()}"
