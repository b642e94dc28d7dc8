"""The options of the `raftka` Spark data source, named as in Spark's Kafka source.

| option | meaning | default |
|---|---|---|
| `bootstrap.servers` or `kafka.bootstrap.servers` | where the cluster is | required |
| `subscribe` | topic, or comma-separated topics | required |
| `startingOffsets` | `earliest`, `latest` or JSON `{"t":{"0":5,"1":-2}}` | batch `earliest`, stream `latest` |
| `endingOffsets` | `latest` or JSON (batch only) | `latest` |
| `maxOffsetsPerTrigger` | offsets per micro-batch, over all partitions | no limit |
| `pollTimeoutMs` | how long a task waits for records it was promised | 120000 |
| `kafka.<key>` | any librdkafka consumer setting, e.g. `kafka.isolation.level` | |

Spark hands options over case-insensitively, so keys are compared
lower-cased. The `kafka.` keys go to the consumer as they are; the source
sets those it needs to read exact ranges and never commit (see
`consumer_config`), and refuses overrides of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from bench.spark_source.offsets import OffsetSpec, SparkSourceError, parse_offset_spec

DEFAULT_POLL_TIMEOUT_MS = 120_000
# librdkafka insists on a group id; with assign() and no commits the group
# is never joined, so any name will do.
UNUSED_GROUP_ID = "raftka-spark-source"

# What exact-range reading relies on: the source, not a group, owns the
# offsets (they live in Spark's checkpoint), and an offset that is no longer
# on the broker must fail the task, not be skipped past.
_FIXED_CONSUMER_CONFIG = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
}
_UNSUPPORTED = {
    "assign": "list the partitions' offsets in startingOffsets instead",
    "subscribepattern": "name the topics in subscribe",
    "startingoffsetsbytimestamp": "give offsets in startingOffsets",
    "failondataloss": "the source always fails on data loss",
}


@dataclass(frozen=True)
class SourceOptions:
    topics: tuple[str, ...]
    consumer_config: tuple[tuple[str, str | bool], ...]
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    max_offsets_per_trigger: int | None
    poll_timeout_ms: int

    def consumer(self) -> dict[str, str | bool]:
        """The librdkafka configuration for a reading or listing consumer."""
        return dict(self.consumer_config)


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    for key, fix in _UNSUPPORTED.items():
        if key in opts:
            raise SparkSourceError(f"option {key} is not supported by the raftka source; {fix}")

    bootstrap = opts.get("kafka.bootstrap.servers") or opts.get("bootstrap.servers")
    if not bootstrap:
        raise SparkSourceError("option bootstrap.servers (or kafka.bootstrap.servers) is required, "
                               "e.g. .option('bootstrap.servers', '127.0.0.1:9092')")
    topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
    if not topics:
        raise SparkSourceError("option subscribe is required: the topic to read (or several, comma-separated)")
    if len(set(topics)) != len(topics):
        raise SparkSourceError(f"option subscribe lists a topic twice: {opts['subscribe']!r}")

    config = consumer_config(bootstrap, {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")})

    starting = parse_offset_spec(opts.get("startingoffsets", "latest" if streaming else "earliest"),
                                 "startingOffsets", topics)
    if "endingoffsets" in opts and streaming:
        raise SparkSourceError("endingOffsets only applies to batch reads (spark.read); "
                               "a streaming query runs until stopped, or use trigger(availableNow=True)")
    ending = parse_offset_spec(opts.get("endingoffsets", "latest"), "endingOffsets", topics)
    # As Spark's Kafka source: in a batch read these are always mistakes.
    if not streaming and (starting.kind == "latest" or any(o == -1 for _, o in starting.specific)):
        raise SparkSourceError("startingOffsets 'latest' (-1) would read nothing in a batch read; "
                               "use 'earliest' or specific offsets")
    if ending.kind == "earliest" or any(o == -2 for _, o in ending.specific):
        raise SparkSourceError("endingOffsets 'earliest' (-2) would read nothing; use 'latest' or specific offsets")

    return SourceOptions(
        topics=topics,
        consumer_config=tuple(sorted(config.items())),
        starting_offsets=starting,
        ending_offsets=ending,
        max_offsets_per_trigger=_positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        poll_timeout_ms=_positive_int(opts, "polltimeoutms", "pollTimeoutMs") or DEFAULT_POLL_TIMEOUT_MS,
    )


def consumer_config(bootstrap: str, user: Mapping[str, str]) -> dict[str, str | bool]:
    for key in user:
        if key in _FIXED_CONSUMER_CONFIG:
            raise SparkSourceError(f"option kafka.{key} cannot be set: the source reads exact offset "
                                   f"ranges and sets {key}={_FIXED_CONSUMER_CONFIG[key]} itself")
    config: dict[str, str | bool] = {"group.id": UNUSED_GROUP_ID, **user, **_FIXED_CONSUMER_CONFIG}
    config["bootstrap.servers"] = bootstrap
    return config


def _positive_int(opts: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in opts:
        return None
    try:
        value = int(opts[key])
    except ValueError:
        value = 0
    if value <= 0:
        raise SparkSourceError(f"option {name} must be a positive integer, got {opts[key]!r}")
    return value
