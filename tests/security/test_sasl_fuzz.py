"""Fuzz the SASL exchange: hypothesis-drawn SaslHandshake and
SaslAuthenticate frames never authenticate without the password and never
raise anything but a protocol error (which closes only that connection)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging

from hypothesis import given, strategies as st
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from common.security.sasl import (
    PlainExchange,
    SaslAuthenticationError,
    SaslServerConfig,
    ScramCredential,
    ScramExchange,
)
from common.wire.apis import SupportedApis
from common.wire.authenticate import SaslGate
from common.wire.codec import decode_request, encode_request
from common.wire.errors import ProtocolError

CONFIG = SaslServerConfig(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), {"alice": "alice-secret"})
CREDENTIALS = {("SCRAM-SHA-256", "scram"): ScramCredential.from_password("SCRAM-SHA-256", "scram-secret")}
APIS = SupportedApis()
APIS.declare(17, 1, 1)
APIS.declare(36, 0, 2)
APIS.declare(3, 0, 12)


def _decoded(request):
    return decode_request(memoryview(encode_request(1, "fuzz", request))[4:], APIS.supports)


frames = st.one_of(
    st.builds(lambda m: SaslHandshakeRequest(mechanism=m),
              st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", ""]) | st.text(max_size=20)),
    st.builds(lambda b: SaslAuthenticateRequest(auth_bytes=b),
              st.binary(max_size=200) | st.sampled_from([
                  b"\0alice\0wrong", b"alice\0alice\0x", b"n,,n=scram,r=abc", b"n,,n=alice,r=x",
                  b"c=biws,r=abc,p=AAAA", b"\0\0", b"p,,n=scram,r=a"])),
)


@given(st.lists(frames, max_size=8))
def test_drawn_frames_never_authenticate_and_fail_only_as_protocol_errors(sequence):
    gate = SaslGate(CONFIG, lambda m, u: CREDENTIALS.get((m, u)), "127.0.0.1:1", logging.getLogger("fuzz"))
    for request in sequence:
        try:
            gate.answer(_decoded(request))
        except ProtocolError:
            return  # the server closes this connection
        assert gate.state != "done", "authenticated without a password"


def test_a_request_before_authentication_is_a_protocol_error():
    from kio.schema.metadata.v12.request import MetadataRequest

    gate = SaslGate(CONFIG, None, "127.0.0.1:1", logging.getLogger("fuzz"))
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    try:
        gate.answer(_decoded(request))
    except ProtocolError as exc:
        assert "during SASL authentication" in str(exc)
    else:
        raise AssertionError("a Metadata request before SASL was answered")


def test_scram_exchange_by_the_rfc():
    """The server side checks a client proof computed as RFC 5802 says, and proves itself."""
    exchange = ScramExchange("SCRAM-SHA-256", lambda m, u: CREDENTIALS.get((m, u)), nonce=b"server")
    first = exchange.step(b"n,,n=scram,r=client").decode()
    attrs = dict(item.split("=", 1) for item in first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", b"scram-secret", base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    final_bare = f"c=biws,r={attrs['r']}"
    auth_message = f"n=scram,r=client,{first},{final_bare}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    answer = exchange.step(f"{final_bare},p={proof}".encode()).decode()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    assert answer == "v=" + base64.b64encode(hmac.digest(server_key, auth_message, "sha256")).decode()
    assert exchange.complete and exchange.user == "scram"


@given(st.binary(max_size=64))
def test_plain_needs_the_password(token):
    exchange = PlainExchange({"alice": "alice-secret"})
    try:
        exchange.step(token)
    except SaslAuthenticationError:
        return
    assert token.split(b"\0")[1:] == [b"alice", b"alice-secret"]


@given(st.sampled_from(["PLAIN", "SCRAM-SHA-256"]), st.lists(st.binary(max_size=120) | st.sampled_from([
    b"\0alice\0wrong", b"n,,n=scram,r=abc", b"c=biws,r=abc,p=AAAA"]), max_size=6))
def test_raw_tokens_after_handshake_v0_never_authenticate_without_the_password(mechanism, tokens):
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as HandshakeV0

    apis = SupportedApis()
    apis.declare(17, 0, 1)
    gate = SaslGate(CONFIG, lambda m, u: CREDENTIALS.get((m, u)), "127.0.0.1:1", logging.getLogger("fuzz"))
    gate.answer(decode_request(memoryview(encode_request(1, "fuzz", HandshakeV0(mechanism=mechanism)))[4:],
                               apis.supports))
    assert gate.raw
    for token in tokens:
        if gate.raw_token(token) is None:
            return  # the server closes this connection
        assert gate.state != "done", "authenticated without a password"


def test_renewal_keeps_the_principal():
    """A re-authentication that logs in as someone else fails (Kafka: principals do not change)."""
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest as Authenticate

    config = SaslServerConfig(("PLAIN",), {"alice": "alice-secret", "bob": "bob-secret"}, {"PLAIN": 1000})
    gate = SaslGate(config, None, "127.0.0.1:1", logging.getLogger("fuzz"), reauthenticating=("PLAIN", "User:alice"))
    gate.answer(_decoded(SaslHandshakeRequest(mechanism="PLAIN")))
    gate.answer(_decoded(Authenticate(auth_bytes=b"\0bob\0bob-secret")))
    assert gate.state == "failed"
