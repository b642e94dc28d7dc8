"""LogConfig: Kafka's key names and defaults, strict parsing."""

import pytest

from common.errors import ConfigError
from storage.config import LogConfig


def test_defaults_are_kafkas():
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.segment_ms == 7 * 24 * 3600 * 1000
    assert c.segment_index_bytes == 10 << 20
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 7 * 24 * 3600 * 1000
    assert c.retention_bytes == -1
    assert c.max_message_bytes == 1048588
    assert c.flush_messages is None and c.flush_ms is None


def test_from_properties_maps_kafka_keys():
    c = LogConfig.from_properties(
        {"segment.bytes": "1048576", "retention.ms": -1, "flush.messages": "1", "index.interval.bytes": 0}
    )
    assert (c.segment_bytes, c.retention_ms, c.flush_messages, c.index_interval_bytes) == (1 << 20, -1, 1, 0)
    assert LogConfig.from_properties(c.to_properties()) == c


@pytest.mark.parametrize(
    "props, message",
    [
        ({"segment.byte": "1"}, "segment.byte is not a log config key; the known keys are"),
        ({"segment.bytes": "1GB"}, "segment.bytes='1GB' is not an integer"),
        ({"segment.bytes": 13}, "segment.bytes=13 is out of range.*from 14"),
        ({"segment.bytes": 1 << 31}, "segment.bytes.*out of range"),
        ({"retention.ms": "-2"}, "retention.ms=-2 is out of range.*-1 keeps forever"),
        ({"flush.messages": 0}, "flush.messages=0 is out of range"),
        ({"max.message.bytes": True}, "max.message.bytes=True is not an integer"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(props, message):
    with pytest.raises(ConfigError, match=message):
        LogConfig.from_properties(props)


def test_direct_construction_is_checked_too():
    with pytest.raises(ConfigError, match="segment.index.bytes"):
        LogConfig(segment_index_bytes=4)
