"""SASL re-authentication (KIP-368): a listener with connections.max.reauth.ms
tells clients their session's lifetime, closes a connection used after it
without re-authenticating, renews a session on the same connection, and
refuses a renewal once the user is gone; SaslHandshake v0 (raw tokens)."""

from __future__ import annotations

import time

import pytest
import trio
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from common.security.client import ScramClient
from common.wire.client import open_connection
from common.wire.errors import ConnectionFailedError
from secure_clients import ClientSecurity

LIFETIME_MS = 1500
METADATA = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)


async def login(conn, mechanism: str, user: str, password: str):
    """SaslHandshake v1 and SaslAuthenticate v2; the last SaslAuthenticate answer."""
    handshake = await conn.request(SaslHandshakeRequest(mechanism=mechanism))
    if handshake.error_code != ErrorCode.none:
        return handshake
    if mechanism == "PLAIN":
        return await conn.request(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()))
    client = ScramClient(mechanism, user, password)
    first = await conn.request(SaslAuthenticateRequest(auth_bytes=client.first()))
    if first.error_code != ErrorCode.none:
        return first
    return await conn.request(SaslAuthenticateRequest(auth_bytes=client.final(bytes(first.auth_bytes))))


def lifetime_ms(answer) -> int:
    return round(answer.session_lifetime.total_seconds() * 1000)


def test_session_lifetime_expiry_and_renewal_on_one_connection(secure_node):
    port = secure_node.ports["REAUTH"]

    async def main():
        async with open_connection("127.0.0.1", port) as conn:
            answer = await login(conn, "SCRAM-SHA-512", "scram", "scram-secret")
            assert answer.error_code == ErrorCode.none and lifetime_ms(answer) == LIFETIME_MS
            await conn.request(METADATA)
            # A renewal on the same connection, after the session expired: accepted.
            await trio.sleep(LIFETIME_MS / 1000 + 0.2)
            renewed = await login(conn, "SCRAM-SHA-512", "scram", "scram-secret")
            assert renewed.error_code == ErrorCode.none and lifetime_ms(renewed) == LIFETIME_MS
            await conn.request(METADATA)
            # Expired without renewal: the next request closes the connection.
            await trio.sleep(LIFETIME_MS / 1000 + 0.2)
            with pytest.raises(ConnectionFailedError):
                await conn.request(METADATA, timeout_ms=5000)
        async with open_connection("127.0.0.1", port) as conn:
            assert (await login(conn, "PLAIN", "alice", "alice-secret")).error_code == ErrorCode.none
            # A session keeps its principal and its mechanism.
            other = await login(conn, "PLAIN", "admin", "admin-secret")
            assert other.error_code == ErrorCode.sasl_authentication_failed
            assert "Cannot change principals during re-authentication" in other.error_message
        async with open_connection("127.0.0.1", port) as conn:
            assert (await login(conn, "PLAIN", "alice", "alice-secret")).error_code == ErrorCode.none
            switched = await conn.request(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
            assert switched.error_code == ErrorCode.unsupported_sasl_mechanism
        # Without connections.max.reauth.ms sessions do not expire.
        async with open_connection("127.0.0.1", secure_node.ports["SASL_PLAINTEXT"]) as conn:
            answer = await login(conn, "PLAIN", "alice", "alice-secret")
            assert answer.error_code == ErrorCode.none and lifetime_ms(answer) == 0

    trio.run(main)
    log = secure_node.log()
    assert "did not re-authenticate" in log
    assert "alice-secret" not in log and "admin-secret" not in log


def test_a_changed_password_fails_the_renewal_and_closes_the_connection(secure_node):
    from kafka import KafkaAdminClient
    from kafka.admin import ScramMechanism, UserScramCredentialUpsertion

    admin_sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT",
                               mechanism="PLAIN", user="admin", password="admin-secret")
    admin = KafkaAdminClient(**admin_sec.kafka_python())
    port = secure_node.ports["REAUTH"]
    try:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "rotated", ScramMechanism.SCRAM_SHA_256, "first-secret", iterations=4096)])

        async def main():
            async with open_connection("127.0.0.1", port) as conn:
                with trio.fail_after(10):
                    while (await login(conn, "SCRAM-SHA-256", "rotated", "first-secret")).error_code:
                        await trio.sleep(0.2)  # the new user reaches the broker's image
            async with open_connection("127.0.0.1", port) as conn:
                assert (await login(conn, "SCRAM-SHA-256", "rotated", "first-secret")).error_code == ErrorCode.none
                await trio.to_thread.run_sync(lambda: admin.alter_user_scram_credentials([
                    UserScramCredentialUpsertion("rotated", ScramMechanism.SCRAM_SHA_256, "second-secret",
                                                 iterations=4096)]))
                with trio.fail_after(10):
                    while True:  # the old password works until the change reaches the broker's image
                        async with open_connection("127.0.0.1", port) as probe:
                            if (await login(probe, "SCRAM-SHA-256", "rotated", "first-secret")).error_code:
                                break
                        await trio.sleep(0.2)
                renewal = await login(conn, "SCRAM-SHA-256", "rotated", "first-secret")
                assert renewal.error_code == ErrorCode.sasl_authentication_failed
                with pytest.raises(ConnectionFailedError):
                    await conn.request(METADATA, timeout_ms=5000)

        trio.run(main)
    finally:
        admin.close()


