"""The `raftka` Spark source without a cluster or a SparkSession: offset
planning, the micro-batch limit, options, which consumed messages make up
a range, and the Arrow rows."""

import math
import re

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    Message,
)
from hypothesis import given
from hypothesis import strategies as st

from bench.spark_source.kafka_io import RangeReading
from bench.spark_source.offsets import (
    OffsetRange,
    PartitionBounds,
    SparkSourceError,
    decode_offsets,
    encode_offsets,
    next_end_offsets,
    parse_offset_spec,
    plan_ranges,
    rate_limit,
    resolve,
)
from bench.spark_source.options import parse_options

T = ("t",)
BOUNDS = {("t", 0): PartitionBounds(0, 10), ("t", 1): PartitionBounds(3, 3), ("t", 2): PartitionBounds(5, 20)}


def test_offsets_json_is_sparks_kafka_form_in_a_stable_order():
    offsets = {("b", 10): 7, ("a", 2): 1, ("b", 9): 0}
    encoded = encode_offsets(offsets)
    assert list(encoded) == ["a", "b"] and list(encoded["b"]) == ["9", "10"]
    assert encoded == {"a": {"2": 1}, "b": {"9": 0, "10": 7}}
    assert decode_offsets(encoded) == offsets


@pytest.mark.parametrize("text, expected", [
    ("earliest", {("t", 0): 0, ("t", 1): 3, ("t", 2): 5}),
    ("LATEST", {("t", 0): 10, ("t", 1): 3, ("t", 2): 20}),
    ('{"t": {"0": 4, "1": -2, "2": -1}}', {("t", 0): 4, ("t", 1): 3, ("t", 2): 20}),
    ('{"t": {"0": 10, "1": 3, "2": 5}}', {("t", 0): 10, ("t", 1): 3, ("t", 2): 5}),
])
def test_offset_specs_resolve_against_partition_bounds(text, expected):
    assert resolve(parse_offset_spec(text, "startingOffsets", T), BOUNDS, "startingOffsets") == expected


@pytest.mark.parametrize("text, message", [
    ('{"t": {"0": 4, "1": 3}}', "not for t-2"),
    ('{"t": {"0": 4, "1": 3, "2": 5, "7": 0}}', "t-7 that the topic does not have"),
    ('{"t": {"0": 11, "1": 3, "2": 5}}', "outside the readable [0, 10]"),
    ('{"t": {"0": 0, "1": 3, "2": 4}}', "outside the readable [5, 20]"),
    ('{"u": {"0": 0}}', "not in subscribe=t"),
    ('{"t": {"0": -3}}', "-2 (earliest)"),
    ('{"t": {"0": "5"}}', "must be an integer"),
    ("first", "must be 'earliest', 'latest' or JSON"),
])
def test_bad_offset_specs_say_what_is_wrong(text, message):
    with pytest.raises(SparkSourceError, match=re.escape(message)):
        resolve(parse_offset_spec(text, "startingOffsets", ("t",)), BOUNDS, "startingOffsets")


def test_ranges_skip_empty_partitions_and_refuse_backwards_ones():
    start = {("t", 0): 2, ("t", 1): 3, ("t", 2): 5}
    end = {("t", 0): 10, ("t", 1): 3, ("t", 2): 6}
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 2, 10), OffsetRange("t", 2, 5, 6)]
    with pytest.raises(SparkSourceError, match="start offset 7 is after end offset 6"):
        plan_ranges({**start, ("t", 2): 7}, end)


def test_rate_limit_shares_by_lag():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    latest = {("t", 0): 60, ("t", 1): 130, ("t", 2): 15}  # lags 60, 30, 10
    assert rate_limit(start, latest, 10) == {("t", 0): 6, ("t", 1): 103, ("t", 2): 6}
    # Shares 0.6, 0.3, 0.1: Spark's Kafka source would round each up and read 3; exactly 1 here.
    assert rate_limit(start, latest, 1) == {("t", 0): 1, ("t", 1): 100, ("t", 2): 5}
    assert rate_limit(start, latest, 1000) == latest


