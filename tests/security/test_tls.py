"""SSL listeners: each client library's round trip over TLS; a mutual-TLS
principal; the fetch path without sendfile; bad handshakes and bad
keystore paths."""

from __future__ import annotations

import socket
import ssl

import pytest

from broker.config import BrokerConfig
from common.errors import ConfigError
from secure_clients import ROUND_TRIPS, VALUES, ClientSecurity


@pytest.mark.parametrize("client", sorted(ROUND_TRIPS))
def test_round_trip_over_ssl(secure_node, client):
    sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['SSL']}", "SSL", ca=secure_node.ca,
                         cert=secure_node.client_cert if client == "confluent-kafka" else None)
    assert ROUND_TRIPS[client](sec, f"tls-{client}") == VALUES


def test_tls_versions_and_garbage_do_not_hurt_other_clients(secure_node):
    port = secure_node.ports["SSL"]
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        context = ssl.create_default_context(cafile=secure_node.ca)
        context.minimum_version = context.maximum_version = version
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
    # Plaintext Kafka bytes and random bytes on the TLS port: that connection closes, the node stays.
    for garbage in (b"\x00\x00\x00\x0c\x00\x12\x00\x03\x00\x00\x00\x01\x00\x00", bytes(range(256)) * 4):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            raw.sendall(garbage)
            assert raw.recv(1024) in (b"",) or True  # an alert or nothing, then the close
    assert secure_node.alive()
    assert "TLS handshake with 127.0.0.1" in secure_node.log()
    sec = ClientSecurity(f"127.0.0.1:{port}", "SSL", ca=secure_node.ca)
    assert ROUND_TRIPS["confluent-kafka"](sec, "tls-after-garbage") == VALUES


def test_client_certificate_gives_the_principal(secure_node):
    """Mutual TLS: `User:` and the subject DN, most specific part first, as
    Kafka names it; a mapping rule can shorten it."""
    from kafka import KafkaAdminClient

    from common.security.tls import PrincipalMapper, subject_dn

    admin = KafkaAdminClient(**ClientSecurity(f"127.0.0.1:{secure_node.ports['SSL']}", "SSL", ca=secure_node.ca,
                                              cert=secure_node.client_cert).kafka_python())
    admin.close()
    dn = subject_dn(ssl._ssl._test_decode_cert(secure_node.client_cert))
    assert dn == "CN=app,O=acme"
    assert PrincipalMapper("RULE:^CN=(.*?),O=(.*)$/$1@$2/L,DEFAULT").name(dn) == "app@acme"
    assert PrincipalMapper().name(dn) == dn


def _props(tmp_path, **extra):
    return {"node.id": "1", "log.dirs": str(tmp_path), "listeners": "SSL://127.0.0.1:9094", **extra}


def test_missing_keystore_is_a_startup_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="ssl.keystore.location=/no/such/node.pem: no such file"):
        BrokerConfig.from_properties(_props(tmp_path, **{"ssl.keystore.location": "/no/such/node.pem"}),
                                     cluster_id="c")
    with pytest.raises(ConfigError, match="ssl.keystore.location is not set"):
        BrokerConfig.from_properties(_props(tmp_path), cluster_id="c")
    with pytest.raises(ConfigError, match="ssl.client.auth"):
        BrokerConfig.from_properties(_props(tmp_path, **{"ssl.client.auth": "maybe"}), cluster_id="c")


def test_wrong_key_password_is_a_startup_error(tmp_path):
    from common.security.certs import CertificateAuthority

    keystore = CertificateAuthority().write_keystore(tmp_path / "node.pem", "localhost", password="right")
    with pytest.raises(ConfigError, match="ssl.key.password is wrong"):
        BrokerConfig.from_properties(_props(tmp_path, **{"ssl.keystore.location": str(keystore),
                                                         "ssl.key.password": "wrong"}), cluster_id="c")


def test_large_fetches_over_tls_deliver_the_same_bytes(secure_node):
    """Fetch responses of several MB over TLS (read and encrypted, not
    sendfile; the socket fills and the held-back byte is sent later) carry
    exactly what a plaintext fetch carries."""
    import hashlib
    import time

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    plain = {"bootstrap.servers": f"127.0.0.1:{secure_node.ports['PLAINTEXT']}"}
    tls = {"bootstrap.servers": f"127.0.0.1:{secure_node.ports['SSL']}", "security.protocol": "SSL",
           "ssl.ca.location": secure_node.ca}
    admin = AdminClient(plain)
    admin.create_topics([NewTopic("tls-large", 1, 1)], operation_timeout=30)["tls-large"].result(60)
    producer = Producer({**plain, "linger.ms": 20, "batch.size": 1000000})
    count = 20000
    for i in range(count):
        producer.produce("tls-large", value=i.to_bytes(4, "big") * 256)
    assert producer.flush(60) == 0

    def digest(conf) -> str:
        consumer = Consumer({**conf, "group.id": "tls-large", "fetch.max.bytes": 52428800})
        consumer.assign([TopicPartition("tls-large", 0, 0)])
        h, got, deadline = hashlib.sha256(), 0, time.monotonic() + 60
        try:
            while got < count and time.monotonic() < deadline:
                for m in consumer.consume(1000, 0.5):
                    assert m.error() is None, m.error()
                    h.update(m.value())
                    got += 1
        finally:
            consumer.close()
        assert got == count
        return h.hexdigest()

    assert digest(tls) == digest(plain)


def test_a_keystore_error_stops_the_node_naming_the_key(tmp_path):
    from cluster_testing import run_cli
    from secure_node import CLUSTER_ID, write_properties

    config = write_properties(tmp_path / "server.properties", {
        "process.roles": "broker,controller", "node.id": "1", "controller.quorum.voters": "1@127.0.0.1:19999",
        "listeners": "SSL://127.0.0.1:0,CONTROLLER://127.0.0.1:19999", "log.dirs": str(tmp_path / "logs"),
        "ssl.keystore.location": "/etc/kafka/missing.pem"})
    assert run_cli("storage", "format", "--config", str(config), "--cluster-id", CLUSTER_ID).returncode == 0
    started = run_cli("broker", "--config", str(config), timeout=60)
    assert started.returncode == 2
    assert "ssl.keystore.location=/etc/kafka/missing.pem: no such file" in started.stderr
