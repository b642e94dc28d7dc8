"""Several named listeners: Kafka's stock KRaft server.properties starts a
node, an empty host binds every interface, and each client is sent to the
endpoints of the listener it connected on."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient

from common.config import NodeConfig
from common.errors import ConfigError
from common.wire.ports import free_ports
from secure_node import SecureNode


@pytest.fixture
def stock_node(tmp_path):
    plain, controller, external = free_ports(3)
    # Kafka 3.x's config/kraft/server.properties, ports moved and an EXTERNAL listener added.
    node = SecureNode(tmp_path, {
        "controller.quorum.voters": f"1@localhost:{controller}",
        "listeners": f"PLAINTEXT://:{plain},CONTROLLER://:{controller},EXTERNAL://127.0.0.1:{external}",
        "inter.broker.listener.name": "PLAINTEXT",
        "advertised.listeners": f"PLAINTEXT://localhost:{plain},EXTERNAL://127.0.0.1:{external}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,"
                                          "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,EXTERNAL:PLAINTEXT",
        "num.network.threads": "3", "num.io.threads": "8", "socket.send.buffer.bytes": "102400",
        "socket.receive.buffer.bytes": "102400", "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "168", "log.segment.bytes": "1073741824",
    })
    node.start()
    yield node, plain, controller, external
    node.stop()


def test_stock_kraft_config_binds_every_interface_and_answers_per_listener(stock_node):
    node, plain, controller, external = stock_node
    listening = {port: _bound_address(port) for port in (plain, controller, external)}
    # `PLAINTEXT://:port` and `CONTROLLER://:port`: every interface, as in Kafka.
    assert listening[plain] in ("0.0.0.0", "::"), listening
    assert listening[controller] in ("0.0.0.0", "::"), listening
    assert listening[external] == "127.0.0.1", listening
    via_plain = AdminClient({"bootstrap.servers": f"localhost:{plain}"}).list_topics(timeout=30)
    assert {(b.host, b.port) for b in via_plain.brokers.values()} == {("localhost", plain)}
    via_external = AdminClient({"bootstrap.servers": f"127.0.0.1:{external}"}).list_topics(timeout=30)
    assert {(b.host, b.port) for b in via_external.brokers.values()} == {("127.0.0.1", external)}
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{external}", request_timeout_ms=30000)
    try:
        assert [(b["host"], b["port"]) for b in admin.describe_cluster()["brokers"]] == [("127.0.0.1", external)]
    finally:
        admin.close()


def _bound_address(port: int) -> str:
    """The local address a listening socket on `port` is bound to (from /proc/net/tcp*)."""
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(path) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, hex_port = fields[1].split(":")
                if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                    raw = bytes.fromhex(address)
                    if family == socket.AF_INET:
                        return socket.inet_ntop(family, raw[::-1])
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    return socket.inet_ntop(family, words)
    return ""


@pytest.mark.parametrize("props, says", [
    ({"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9094"}, "appears twice"),
    ({"listeners": "PLAINTEXT://:9092,EXTERNAL://:9094"}, "EXTERNAL has no security protocol"),
    ({"listeners": "PLAINTEXT://:9092", "listener.security.protocol.map": "PLAINTEXT:TLS"}, "NAME:PROTOCOL"),
    ({"listeners": "CONTROLLER://:9093", "controller.listener.names": "CONTROLLER"}, "no broker listener"),
])
def test_listener_config_errors_name_the_key(props, says):
    base = {"node.id": "1", "log.dirs": "/tmp/x", "controller.quorum.voters": "1@localhost:9093"}
    with pytest.raises(ConfigError, match=says):
        NodeConfig.from_properties({**base, **props})
