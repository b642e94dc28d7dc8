"""Security tests start real nodes with the `raftka` CLI (tests/cluster's helpers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "broker"))


import pytest  # noqa: E402

from common.security.certs import CertificateAuthority  # noqa: E402
from common.wire.ports import free_ports  # noqa: E402

JAAS_USERS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


@pytest.fixture(scope="session")
def secure_node(tmp_path_factory):
    """One combined node with a PLAINTEXT, an SSL (client certificates
    requested), a SASL_PLAINTEXT and a SASL_SSL listener, and REAUTH: a
    SASL_PLAINTEXT listener whose sessions last 1.5 s (KIP-368)."""
    from secure_node import SecureNode

    data = tmp_path_factory.mktemp("secure")
    ca = CertificateAuthority()
    ca.write_ca(data / "ca.pem")
    ca.write_keystore(data / "node.pem", "localhost", ("localhost", "127.0.0.1"), password="key-secret")
    ca.write_keystore(data / "client.pem", "app", (), organization="acme")
    plain, controller, ssl_port, sasl_plain, sasl_ssl, reauth = free_ports(6)
    node = SecureNode(data, {
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{controller},SSL://127.0.0.1:{ssl_port},"
                     f"SASL_PLAINTEXT://127.0.0.1:{sasl_plain},SASL_SSL://127.0.0.1:{sasl_ssl},REAUTH://127.0.0.1:{reauth}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        "listener.name.reauth.connections.max.reauth.ms": "1500",
        "listener.name.reauth.plain.sasl.jaas.config": JAAS_USERS,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(data / "node.pem"),
        "ssl.key.password": "key-secret",
        "ssl.truststore.location": str(data / "ca.pem"),
        "ssl.client.auth": "requested",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS_USERS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS_USERS,
    }, "--add-scram", "SCRAM-SHA-256=[name=scram,password=scram-secret]",
       "--add-scram", "SCRAM-SHA-512=[name=scram,password=scram-secret,iterations=8192]")
    node.start()
    node.ports = {"PLAINTEXT": plain, "CONTROLLER": controller, "SSL": ssl_port, "SASL_PLAINTEXT": sasl_plain,
                  "SASL_SSL": sasl_ssl, "REAUTH": reauth}
    node.ca = str(data / "ca.pem")
    node.client_cert = str(data / "client.pem")
    yield node
    node.stop()


ACL_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'user_admin="admin-secret" user_alice="alice-secret" user_eve="eve-secret";')


@pytest.fixture(scope="session")
def acl_node(tmp_path_factory):
    """A node with the ACL authorizer: clients on a SASL_PLAINTEXT listener
    (admin is a super user), the inter-broker PLAINTEXT listener's
    anonymous principal a super user too."""
    from secure_node import SecureNode

    data = tmp_path_factory.mktemp("acl")
    plain, controller, sasl = free_ports(3)
    node = SecureNode(data, {
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"PLAINTEXT://127.0.0.1:{plain},CONTROLLER://127.0.0.1:{controller},"
                     f"SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": ACL_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin;User:ANONYMOUS",
    })
    node.start()
    node.ports = {"PLAINTEXT": plain, "SASL_PLAINTEXT": sasl}
    yield node
    node.stop()
