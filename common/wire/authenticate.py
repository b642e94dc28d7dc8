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

SaslHandshake v0 (before KIP-152) is followed by the mechanism's raw tokens,
each with a 4-byte size prefix but no request header; the server answers
each the same way (`raw_token`). A failure there has no error to answer
with: the connection closes, as in Kafka.

Re-authentication (KIP-368): with `connections.max.reauth.ms` set, a
SaslAuthenticate v1+ answer carries the session's lifetime; the server
closes a connection whose session expired at its next request other than
a SaslHandshake. A SaslHandshake on an authenticated connection starts a
new exchange (a gate made with `reauthenticating`), which must use the
same mechanism and end with the same principal; a user deleted or whose
password changed in between fails it, and the connection closes.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate import v0 as auth_v0, v1 as auth_v1, v2 as auth_v2
from kio.schema.sasl_handshake import v0 as handshake_v0, v1 as handshake_v1

from common.security.sasl import (
    SaslAuthenticationError,
    SaslServerConfig,
    ScramLookup,
    new_exchange,
)
from common.wire.codec import DecodedRequest, api_name, encode_response
from common.wire.errors import RemoteProtocolError
from common.wire.framing import SIZE_PREFIX

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
#: v0: raw SASL tokens follow the handshake; v1: SaslAuthenticate carries them.
SASL_HANDSHAKE_VERSIONS = (0, 1)
SASL_AUTHENTICATE_VERSIONS = (0, 2)
_AUTH_MODULES = {0: auth_v0.response, 1: auth_v1.response, 2: auth_v2.response}
_HANDSHAKE_MODULES = {0: handshake_v0.response, 1: handshake_v1.response}


class SaslGate:
    """One connection's SASL exchange. States: handshake -> authenticate
    (after a SaslHandshake v1 naming an enabled mechanism) or raw (after a
    v0 one) -> done (the exchange completed) or failed (any error; the next
    request closes). `reauthenticating` is the (mechanism, principal) of the
    session a re-authentication renews."""

    def __init__(self, config: SaslServerConfig, lookup: ScramLookup | None, peer: str,
                 log: logging.Logger, reauthenticating: tuple[str, str] | None = None) -> None:
        self.config = config
        self.lookup = lookup
        self.peer = peer
        self.log = log
        self.reauthenticating = reauthenticating
        self.state = "handshake"
        self.principal: str | None = None
        self.mechanism: str | None = None
        #: Once done: milliseconds until the session expires, if the client
        #: was told (SaslAuthenticate v1+); 0: it never expires.
        self.session_lifetime_ms = 0
        self._exchange = None

    @property
    def raw(self) -> bool:
        """Whether the next frame is a raw SASL token (after SaslHandshake v0)."""
        return self.state == "raw"

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
        version = request.header.api_version
        enabled = self.config.mechanisms
        error = ErrorCode.none
        if mechanism not in enabled:
            self.log.warning("SASL handshake from %s asked for mechanism %r; this listener enables %s",
                             self.peer, mechanism, ", ".join(enabled))
            error = ErrorCode.unsupported_sasl_mechanism
        elif self.reauthenticating and mechanism != self.reauthenticating[0]:
            # Kafka: a session is renewed with the mechanism that opened it.
            self.log.warning("SASL re-authentication from %s asked for mechanism %s; the session was opened "
                             "with %s", self.peer, mechanism, self.reauthenticating[0])
            error = ErrorCode.unsupported_sasl_mechanism
        elif self.reauthenticating and version == 0:
            self.log.warning("SASL re-authentication from %s used SaslHandshake v0; re-authentication needs "
                             "SaslHandshake v1 and SaslAuthenticate v1+", self.peer)
            error = ErrorCode.illegal_sasl_state
        if error != ErrorCode.none:
            self.state = "failed"
        else:
            self._exchange = new_exchange(mechanism, self.config, self.lookup)
            self.mechanism = mechanism
            self.state = "raw" if version == 0 else "authenticate"
        return encode_response(request.header, _HANDSHAKE_MODULES[version].SaslHandshakeResponse(
            error_code=error, mechanisms=tuple(enabled)))

    def _step(self, token: bytes) -> bytes:
        """The exchange's answer to a token; raises SaslAuthenticationError (logged, state failed)."""
        exchange = self._exchange
        assert exchange is not None
        try:
            reply = exchange.step(token)
            if exchange.complete:
                principal = f"User:{exchange.user}"
                if self.reauthenticating and principal != self.reauthenticating[1]:
                    raise SaslAuthenticationError(f"Cannot change principals during re-authentication from "
                                                  f"{self.reauthenticating[1]}: {principal}")
        except SaslAuthenticationError as exc:
            self.state = "failed"
            what = "re-authentication" if self.reauthenticating else "authentication"
            self.log.warning("SASL %s %s from %s failed%s: %s", exchange.mechanism, what, self.peer,
                             f" for user {exchange.user!r}" if exchange.user else "", exc)
            raise
        if exchange.complete:
            self.state = "done"
            self.principal = principal
        return reply

    def _authenticate(self, request: DecodedRequest) -> bytes:
        version = request.header.api_version
        module = _AUTH_MODULES[version]
        try:
            reply = self._step(bytes(request.body.auth_bytes))
        except SaslAuthenticationError as exc:
            return encode_response(request.header, _auth_response(module, ErrorCode.sasl_authentication_failed,
                                                                  str(exc), b""))
        lifetime = 0
        if self.state == "done" and version >= 1:
            # Only a client told the lifetime (v1+, KIP-368) is held to it.
            lifetime = self.session_lifetime_ms = self.config.session_lifetime_ms(self.mechanism or "")
        return encode_response(request.header, _auth_response(module, ErrorCode.none, None, reply, lifetime))

    def raw_token(self, token: bytes) -> bytes | None:
        """The size-prefixed answer to a raw SASL token (after SaslHandshake
        v0), or None after a failure (logged): close the connection, as
        Kafka does, since a raw exchange has no way to carry an error."""
        try:
            reply = self._step(token)
        except SaslAuthenticationError:
            return None
        return SIZE_PREFIX.pack(len(reply)) + reply


def _auth_response(module, error: ErrorCode, message: str | None, auth_bytes: bytes, lifetime_ms: int = 0):
    response = module.SaslAuthenticateResponse(error_code=error, error_message=message, auth_bytes=auth_bytes)
    if lifetime_ms:
        response = dataclasses.replace(response, session_lifetime=datetime.timedelta(milliseconds=lifetime_ms))
    return response


def answer_out_of_exchange(request: DecodedRequest) -> bytes:
    """SaslAuthenticate on an authenticated SASL connection with no
    SaslHandshake before it: Kafka's ILLEGAL_SASL_STATE."""
    module = _AUTH_MODULES[request.header.api_version]
    return encode_response(request.header, _auth_response(
        module, ErrorCode.illegal_sasl_state, "SaslAuthenticate outside a SASL exchange: a re-authentication "
        "starts with SaslHandshake", b""))


def answer_without_sasl(request: DecodedRequest) -> bytes:
    """SaslHandshake or SaslAuthenticate on a listener without SASL: Kafka's
    errors (no mechanism is offered; no exchange is under way)."""
    if request.header.api_key == SASL_HANDSHAKE_KEY:
        return encode_response(request.header, _HANDSHAKE_MODULES[request.header.api_version].SaslHandshakeResponse(
            error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=()))
    module = _AUTH_MODULES[request.header.api_version]
    return encode_response(request.header, _auth_response(
        module, ErrorCode.illegal_sasl_state, "this listener does not use SASL; connect with a PLAINTEXT or SSL "
        "security.protocol", b""))
