"""The coordinator reads Kafka's key names, with Kafka's defaults."""

from __future__ import annotations

import pytest

from broker.core.group import GroupCoordinatorConfig
from common.errors import ConfigError


def test_defaults_are_kafkas() -> None:
    config = GroupCoordinatorConfig.from_properties({})
    assert config.group_initial_rebalance_delay_ms == 3000
    assert config.offsets_retention_ms == 7 * 24 * 3600 * 1000
    assert config.offsets_topic_num_partitions == 50
    assert config.offsets_topic_replication_factor == 3
    assert (config.group_min_session_timeout_ms, config.group_max_session_timeout_ms) == (6000, 1_800_000)


def test_properties_override_with_kafka_names() -> None:
    config = GroupCoordinatorConfig.from_properties({
        "group.initial.rebalance.delay.ms": "0",
        "offsets.retention.minutes": "2",
        "offsets.topic.num.partitions": "3",
        "offsets.topic.replication.factor": "1",
        "group.max.size": "10",
        "log.dirs": "/ignored/belongs/to/storage",
    })
    assert config.group_initial_rebalance_delay_ms == 0
    assert config.offsets_retention_ms == 120_000
    assert config.offsets_topic_num_partitions == 3
    assert config.offsets_topic_replication_factor == 1
    assert config.group_max_size == 10


@pytest.mark.parametrize(("props", "key"), [
    ({"offsets.topic.num.partitions": "0"}, "offsets.topic.num.partitions"),
    ({"offsets.retention.minutes": "soon"}, "offsets.retention.minutes"),
    ({"group.min.session.timeout.ms": "9000", "group.max.session.timeout.ms": "8000"},
     "group.min.session.timeout.ms"),
])
def test_bad_values_name_the_key(props: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        GroupCoordinatorConfig.from_properties(props)
