"""Listener security: TLS (`tls`), SASL (`sasl`), and what a listener uses (`ListenerSecurity`).

A listener's security protocol (Kafka's `listener.security.protocol.map`)
says what a connection goes through before its first request is handled:
PLAINTEXT nothing, SSL a TLS handshake, SASL_PLAINTEXT a SASL exchange
(SaslHandshake, SaslAuthenticate), SASL_SSL both. The connection's
principal is then `User:ANONYMOUS`, the TLS client certificate's mapped
subject (`User:CN=...`) or the SASL user name (`User:alice`).
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Mapping

from common.config import ListenerAddress
from common.security.sasl import SaslServerConfig
from common.security.tls import PrincipalMapper, listener_lookup, server_context


@dataclasses.dataclass(frozen=True, eq=False)
class ListenerSecurity:
    """How one listener's connections are secured."""

    protocol: str = "PLAINTEXT"
    #: The server's TLS context (SSL and SASL_SSL).
    tls: ssl.SSLContext | None = None
    principal_mapper: PrincipalMapper = dataclasses.field(default_factory=PrincipalMapper)
    #: The SASL mechanisms (SASL_PLAINTEXT and SASL_SSL).
    sasl: SaslServerConfig | None = None

    @classmethod
    def from_properties(cls, props: Mapping[str, str], listener: ListenerAddress) -> ListenerSecurity:
        """Read the listener's keys; a ConfigError names a missing or bad one
        (a keystore that is not there stops the node at start, not at the
        first client)."""
        protocol = listener.security_protocol
        get = listener_lookup(props, listener.name)
        tls = server_context(props, listener.name) if protocol in ("SSL", "SASL_SSL") else None
        sasl = SaslServerConfig.from_properties(props, listener.name) if protocol.startswith("SASL_") else None
        return cls(protocol, tls, PrincipalMapper(get("ssl.principal.mapping.rules")), sasl)


def controller_listener_security(props: Mapping[str, str], listener: tuple[str, str, int]) -> ListenerSecurity | None:
    """How a controller's listener is secured (its entry in
    `listener.security.protocol.map`, PLAINTEXT if it has none); None for PLAINTEXT."""
    from common.config import security_protocol_map

    name, host, port = listener
    protocol = security_protocol_map(props).get(name, "PLAINTEXT")
    if protocol == "PLAINTEXT":
        return None
    return ListenerSecurity.from_properties(props, ListenerAddress(name, host, port, protocol))
