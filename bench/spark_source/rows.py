"""Rows of the `raftka` source: Spark's Kafka source schema, built as Arrow batches.

A task hands Spark `pyarrow.RecordBatch`es, not Python tuples: Spark's
per-value tuple conversion would cost more than fetching the records.

| column | type | |
|---|---|---|
| key, value | binary | null when the record has none |
| topic | string | |
| partition | int | |
| offset | bigint | |
| timestamp | timestamp (UTC) | null when the record carries none |
| timestampType | int | Kafka's ids: 0 CreateTime, 1 LogAppendTime, -1 none |
| headers | array<struct<key:string,value:binary>> | in record order; empty, not null, when none |
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message

SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)

# librdkafka's timestamp type constants -> Kafka's `TimestampType.id`, as
# Spark's Kafka source reports them.
_KAFKA_TIMESTAMP_TYPE = {TIMESTAMP_NOT_AVAILABLE: -1, TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}

def spark_schema():
    """The source's Spark schema (a StructType)."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                                   StructType, TimestampType)

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType([
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("headers", ArrayType(header)),
    ])


def arrow_schema(schema) -> pa.Schema:
    """The Arrow schema Spark expects back for `schema`: Spark checks batches against it exactly."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def record_batch(topic: str, partition: int, messages: Sequence[Message], schema: pa.Schema) -> pa.RecordBatch:
    """The records (confluent-kafka `Message`s without error) of one partition as Spark rows."""
    n = len(messages)
    stamps = [m.timestamp() for m in messages]
    headers = [m.headers() for m in messages]
    header_offsets, header_keys, header_values = [0] * (n + 1), [], []
    if any(headers):
        for i, record_headers in enumerate(headers):
            for header_key, header_value in record_headers or ():
                header_keys.append(header_key)
                header_values.append(header_value)
            header_offsets[i + 1] = len(header_keys)

    def column(name: str, data: list) -> pa.Array:
        return pa.array(data, schema.field(name).type)

    headers_type = schema.field("headers").type
    header_struct = pa.StructArray.from_arrays(
        [pa.array(header_keys, headers_type.value_type.field("key").type),
         pa.array(header_values, headers_type.value_type.field("value").type)],
        fields=list(headers_type.value_type))
    columns = [
        column("key", [m.key() for m in messages]),
        column("value", [m.value() for m in messages]),
        column("topic", [topic] * n),
        column("partition", [partition] * n),
        column("offset", [m.offset() for m in messages]),
        column("timestamp", [None if kind == TIMESTAMP_NOT_AVAILABLE else ms * 1000 for kind, ms in stamps]),
        column("timestampType", [_KAFKA_TIMESTAMP_TYPE[kind] for kind, _ in stamps]),
        _list_array(header_offsets, header_struct, headers_type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _list_array(offsets: list[int], values: pa.Array, list_type: pa.DataType) -> pa.Array:
    if pa.types.is_large_list(list_type):
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, type=list_type)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=list_type)