lags = st.dictionaries(st.tuples(st.sampled_from("ab"), st.integers(0, 7)),
                       st.tuples(st.integers(0, 1000), st.integers(0, 500)), min_size=1, max_size=10)


@given(lags, st.integers(1, 600))
def test_rate_limit_reads_exactly_the_limit_in_proportion(partitions, max_rows):
    start = {tp: s for tp, (s, _) in partitions.items()}
    latest = {tp: s + lag for tp, (s, lag) in partitions.items()}
    total = sum(lag for _, lag in partitions.values())
    end = rate_limit(start, latest, max_rows)
    assert sum(end[tp] - start[tp] for tp in start) == min(max_rows, total)
    for tp in start:
        assert start[tp] <= end[tp] <= latest[tp]
        if total > max_rows:
            exact = max_rows * (latest[tp] - start[tp]) / total
            assert math.floor(exact) <= end[tp] - start[tp] <= math.ceil(exact)


@given(lags, st.integers(1, 300), st.data())
def test_available_now_batches_reach_the_target_and_stop(partitions, max_rows, data):
    """Iterating micro-batches from any start reaches exactly the AvailableNow
    target in ceil(lag / limit) batches, then offers no more (the query ends)."""
    start = {tp: s for tp, (s, _) in partitions.items()}
    bounds = {tp: PartitionBounds(0, s + lag + data.draw(st.integers(0, 50), label="grown since"))
              for tp, (s, lag) in partitions.items()}
    target = {tp: s + lag for tp, (s, lag) in partitions.items()}
    total = sum(target[tp] - start[tp] for tp in start)
    position, batches = dict(start), 0
    while (end := next_end_offsets(position, bounds, max_rows, target)) != position:
        assert all(position[tp] <= end[tp] <= target[tp] for tp in end)
        assert sum(end[tp] - position[tp] for tp in end) <= max_rows
        position, batches = end, batches + 1
    assert position == target
    assert batches == math.ceil(total / max_rows)


def test_new_partitions_start_at_their_log_start_and_vanished_ones_keep_their_offset():
    start = {("t", 0): 4, ("gone", 0): 9}
    bounds = {("t", 0): PartitionBounds(0, 6), ("t", 1): PartitionBounds(2, 5)}
    assert next_end_offsets(start, bounds, None) == {("t", 0): 6, ("t", 1): 5, ("gone", 0): 9}
    # A partition created after the AvailableNow target was taken is not read in this run.
    assert next_end_offsets(start, bounds, None, target={("t", 0): 5}) == {("t", 0): 5, ("gone", 0): 9}


def test_a_log_that_went_backwards_is_data_loss_not_a_skip():
    with pytest.raises(SparkSourceError, match="latest offset is 3 but the query has read up to 8"):
        next_end_offsets({("t", 0): 8}, {("t", 0): PartitionBounds(0, 3)}, 100)


def test_options_use_sparks_kafka_names_case_insensitively():
    opts = parse_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a, b", "MAXOFFSETSPERTRIGGER": "50",
                          "kafka.isolation.level": "read_uncommitted"}, streaming=True)
    assert opts.topics == ("a", "b") and opts.max_offsets_per_trigger == 50
    assert opts.starting_offsets.kind == "latest"  # as Spark: a stream starts at the end by default
    config = opts.consumer()
    assert config["bootstrap.servers"] == "h:1" and config["isolation.level"] == "read_uncommitted"
    assert config["enable.auto.commit"] is False and config["auto.offset.reset"] == "error"
    assert parse_options({"bootstrap.servers": "h:1", "subscribe": "a"}, streaming=False).starting_offsets.kind == "earliest"


