"""A group's coordinator partition is Kafka's: `Utils.abs(groupId.hashCode()) % n`.

The expected hash codes were computed by a real JVM (`String.hashCode()` on
OpenJDK 17), so a raftka cluster and a Kafka cluster put every group on
the same `__consumer_offsets` partition.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.group import java_string_hash_code, kafka_abs, offsets_topic_configs, partition_for_group

# (string, String.hashCode(), partition with 50 partitions, with 7) from Java.
JAVA = [
    ("", 0, 0, 0),
    ("a", 97, 47, 6),
    ("group", 98629247, 47, 3),
    ("my-group", -1906497762, 12, 1),
    ("hello", 99162322, 22, 0),
    ("Hello World", -862545276, 26, 5),
    ("polygenelubricants", -2147483648, 0, 0),  # Integer.MIN_VALUE: Utils.abs gives 0
    ("Aa", 2112, 12, 5),
    ("BB", 2112, 12, 5),
    ("grüppe", -1233264812, 12, 3),
    ("群组", 1045408, 8, 0),
    ("\U0001F600", 1772899, 49, 2),  # one code point, two UTF-16 units
    ("g\U0001F600x", 58028462, 12, 2),
    ("consumer-group-\U0001F389", 278778066, 16, 0),
    ("\uffff\uffff\uffff", 65076255, 5, 6),
    ("test-group-42", -559024281, 31, 4),
]


@pytest.mark.parametrize(("text", "java_hash", "p50", "p7"), JAVA, ids=[repr(j[0]) for j in JAVA])
def test_hash_and_partition_match_java(text: str, java_hash: int, p50: int, p7: int) -> None:
    assert java_string_hash_code(text) == java_hash
    assert partition_for_group(text, 50) == p50
    assert partition_for_group(text, 7) == p7


def test_kafka_abs_maps_integer_min_value_to_zero_not_to_itself() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5
    assert kafka_abs(2**31 - 1) == 2**31 - 1


def test_a_lone_surrogate_counts_as_its_own_code_unit() -> None:
    # Java strings may hold unpaired surrogates; Python str can too.
    assert java_string_hash_code("\ud83d") == 0xD83D
    assert java_string_hash_code("\ud83d\ude00") == java_string_hash_code("\U0001F600")


@given(st.text(max_size=40), st.integers(min_value=1, max_value=200))
def test_partition_is_in_range_and_hash_is_an_int32(text: str, n: int) -> None:
    h = java_string_hash_code(text)
    assert -(2**31) <= h < 2**31
    assert 0 <= partition_for_group(text, n) < n


def test_offsets_topic_is_compacted() -> None:
    configs = offsets_topic_configs()
    assert configs["cleanup.policy"] == "compact"
    assert configs["segment.bytes"] == str(100 * 1024 * 1024)
