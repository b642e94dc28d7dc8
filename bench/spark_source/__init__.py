"""`raftka`: a Spark Python data source that reads topics from a running raftka cluster.

    from bench.spark_source import register
    register(spark)                       # spark.dataSource.register(RaftkaDataSource)

    df = (spark.read.format("raftka")
          .option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events")
          .load())                          # earliest..latest, one Spark partition per topic partition

    query = (spark.readStream.format("raftka")
             .option("bootstrap.servers", "127.0.0.1:9092")
             .option("subscribe", "events")
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 100000)
             .load()
             .writeStream.format("parquet").option("path", "out")
             .option("checkpointLocation", "ckpt")
             .trigger(availableNow=True).start())

Rows have Spark's Kafka source schema plus headers always on (see
`rows.py`); options are Spark's Kafka source names (see `options.py`).

Theory of operation
-------------------
The driver lists each partition's bounds with ListOffsets and plans one
offset range `[start, end)` per topic partition (`offsets.py`, pure). Each
Spark task reads its range with its own confluent-kafka consumer, assigned
to the range's start offset, never committing (`kafka_io.py`), and hands
Spark Arrow batches. A streaming query keeps its position in Spark's
checkpoint as Spark's Kafka offset JSON `{"topic": {"0": 123}}`; each
micro-batch reads from the previous end to the latest offsets, capped by
`maxOffsetsPerTrigger` (shared by lag across partitions) and, under
`trigger(availableNow=True)`, by the offsets latest when the query started.
So a query restarted from its checkpoint reads every offset exactly once.

Like everything Spark in raftka, this lives under `bench/`: only `bench/`
imports pyspark.
"""

from bench.spark_source.offsets import SparkSourceError
from bench.spark_source.source import RaftkaDataSource

__all__ = ["RaftkaDataSource", "SparkSourceError", "register"]


def register(spark) -> None:
    """Make `format("raftka")` known to this SparkSession."""
    spark.dataSource.register(RaftkaDataSource)