def test_librdkafka_consumer_reauthenticates_until_its_user_is_deleted(secure_node):
    """A confluent-kafka consumer keeps consuming across several session
    lifetimes (librdkafka re-authenticates at 90% of the lifetime); once
    its SCRAM user is deleted, the next re-authentication fails and the
    client reports an authentication error; with the user back it logs in again."""
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaAdminClient
    from kafka.admin import ScramMechanism, UserScramCredentialDeletion, UserScramCredentialUpsertion

    admin_sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT",
                               mechanism="PLAIN", user="admin", password="admin-secret")
    scram_admin = KafkaAdminClient(**admin_sec.kafka_python())
    scram_admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "renewer", ScramMechanism.SCRAM_SHA_256, "renewer-secret", iterations=4096)])
    plain = {"bootstrap.servers": f"127.0.0.1:{secure_node.ports['PLAINTEXT']}"}
    topic = "reauth-consumer"
    topic_admin = AdminClient(plain)
    topic_admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(plain)
    errors: list = []
    sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['REAUTH']}", "SASL_PLAINTEXT", mechanism="SCRAM-SHA-256",
                         user="renewer", password="renewer-secret")
    consumer = Consumer({**sec.confluent(), "group.id": "reauth-group", "auto.offset.reset": "earliest",
                         "error_cb": errors.append, "fetch.wait.max.ms": 100, "log_level": 0})
    expired_before = secure_node.log().count("did not re-authenticate")
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        sent = 0
        start = time.monotonic()
        # Three lifetimes of a consumer fetching without pause.
        while time.monotonic() - start < 3 * LIFETIME_MS / 1000:
            producer.produce(topic, value=f"v{sent}".encode())
            producer.poll(0)
            sent += 1
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message.value())
        producer.flush(10)
        deadline = time.monotonic() + 10
        while len(got) < sent and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append(message.value())
        assert got == [f"v{i}".encode() for i in range(sent)]
        assert not [e for e in errors if e.code() == KafkaError._AUTHENTICATION], errors
        # librdkafka renewed its sessions in time: the broker closed none of its connections.
        assert secure_node.log().count("did not re-authenticate") == expired_before
        scram_admin.alter_user_scram_credentials([UserScramCredentialDeletion("renewer",
                                                                              ScramMechanism.SCRAM_SHA_256)])
        deadline = time.monotonic() + 3 * LIFETIME_MS / 1000
        while time.monotonic() < deadline and not [e for e in errors if e.code() == KafkaError._AUTHENTICATION]:
            consumer.poll(0.2)
        assert [e for e in errors if e.code() == KafkaError._AUTHENTICATION], errors
        assert "SASL SCRAM-SHA-256 re-authentication from 127.0.0.1" in secure_node.log()
        # The user back (same password): the client reconnects, and leaves its group at close.
        scram_admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "renewer", ScramMechanism.SCRAM_SHA_256, "renewer-secret", iterations=4096)])
    finally:
        consumer.close()
        scram_admin.close()


@pytest.mark.parametrize("mechanism, user, password", [("PLAIN", "alice", "alice-secret"),
                                                       ("SCRAM-SHA-512", "scram", "scram-secret")])
def test_kafka_python_pinned_old_logs_in_with_raw_tokens(secure_node, mechanism, user, password):
    """kafka-python with `api_version=(0, 10, 1)` sends SaslHandshake v0 and
    then the mechanism's raw tokens (no SaslAuthenticate framing)."""
    from kafka import KafkaAdminClient

    sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT",
                         mechanism=mechanism, user=user, password=password)
    admin = KafkaAdminClient(**sec.kafka_python(), api_version=(0, 10, 1), request_timeout_ms=10000)
    try:
        assert isinstance(admin.list_topics(), list)
    finally:
        admin.close()


def test_raw_token_with_a_wrong_password_closes_that_connection(secure_node):
    """A raw exchange has no error to answer with: the connection closes."""
    import socket
    import struct

    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0

    from common.wire.codec import encode_request

    def read_frame(sock) -> bytes:
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(4096)
            if not chunk:
                return data
            data += chunk
        return data

    for password, answered in (("alice-secret", True), ("wrong-password", False)):
        with socket.create_connection(("127.0.0.1", secure_node.ports["SASL_PLAINTEXT"]), timeout=5) as sock:
            sock.sendall(encode_request(1, "raw", HandshakeV0(mechanism="PLAIN")))
            assert read_frame(sock)
            token = f"\0alice\0{password}".encode()
            sock.sendall(struct.pack(">i", len(token)) + token)
            # PLAIN's answer is an empty token; a failure closes the connection (EOF).
            assert read_frame(sock) == (b"\0\0\0\0" if answered else b"")
    assert "SASL PLAIN authentication from 127.0.0.1" in secure_node.log()
    assert "wrong-password" not in secure_node.log()
    assert secure_node.alive()