@pytest.mark.parametrize("options, streaming, message", [
    ({"subscribe": "a"}, False, "bootstrap.servers .* is required"),
    ({"bootstrap.servers": "h:1"}, False, "subscribe is required"),
    ({"bootstrap.servers": "h:1", "subscribe": "a", "endingOffsets": "latest"}, True, "only applies to batch"),
    ({"bootstrap.servers": "h:1", "subscribe": "a", "startingOffsets": "latest"}, False, "would read nothing"),
    ({"bootstrap.servers": "h:1", "subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "positive integer"),
    ({"bootstrap.servers": "h:1", "subscribe": "a", "kafka.enable.auto.commit": "true"}, True, "cannot be set"),
    ({"bootstrap.servers": "h:1", "subscribePattern": "a.*"}, True, "not supported"),
])
def test_bad_options_name_the_option(options, streaming, message):
    with pytest.raises(SparkSourceError, match=message):
        parse_options(options, streaming=streaming)


def test_rows_are_arrow_batches_in_the_schema_spark_checks():
    from bench.spark_source import rows

    schema = rows.arrow_schema(rows.spark_schema())
    batch = rows.record_batch("t", 2, [
        Message(offset=7, key=b"k", value=b"v", timestamp=(TIMESTAMP_CREATE_TIME, 1_700_000_000_123),
                headers=[("a", b"1"), ("a", None)]),
        Message(offset=9, timestamp=(TIMESTAMP_NOT_AVAILABLE, -1)),
        Message(offset=10, key=b"", value=b"x", timestamp=(TIMESTAMP_LOG_APPEND_TIME, 5), headers=[]),
    ], schema)
    assert batch.schema.equals(schema)
    got = batch.to_pylist()
    assert [(r["key"], r["value"], r["topic"], r["partition"], r["offset"], r["timestampType"]) for r in got] == [
        (b"k", b"v", "t", 2, 7, 0), (None, None, "t", 2, 9, -1), (b"", b"x", "t", 2, 10, 1)]
    assert [r["timestamp"] and int(r["timestamp"].timestamp() * 1000) for r in got] == [1_700_000_000_123, None, 5]
    assert [r["headers"] for r in got] == [[{"key": "a", "value": b"1"}, {"key": "a", "value": None}], [], []]


def record(offset):
    return Message(topic="t", partition=0, offset=offset, value=b"v")


def event(code, offset=-1):
    return Message(topic="t", partition=0, offset=offset, error=KafkaError(code, "from the test"))


@pytest.mark.parametrize("polls, offsets, done", [
    # records up to the end: done without waiting for more
    ([[record(3), record(4)], [record(5)]], [3, 4, 5], True),
    # a gap inside the range (compaction) is fine
    ([[record(3), record(5)]], [3, 5], True),
    # the range's last offsets hold no record: the EOF past them ends it
    ([[record(3)], [event(KafkaError._PARTITION_EOF, 8)]], [3], True),
    # an EOF before the end means the rest is not readable yet: keep polling
    ([[record(3), event(KafkaError._PARTITION_EOF, 4)]], [3], False),
    # prefetched records past the end are not the range's
    ([[record(4), record(5), record(6), record(7)]], [4, 5], True),
    # a broker that went away is waited for (up to pollTimeoutMs)
    ([[event(KafkaError._TRANSPORT)], [record(3)]], [3], False),
])
def test_a_range_read_takes_exactly_its_offsets(polls, offsets, done):
    reading = RangeReading(OffsetRange("t", 0, 3, 6))
    got = [m.offset() for batch in polls for m in reading.accept(batch)]
    assert got == offsets and reading.done is done


def test_a_range_whose_offsets_are_gone_fails_the_task():
    reading = RangeReading(OffsetRange("t", 0, 3, 6))
    with pytest.raises(SparkSourceError, match="t-0 at offset 3 .* no longer on the broker"):
        reading.accept([event(KafkaError._AUTO_OFFSET_RESET, 3)])
