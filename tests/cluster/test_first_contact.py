"""A client that connects the instant a node's Kafka port accepts is served at once.

A node listens on its Kafka port only once its broker serves (caught up
with the metadata, unfenced, listed in its own image), as Kafka opens its
client listeners. Before that, librdkafka's AdminClient could connect, get
a Metadata answer without a broker or controller in it, and wait out its
whole request timeout (about 40-60 s) before CreateTopics went anywhere.

Each test polls connect() on the port a few ms apart and, the moment it is
accepted, creates a topic with confluent-kafka's AdminClient, produces one
record and reads it back, bootstrapped on that node alone: for `raftka dev`
(a combined node), a broker of a `LocalCluster` (what `raftka cluster up`
runs), a ZooKeeper-mode broker, and each of them again after SIGKILL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cluster_testing import ReadyLine, raftka_command
from quorum.zookeeper.ensemble import zookeeper_missing_reason
from cluster import LocalCluster
from common.wire.ports import free_ports

#: From the accepted connect to the record read back: seconds on a loaded
#: 2-core machine, far below the request timeout a too-early answer cost.
FIRST_CONTACT_S = 10.0
POLL_INTERVAL_S = 0.005
START_TIMEOUT_S = 120.0
FAST_SESSIONS = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "300"}


def wait_accepting(host: str, port: int, running: Callable[[], bool]) -> float:
    """Poll connect() until the port accepts; the monotonic time it did."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return time.monotonic()
        except OSError:
            assert running(), f"the node exited before {host}:{port} accepted"
            assert time.monotonic() < deadline, f"{host}:{port} did not accept within {START_TIMEOUT_S} s"
            time.sleep(POLL_INTERVAL_S)


def first_contact(bootstrap: str, topic: str, opened: float) -> float:
    """Create `topic`, produce one record and read it back; the seconds since `opened`."""
    deadline = opened + FIRST_CONTACT_S

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
    try:
        future.result(left())
    except TimeoutError:
        pytest.fail(f"CreateTopics through {bootstrap} did not finish within {FIRST_CONTACT_S} s of the port opening")
    created_s = time.monotonic() - opened

    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"first contact", on_delivery=lambda err, msg: delivered.append(err or msg.offset()))
    producer.flush(left())
    assert delivered == [0], f"produce: {delivered} (CreateTopics took {created_s:.2f} s)"

    # Assigned, not subscribed: a group's first join waits out
    # group.initial.rebalance.delay.ms, which is not what is measured here.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "first-contact", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = None
        while (message is None or message.error() is not None) and left() > 0:
            message = consumer.poll(min(0.5, left()))
    finally:
        consumer.close()
    assert message is not None and message.error() is None and message.value() == b"first contact", \
        f"consume: {message and (message.error() or message.value())} (CreateTopics took {created_s:.2f} s)"
    return time.monotonic() - opened


def test_dev_node_serves_the_first_client_also_after_sigkill(tmp_path):
    port, controller_port = free_ports(2)
    command = raftka_command("dev", "--data-dir", str(tmp_path / "dev"), "--port", str(port),
                             "--controller-port", str(controller_port))
    for topic in ("first", "after-sigkill"):
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            ready = ReadyLine(process)
            opened = wait_accepting("127.0.0.1", port, lambda: process.poll() is None)
            assert first_contact(f"127.0.0.1:{port}", topic, opened) < FIRST_CONTACT_S
            # The READY line and the open port say the same thing.
            assert ready.wait("READY bootstrap=", 5, process) == f"READY bootstrap=127.0.0.1:{port}"
        finally:
            process.kill()  # SIGKILL: the second start recovers without a clean-shutdown marker
            process.wait()


def test_cluster_broker_serves_the_first_client_also_after_sigkill(tmp_path):
    with LocalCluster(tmp_path, controllers=1, brokers=2, overrides=FAST_SESSIONS) as cluster:
        cluster.start_all()
        broker = cluster.brokers[0]
        opened = wait_accepting(broker.host, broker.port, broker.is_running)
        assert first_contact(broker.address, "first", opened) < FIRST_CONTACT_S

        cluster.kill(broker.node_id)
        cluster.start(broker.node_id)
        opened = wait_accepting(broker.host, broker.port, broker.is_running)
        assert first_contact(broker.address, "after-sigkill", opened) < FIRST_CONTACT_S
        assert "no clean shutdown marker" in broker.output_since_start()


def test_zookeeper_mode_broker_serves_the_first_client_also_after_sigkill(tmp_path):
    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"ZooKeeper mode needs a local ZooKeeper: {reason}")
    with LocalCluster(tmp_path, controllers=1, brokers=1, mode="zk", zookeeper_tick_time_ms=500,
                      overrides={"zookeeper.session.timeout.ms": "4000"}) as cluster:
        cluster.start_all()
        broker = cluster.brokers[0]
        opened = wait_accepting(broker.host, broker.port, broker.is_running)
        assert first_contact(broker.address, "first", opened) < FIRST_CONTACT_S

        cluster.kill(broker.node_id)
        cluster.start(broker.node_id)
        opened = wait_accepting(broker.host, broker.port, broker.is_running)
        assert first_contact(broker.address, "after-sigkill", opened) < FIRST_CONTACT_S
