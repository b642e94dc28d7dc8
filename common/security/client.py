"""The client side of listener security, for a node's own links (broker to
controller, controller to controller): TLS with the node's truststore (and
its keystore as the client certificate), and a SASL login with PLAIN or
SCRAM (`login`).

A node's links to the controllers use the security protocol of the first
listener in `controller.listener.names` (Kafka's rule) and the SASL
mechanism `sasl.mechanism.controller.protocol`; its links to other brokers
those of `inter.broker.listener.name` and
`sasl.mechanism.inter.broker.protocol` (both default PLAIN here; Kafka's
are GSSAPI). The user name and password are the `username` and `password`
of that listener's JAAS text (`listener.name.<l>.<mechanism>.sasl.jaas.config`,
then `listener.name.<l>.sasl.jaas.config`, then `sasl.jaas.config`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import ssl
from collections.abc import Mapping

from common.config import controller_listener_names, security_protocol_map
from common.errors import ConfigError
from common.security.sasl import MECHANISMS, PLAIN, SCRAM_HASHES, parse_jaas_login
from common.security.tls import client_context


@dataclasses.dataclass(frozen=True, eq=False)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    tls: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str = ""
    password: str = dataclasses.field(default="", repr=False)


def controller_client_security(props: Mapping[str, str]) -> ClientSecurity | None:
    """How this node connects to the controllers; None for PLAINTEXT."""
    names = controller_listener_names(props)
    if not names:
        return None
    return listener_client_security(props, names[0], "sasl.mechanism.controller.protocol")


def inter_broker_client_security(props: Mapping[str, str], listener: str) -> ClientSecurity | None:
    """How this broker connects to other brokers (follower fetches,
    transaction markers): the `inter.broker.listener.name` listener's
    protocol, `sasl.mechanism.inter.broker.protocol`."""
    return listener_client_security(props, listener, "sasl.mechanism.inter.broker.protocol")


def listener_client_security(props: Mapping[str, str], listener: str, mechanism_key: str) -> ClientSecurity | None:
    """TLS and SASL for a connection to `listener` of another node; None for PLAINTEXT."""
    protocol = security_protocol_map(props).get(listener, "PLAINTEXT")
    if protocol == "PLAINTEXT":
        return None
    tls = client_context(props, listener) if protocol in ("SSL", "SASL_SSL") else None
    if not protocol.startswith("SASL_"):
        return ClientSecurity(protocol, tls)
    mechanism = props.get(mechanism_key, PLAIN).strip().upper()
    if mechanism not in MECHANISMS:
        raise ConfigError(f"{mechanism_key}={mechanism}: use one of {', '.join(MECHANISMS)}")
    prefix = f"listener.name.{listener.lower()}."
    jaas = (props.get(f"{prefix}{mechanism.lower()}.sasl.jaas.config") or props.get(f"{prefix}sasl.jaas.config")
            or props.get("sasl.jaas.config") or "")
    login = parse_jaas_login(jaas)
    if login is None:
        raise ConfigError(f"listener {listener} uses {protocol} but no username and password are configured for "
                          f"this node's own connections to it: set {prefix}{mechanism.lower()}.sasl.jaas.config "
                          "to '... required username=\"NODE\" password=\"SECRET\" ...;'")
    return ClientSecurity(protocol, tls, mechanism, *login)


class ScramClient:
    """The client side of SCRAM (RFC 5802): first message, final message, server check."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.digest = SCRAM_HASHES[mechanism]
        self.username = username.replace("=", "=3D").replace(",", "=2C")
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self._server_signature = b""

    def first(self) -> bytes:
        self._bare = f"n={self.username},r={self.nonce}"
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
        if not attrs.get("r", "").startswith(self.nonce):
            raise ConnectionError("SCRAM: the server's nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac(self.digest, self.password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.digest(salted, b"Client Key", self.digest)
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = hmac.digest(hashlib.new(self.digest, client_key).digest(), auth_message, self.digest)
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
        server_key = hmac.digest(salted, b"Server Key", self.digest)
        self._server_signature = hmac.digest(server_key, auth_message, self.digest)
        return f"{without_proof},p={proof}".encode()

    def check(self, server_final: bytes) -> None:
        expected = b"v=" + base64.b64encode(self._server_signature)
        if not hmac.compare_digest(expected, server_final):
            raise ConnectionError("SCRAM: the server did not prove it knows the credential")
