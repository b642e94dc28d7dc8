"""SASL on a connection: SaslHandshake and SaslAuthenticate before any other
request (KIP-43, KIP-152), for SASL_PLAINTEXT and SASL_SSL listeners.

`SaslGate` answers the two requests of an unauthenticated connection with
the exchange of `common.security.sasl` and says when the connection is
authenticated (its principal: `User:<name>`). Any other request before that
(but ApiVersions, which the server answers itself) is a RemoteProtocolError:
the connection closes, as Kafka's SaslServerAuthenticator does. A failed
exchange answers SASL_AUTHENTICATION_FAILED with Kafka's message, is logged
once with the peer address (never the token), and the connection then
closes at its next request (clients close it themselves first).
Re-authentication (KIP-368) is not offered: `session_lifetime_ms` is 0.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate import v0 as auth_v0, v1 as auth_v1, v2 as auth_v2
from kio.schema.sasl_handshake import v1 as handshake_v1

from common.security.sasl import (
    SaslAuthenticationError,
    SaslServerConfig,
    ScramLookup,
    new_exchange,
)
from common.wire.codec import DecodedRequest, api_name, encode_response
from common.wire.errors import RemoteProtocolError

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
#: SaslHandshake v0 sends the tokens without Kafka framing; every client
#: this serves speaks v1 with SaslAuthenticate.
SASL_HANDSHAKE_VERSIONS = (1, 1)
SASL_AUTHENTICATE_VERSIONS = (0, 2)
_AUTH_MODULES = {0: auth_v0.response, 1: auth_v1.response, 2: auth_v2.response}


class SaslGate:
    """One connection's SASL exchange. States: handshake -> authenticate
    (after a SaslHandshake naming an enabled mechanism) -> done (the
    exchange completed) or failed (any error; the next request closes)."""

    def __init__(self, config: SaslServerConfig, lookup: ScramLookup | None, peer: str,
                 log: logging.Logger) -> None:
        self.config = config
        self.lookup = lookup
        self.peer = peer
        self.log = log
        self.state = "handshake"
        self.principal: str | None = None
        self._exchange = None

    def answer(self, request: DecodedRequest) -> bytes:
        """The encoded response to a request of an unauthenticated connection."""
        key = request.header.api_key
        if self.state == "failed":
            raise RemoteProtocolError(f"{api_name(key)} after a failed SASL authentication")
        if key == SASL_HANDSHAKE_KEY and self.state == "handshake":
            return self._handshake(request)
        if key == SASL_AUTHENTICATE_KEY and self.state == "authenticate":
            return self._authenticate(request)
        raise RemoteProtocolError(f"unexpected {api_name(key)} request during SASL authentication "
                                  f"(state {self.state}): a SASL listener needs SaslHandshake and "
                                  "SaslAuthenticate first; set the client's security.protocol to SASL_*")

    def _handshake(self, request: DecodedRequest) -> bytes:
        mechanism = request.body.mechanism
        enabled = self.config.mechanisms
        if mechanism not in enabled:
            self.state = "failed"
            self.log.warning("SASL handshake from %s asked for mechanism %r; this listener enables %s",
                             self.peer, mechanism, ", ".join(enabled))
            error = ErrorCode.unsupported_sasl_mechanism
        else:
            self._exchange = new_exchange(mechanism, self.config, self.lookup)
            self.state = "authenticate"
            error = ErrorCode.none
        return encode_response(request.header, handshake_v1.response.SaslHandshakeResponse(
            error_code=error, mechanisms=tuple(enabled)))

    def _authenticate(self, request: DecodedRequest) -> bytes:
        module = _AUTH_MODULES[request.header.api_version]
        exchange = self._exchange
        assert exchange is not None
        try:
            reply = exchange.step(bytes(request.body.auth_bytes))
        except SaslAuthenticationError as exc:
            self.state = "failed"
            self.log.warning("SASL %s authentication from %s failed%s: %s", exchange.mechanism, self.peer,
                             f" for user {exchange.user!r}" if exchange.user else "", exc)
            return encode_response(request.header, _auth_response(module, ErrorCode.sasl_authentication_failed,
                                                                  str(exc), b""))
        if exchange.complete:
            self.state = "done"
            self.principal = f"User:{exchange.user}"
        return encode_response(request.header, _auth_response(module, ErrorCode.none, None, reply))


def _auth_response(module, error: ErrorCode, message: str | None, auth_bytes: bytes):
    return module.SaslAuthenticateResponse(error_code=error, error_message=message, auth_bytes=auth_bytes)


def answer_without_sasl(request: DecodedRequest) -> bytes:
    """SaslHandshake or SaslAuthenticate on a listener without SASL: Kafka's
    errors (no mechanism is offered; no exchange is under way)."""
    if request.header.api_key == SASL_HANDSHAKE_KEY:
        return encode_response(request.header, handshake_v1.response.SaslHandshakeResponse(
            error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=()))
    module = _AUTH_MODULES[request.header.api_version]
    return encode_response(request.header, _auth_response(
        module, ErrorCode.illegal_sasl_state, "this listener does not use SASL; connect with a PLAINTEXT or SSL "
        "security.protocol", b""))
