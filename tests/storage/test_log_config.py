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


def test_a_reconfigured_log_applies_the_new_limits_to_the_next_append():
    """`Log.reconfigure` (AlterConfigs on a live topic): the next append is
    held to the new max.message.bytes and rolls at the new segment.bytes."""
    from storage.batch import build_batch
    from storage.errors import RecordTooLargeError
    from storage.log import Log
    from storage.sim_fs import SimFileSystem

    log = Log.open("/d/t-0", LogConfig(max_message_bytes=500), fs=SimFileSystem(), now_ms=0)
    big = build_batch([(b"k", b"v" * 1000, (), 0)])
    with pytest.raises(RecordTooLargeError):
        log.append(big, now_ms=0)
    log.reconfigure(LogConfig(max_message_bytes=5000, segment_bytes=len(big) + 10))
    assert log.append(big, now_ms=0) == 0
    assert log.append(big, now_ms=0) == 1
    assert [s.base_offset for s in log.segments] == [0, 1]  # the second append rolled
    log.close()
