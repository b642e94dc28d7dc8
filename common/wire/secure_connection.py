"""A connection's set-up before its first request: the TLS handshake and the SASL gate.

Theory of operation
-------------------
A listener's `ListenerSecurity` says what a new connection goes through
before the server's reader takes it over (`secure_connection`):

- TLS (SSL and SASL_SSL listeners): the handshake runs first, bounded by
  connections.max.idle.ms so a client that stalls is dropped; a client
  certificate names the principal (`ssl.principal.mapping.rules`). The
  kernel cannot encrypt, so a TLS connection sends file slices read into
  memory ("pread") instead of with sendfile.
- SASL (SASL_PLAINTEXT and SASL_SSL listeners): the connection gets a
  `SaslSession`, whose `SaslGate` answers its requests until the exchange
  is done; only then do requests reach the handler. The session then holds
  the connection to its lifetime (KIP-368) and answers a re-authentication.

A PLAINTEXT connection passes through untouched: its socket and file
transfer are returned as they came and no session is set, so nothing here
runs per request on the plaintext hot path.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

import trio

from common.security import ListenerSecurity
from common.security.sasl import SaslServerConfig, ScramLookup
from common.security.tls import TlsSocket, subject_dn
from common.wire.authenticate import SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY, SaslGate, answer_out_of_exchange
from common.wire.codec import DecodedRequest
from common.wire.connection import ConnectionContext
from common.wire.transmit import FileTransfer

if TYPE_CHECKING:
    from common.wire.server import ServerStats


async def secure_connection(
    sock: socket.socket,
    ctx: ConnectionContext,
    security: ListenerSecurity,
    scram_lookup: ScramLookup | None,
    file_transfer: FileTransfer,
    idle_s: float,
    stats: ServerStats,
    log: logging.Logger,
) -> tuple[socket.socket | TlsSocket, FileTransfer, SaslSession | None] | None:
    """The socket to serve the connection on, how it sends file slices, and
    its SASL session (None: requests go straight to the handler); or None if
    the TLS handshake failed (logged), and the connection is to be closed."""
    conn_sock: socket.socket | TlsSocket = sock
    if security.tls is not None:
        tls = await _tls_handshake(sock, ctx, security, idle_s, stats, log)
        if tls is None:
            return None
        # The kernel cannot encrypt: file slices are read and encrypted from memory.
        conn_sock, file_transfer = tls, "pread"
    session = None
    if security.sasl is not None:
        session = SaslSession(security.sasl, scram_lookup, ctx, stats, log)
    return conn_sock, file_transfer, session


async def _tls_handshake(
    sock: socket.socket, ctx: ConnectionContext, security: ListenerSecurity, idle_s: float,
    stats: ServerStats, log: logging.Logger,
) -> TlsSocket | None:
    """The TLS connection once its handshake is done (the principal set
    from a client certificate), or None after logging why it failed. A
    client that stalls is dropped after connections.max.idle.ms."""
    assert security.tls is not None
    tls = TlsSocket(sock, security.tls)
    with trio.move_on_after(idle_s) as scope:
        try:
            await tls.handshake()
        except (ssl.SSLError, OSError) as exc:
            stats.tls_handshake_failures += 1
            reason = getattr(exc, "reason", None) or exc
            log.warning("TLS handshake with %s on listener %s failed: %s", ctx.peer, ctx.listener_name, reason)
            return None
    if scope.cancelled_caught:
        stats.tls_handshake_failures += 1
        log.warning("TLS handshake with %s on listener %s did not finish within "
                    "connections.max.idle.ms=%d; closing", ctx.peer, ctx.listener_name, round(idle_s * 1000))
        return None
    cert = tls.peer_certificate()
    if cert is not None:
        ctx.principal = "User:" + security.principal_mapper.name(subject_dn(cert))
    return tls


class SaslSession:
    """The SASL side of one connection on a SASL listener. States:
    authenticating (`gate` set: its exchange answers the connection's
    requests) -> open (`gate` None: requests go to the handler until
    `deadline`, connections.max.reauth.ms) -> authenticating again on a
    SaslHandshake (a re-authentication, KIP-368), or closed at the first
    other request after the deadline, as Kafka does."""

    def __init__(self, config: SaslServerConfig, lookup: ScramLookup | None, ctx: ConnectionContext,
                 stats: ServerStats, log: logging.Logger) -> None:
        self.config = config
        self.lookup = lookup
        self.ctx = ctx
        self.stats = stats
        self.log = log
        #: The SASL exchange until it completes; None: requests go to the handler.
        self.gate: SaslGate | None = SaslGate(config, lookup, ctx.peer, log)
        #: The mechanism of the connection's SASL session (re-authentication must use it).
        self.mechanism: str | None = None
        #: When the SASL session expires (trio time; None: never).
        self.deadline: float | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def closes(self, request: DecodedRequest) -> bool:
        """Whether the request comes after the session expired with no
        re-authentication: the connection is to be closed (logged here)."""
        if self.gate is not None or request.header.api_key == SASL_HANDSHAKE_KEY:
            return False
        if not self.expired(trio.current_time()):
            return False
        ctx = self.ctx
        self.stats.connections_closed_expired += 1
        self.log.info("closing connection %d from %s: its SASL session (connections.max.reauth.ms) expired "
                      "and the client did not re-authenticate", ctx.connection_id, ctx.peer)
        return True

    def answer(self, request: DecodedRequest) -> bytes | None:
        """The answer to a request the SASL layer takes: one of the exchange
        (a RemoteProtocolError, which closes the connection, for a request
        that does not belong in it), or a stray SaslAuthenticate; None: the
        request is the handler's."""
        key = request.header.api_key
        if self.gate is None and key == SASL_HANDSHAKE_KEY:
            # A re-authentication (KIP-368): a new exchange on the authenticated connection.
            self.stats.sasl_reauthentications += 1
            self.gate = SaslGate(self.config, self.lookup, self.ctx.peer, self.log,
                                 reauthenticating=(self.mechanism, self.ctx.principal))
        gate = self.gate
        if gate is not None:
            reply = gate.answer(request)
            self._opened_by(gate)
            return reply
        if key == SASL_AUTHENTICATE_KEY:
            return answer_out_of_exchange(request)
        return None

    def raw_token(self, token: bytes) -> bytes | None:
        """The size-prefixed answer to a raw SASL token (after SaslHandshake
        v0), or None after a failure (logged): the connection is to be
        closed, as a raw exchange has no way to carry an error."""
        gate = self.gate
        assert gate is not None
        reply = gate.raw_token(token)
        if reply is not None:
            self._opened_by(gate)
        return reply

    def _opened_by(self, gate: SaslGate) -> None:
        """Once the exchange is done: the connection's principal is the
        authenticated one, and its session lasts as long as the client was told."""
        if gate.state != "done":
            return
        self.ctx.principal = gate.principal or self.ctx.principal
        self.gate = None
        self.mechanism = gate.mechanism
        lifetime = gate.session_lifetime_ms
        self.deadline = trio.current_time() + lifetime / 1000 if lifetime else None
