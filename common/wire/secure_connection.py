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
  `SaslGate`, which answers its requests until the exchange is done
  (`authenticated_by`); only then do requests reach the handler.

A PLAINTEXT connection passes through untouched: its socket and file
transfer are returned as they came and no gate is set, so nothing here
runs per request on the plaintext hot path.
"""

from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

import trio

from common.security import ListenerSecurity
from common.security.sasl import ScramLookup
from common.security.tls import TlsSocket, subject_dn
from common.wire.authenticate import SaslGate
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
) -> tuple[socket.socket | TlsSocket, FileTransfer, SaslGate | None] | None:
    """The socket to serve the connection on, how it sends file slices, and
    its SASL gate (None: requests go straight to the handler); or None if
    the TLS handshake failed (logged), and the connection is to be closed."""
    conn_sock: socket.socket | TlsSocket = sock
    if security.tls is not None:
        tls = await _tls_handshake(sock, ctx, security, idle_s, stats, log)
        if tls is None:
            return None
        # The kernel cannot encrypt: file slices are read and encrypted from memory.
        conn_sock, file_transfer = tls, "pread"
    gate = None
    if security.sasl is not None:
        gate = SaslGate(security.sasl, scram_lookup, ctx.peer, log)
    return conn_sock, file_transfer, gate


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


def authenticated_by(gate: SaslGate, ctx: ConnectionContext, request: DecodedRequest) -> bytes:
    """The gate's answer to a request of a connection still in its SASL
    exchange (a RemoteProtocolError, which closes the connection, for any
    other request); once the exchange is done, the connection's principal
    is the authenticated one and `gate.state` is "done"."""
    answer = gate.answer(request)
    if gate.state == "done":
        ctx.principal = gate.principal or ctx.principal
    return answer
