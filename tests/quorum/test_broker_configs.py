"""Broker keys as topic-config defaults: Kafka's precedence between time units,
and which broker keys may change at runtime."""

import logging

import pytest

from common.config import NodeConfig, warn_unread_keys
from quorum.metadata.broker_configs import broker_config_error, topic_defaults

HOUR_MS, MINUTE_MS = 3_600_000, 60_000


@pytest.mark.parametrize("props,retention_ms", [
    ({}, None),
    ({"log.retention.hours": "24"}, str(24 * HOUR_MS)),
    ({"log.retention.hours": "24", "log.retention.minutes": "30"}, str(30 * MINUTE_MS)),
    ({"log.retention.hours": "24", "log.retention.minutes": "30", "log.retention.ms": "5"}, "5"),
    ({"log.retention.hours": "-1"}, "-1"),
])
def test_retention_units_take_kafkas_precedence(props, retention_ms):
    assert topic_defaults(props).get("retention.ms") == retention_ms


def test_roll_hours_and_synonyms():
    assert topic_defaults({"log.roll.hours": "2", "message.max.bytes": "10"}) == {
        "segment.ms": str(2 * HOUR_MS), "max.message.bytes": "10"}


def test_only_reconfigurable_keys_are_dynamic():
    assert broker_config_error("log.retention.ms", "1000") is None
    assert broker_config_error("log.cleanup.policy", "") is None
    assert "must be at least" in broker_config_error("log.segment.bytes", "1")
    assert "num.io.threads" in broker_config_error("num.io.threads", "3")


def test_unread_keys_are_warned_once_each(caplog):
    config = NodeConfig.from_properties({"node.id": "1", "process.roles": "broker,controller", "log.dirs": "/x",
                                         "controller.quorum.voters": "1@127.0.0.1:9093",
                                         "listeners": "PLAINTEXT://127.0.0.1:9092", "log.retention.typo": "1",
                                         "log.level.broker": "DEBUG"})
    with caplog.at_level(logging.WARNING):
        assert warn_unread_keys(config.raw) == ["log.retention.typo"]
        assert warn_unread_keys(config.raw) == []
    assert [r.getMessage().split()[2] for r in caplog.records] == ["log.retention.typo=1"]
