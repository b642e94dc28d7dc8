"""The Spark classes of the `raftka` data source: thin wiring of `offsets` and `kafka_io`.

Where each piece runs: `RaftkaDataSource` is pickled to Python workers.
`partitions()` of the batch reader and every method of the stream reader
but `read()` run on the driver side (the stream reader lives in one
long-running worker for the whole query, so the `Trigger.AvailableNow`
target it records stays put); `read()` runs in an executor's Python worker,
once per range.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from bench.spark_source import kafka_io, rows
from bench.spark_source.offsets import (
    OffsetRange,
    Offsets,
    SparkSourceError,
    decode_offsets,
    encode_offsets,
    next_end_offsets,
    plan_ranges,
    resolve,
)
from bench.spark_source.options import SourceOptions, parse_options


class RaftkaDataSource(DataSource):
    """`spark.read.format("raftka")` / `spark.readStream.format("raftka")`: a topic's records as rows."""

    @classmethod
    def name(cls) -> str:
        return "raftka"

    def schema(self):
        return rows.spark_schema()

    def reader(self, schema) -> DataSourceReader:
        return RaftkaBatchReader(parse_options(self.options, streaming=False), _fixed_schema(schema))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return RaftkaStreamReader(parse_options(self.options, streaming=True), _fixed_schema(schema))


def _fixed_schema(schema):
    expected = rows.spark_schema()
    if schema != expected:
        raise SparkSourceError(f"the raftka source has a fixed schema ({rows.SCHEMA_DDL}); "
                               f"do not pass .schema(...) to it (got {schema.simpleString()})")
    return schema


class RangePartition(InputPartition):
    """One Spark partition: one topic partition's offset range."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


def _read(options: SourceOptions, schema, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    # Spark plans one placeholder partition when a batch read has no range.
    if not isinstance(partition, RangePartition):
        return
    rng = partition.range
    arrow = rows.arrow_schema(schema)
    for records in kafka_io.read_range(options.consumer(), rng, options.poll_timeout_ms):
        yield rows.record_batch(rng.topic, rng.partition, records, arrow)


class RaftkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        bounds = kafka_io.list_bounds(self.options.consumer(), self.options.topics)
        start = resolve(self.options.starting_offsets, bounds, "startingOffsets")
        end = resolve(self.options.ending_offsets, bounds, "endingOffsets")
        return [RangePartition(rng) for rng in plan_ranges(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.schema, partition)


class RaftkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are Spark's Kafka offset JSON. Spark's checkpoint, not a consumer group, remembers them."""

    def __init__(self, options: SourceOptions, schema) -> None:
        self.options = options
        self.schema = schema
        self.target: Offsets | None = None

    def _latest(self) -> dict:
        return kafka_io.list_bounds(self.options.consumer(), self.options.topics)

    def initialOffset(self) -> dict:
        return encode_offsets(resolve(self.options.starting_offsets, self._latest(), "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {tp: b.latest_offset for tp, b in self._latest().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return encode_offsets(next_end_offsets(decode_offsets(start), self._latest(), max_rows, self.target))

    def reportLatestOffset(self) -> dict:
        return encode_offsets({tp: b.latest_offset for tp, b in self._latest().items()})

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, until = decode_offsets(start), decode_offsets(end)
        new = set(until) - set(begin)
        if new:
            # Partitions created after `start` are read from their beginning.
            bounds = self._latest()
            begin.update({tp: bounds[tp].log_start_offset if tp in bounds else 0 for tp in new})
        return [RangePartition(rng) for rng in plan_ranges(begin, until)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: no consumer group is involved, and the broker keeps no read state."""
