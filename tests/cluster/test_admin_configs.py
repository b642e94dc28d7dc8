"""Broker and topic configs through the admin APIs of real clients, against `raftka dev`:
KIP-226 sources and precedence, dynamic broker configs applied without a
restart, AlterConfigs, the unknown-key warning, and ListGroups' state filter."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewTopic, ResourceType)
from kafka import KafkaAdminClient
from kafka.protocol.consumer.offsets import OffsetSpec
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpType

from cluster_testing import ReadyLine, raftka_command, run_cli
from common.wire.ports import free_ports


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    data = tmp_path_factory.mktemp("dev")
    port, controller_port = free_ports(2)
    stderr_path = data / "stderr"
    with open(stderr_path, "w") as err:
        process = subprocess.Popen(
            raftka_command("dev", "--data-dir", str(data / "node"), "--port", str(port),
                           "--controller-port", str(controller_port),
                           "--set", "log.retention.hours=24", "--set", "log.retention.check.interval.ms=300",
                           "--set", "log.retention.typo=1"),
            stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ReadyLine(process).wait("READY bootstrap=", 120, process)
        yield f"127.0.0.1:{port}", stderr_path
    finally:
        process.terminate()
        process.wait(60)


def _confluent(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(admin, topic, config=None):
    admin.create_topics([NewTopic(topic, 1, 1, config=config or {})])[topic].result()


def test_unknown_config_key_is_warned_once_by_name(dev):
    _bootstrap, stderr_path = dev
    lines = [line for line in stderr_path.read_text().splitlines() if "log.retention.typo" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "not a known configuration" in lines[0]
    assert "log.retention.hours" not in stderr_path.read_text()


def test_broker_config_sources_follow_kafka_precedence(dev):
    bootstrap, _ = dev
    admin = _confluent(bootstrap)
    broker = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([broker])[broker].result()
    assert (configs["log.retention.hours"].value, configs["log.retention.hours"].source) == \
        ("24", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert configs["log.retention.ms"].value is None
    assert configs["node.id"].is_read_only

    # The cluster-wide default (resource "", which neither client library
    # can name) through `raftka configs`, then this broker's own value
    # through confluent-kafka: the broker's wins.
    out = run_cli("configs", "alter", "-b", bootstrap, "--entity-type", "brokers", "--entity-default",
                  "--add-config", "log.cleaner.delete.retention.ms=7000")
    assert out.returncode == 0, out.stderr
    out = run_cli("configs", "describe", "-b", bootstrap, "--entity-type", "brokers", "--entity-default")
    assert "log.cleaner.delete.retention.ms=7000 DYNAMIC_DEFAULT_BROKER_CONFIG" in out.stdout, out
    configs = admin.describe_configs([broker])[broker].result()
    assert (configs["log.cleaner.delete.retention.ms"].value, configs["log.cleaner.delete.retention.ms"].source) == \
        ("7000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    mine = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.cleaner.delete.retention.ms", "8000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([mine])[mine].result()
    configs = admin.describe_configs([broker])[broker].result()
    entry = configs["log.cleaner.delete.retention.ms"]
    assert (entry.value, entry.source) == ("8000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)

    # A topic without its own value reports the broker's, with that source.
    _create(admin, "sources")
    topic = ConfigResource(ResourceType.TOPIC, "sources")
    configs = admin.describe_configs([topic])[topic].result()
    assert (configs["delete.retention.ms"].value, configs["delete.retention.ms"].source) == \
        ("8000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == \
        (str(24 * 3600 * 1000), ConfigSource.STATIC_BROKER_CONFIG.value)

    # A key a broker cannot change while running is refused, naming it.
    bad = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("num.io.threads", "3", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception, match="num.io.threads"):
        admin.incremental_alter_configs([bad])[bad].result()


def test_dynamic_retention_applies_without_restart(dev):
    bootstrap, _ = dev
    admin = _confluent(bootstrap)
    # One batch per segment: retention deletes whole segments, never the active one.
    _create(admin, "old-records", {"segment.bytes": "1000"})
    producer = Producer({"bootstrap.servers": bootstrap})
    two_hours_ago_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    for i in range(10):
        producer.produce("old-records", value=b"x" * 600, timestamp=two_hours_ago_ms)
        assert producer.flush(30) == 0

    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        from kafka import TopicPartition
        tp = TopicPartition("old-records", 0)

        def earliest():
            return kp.list_partition_offsets({tp: OffsetSpec.EARLIEST})[tp].offset

        time.sleep(1)
        assert earliest() == 0  # 24 hours (static) keeps them
        out = run_cli("configs", "alter", "-b", bootstrap, "--entity-type", "brokers", "--entity-default",
                      "--add-config", "log.retention.ms=3600000")
        assert out.returncode == 0, out.stderr
        # The change reaches the broker through the metadata log; a loaded machine can take a while.
        deadline = time.monotonic() + 60
        while earliest() != 9 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert earliest() == 9, "a one-hour cluster default retention did not delete two-hour-old segments"
    finally:
        run_cli("configs", "alter", "-b", bootstrap, "--entity-type", "brokers", "--entity-default",
                "--delete-config", "log.retention.ms")
        kp.close()


def test_cleanup_policy_append_and_subtract_as_kafka_4(dev):
    bootstrap, _ = dev
    admin = _confluent(bootstrap)
    _create(admin, "append-me", {"compression.type": "gzip"})
    _create(admin, "subtract-me", {"compression.type": "gzip"})
    one = ConfigResource(ResourceType.TOPIC, "append-me", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    two = ConfigResource(ResourceType.TOPIC, "subtract-me", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    for f in admin.incremental_alter_configs([one, two]).values():
        f.result()
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "append-me"),
                                        ConfigResource(ResourceType.TOPIC, "subtract-me")])
    got = {res.name: f.result()["cleanup.policy"].value for res, f in described.items()}
    assert got == {"append-me": "delete,compact", "subtract-me": ""}


def test_alter_configs_replaces_the_whole_topic_config(dev):
    bootstrap, _ = dev
    admin = _confluent(bootstrap)
    _create(admin, "replaced", {"compression.type": "gzip", "retention.ms": "100000"})
    resource = ConfigResource(ResourceType.TOPIC, "replaced", set_config={"retention.ms": "5000"})
    admin.alter_configs([resource])[resource].result()
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "replaced")])
    configs = next(iter(described.values())).result()
    assert {k: v.value for k, v in configs.items()
            if v.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value} == {"retention.ms": "5000"}

    kp = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        kp.alter_configs([KpConfigResource(KpType.TOPIC, "replaced", configs={"segment.ms": "60000"})],
                         incremental=False)
        modified = kp.describe_configs([KpConfigResource(KpType.TOPIC, "replaced")])["topic"]["replaced"]
        assert modified["segment.ms"]["value"] == "60000"
        # kafka-python sends the other dynamic keys along (AlterConfigs drops
        # any key left out); compression.type was already gone.
        assert modified["retention.ms"]["value"] == "5000" and "compression.type" not in modified
    finally:
        kp.close()


def test_list_groups_state_filter(dev):
    bootstrap, _ = dev
    admin = _confluent(bootstrap)
    _create(admin, "grouped")
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("grouped", b"v")
    producer.flush(30)
    stable = Consumer({"bootstrap.servers": bootstrap, "group.id": "stays", "auto.offset.reset": "earliest"})
    stable.subscribe(["grouped"])
    left = Consumer({"bootstrap.servers": bootstrap, "group.id": "leaves", "auto.offset.reset": "earliest"})
    left.subscribe(["grouped"])
    try:
        for consumer in (stable, left):
            deadline = time.monotonic() + 30
            while consumer.poll(0.5) is None and time.monotonic() < deadline:
                pass
        left.close()
        listed = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.STABLE}).result()
        assert [(g.group_id, g.state) for g in listed.valid] == [("stays", ConsumerGroupState.STABLE)]
        empty = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.EMPTY}).result()
        assert [g.group_id for g in empty.valid] == ["leaves"]
        kp = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            assert [g["group_id"] for g in kp.list_groups(states_filter=["Stable"])] == ["stays"]
        finally:
            kp.close()
    finally:
        stable.close()
