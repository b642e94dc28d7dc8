"""The listening sockets of a server: bound first, listening later.

A node binds its ports when it starts (`bind_tcp`: the port is taken and
its number known, a client's connect refused and retried) and listens only
once it can serve (`listen_on`), as Kafka opens its client listeners.
Errors name the address, since a node has more than one listener.
`tune_connection` sets up each connection a listener accepts.
"""

from __future__ import annotations

import errno
import socket

import trio

#: What trio.open_tcp_listeners asks for: the system's maximum.
LISTEN_BACKLOG = 0xFFFF


async def bind_tcp(port: int, host: str) -> list[trio.socket.SocketType]:
    """The sockets `trio.open_tcp_listeners` would open, bound but not yet
    listening: the port is taken and its number known, while a client's
    connect is refused (and retried) until `listen_on` them. Errors name the
    address: a node has a Kafka and a controller listener, and "Address
    already in use" alone does not say which port to free."""
    try:
        # An empty host binds every interface (Kafka's `PLAINTEXT://:9092`).
        addresses = await trio.socket.getaddrinfo(host or None, port, type=trio.socket.SOCK_STREAM,
                                                  flags=trio.socket.AI_PASSIVE)
        sockets: list[trio.socket.SocketType] = []
        unsupported: OSError | None = None
        try:
            for family, type_, proto, _name, sockaddr in addresses:
                try:
                    sock = trio.socket.socket(family, type_, proto)
                except OSError as exc:
                    if exc.errno != errno.EAFNOSUPPORT:
                        raise
                    unsupported = exc  # e.g. an IPv6 address on an IPv4-only system
                    continue
                sockets.append(sock)
                # SO_REUSEADDR binds a port whose last connections wait in
                # TIME_WAIT (a restart). Cleared once bound: Linux lets another
                # SO_REUSEADDR socket bind a port that both flag and neither
                # listens on, so left set it would not hold the port until
                # `listen_on` (which sets it again, as listen() checks anew).
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                await sock.bind(sockaddr)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        if not sockets:
            raise unsupported or OSError(errno.EADDRNOTAVAIL, "no address to bind")
        return sockets
    except OSError as exc:
        raise OSError(exc.errno, f"{exc.strerror or exc} ({host}:{port})") from None


def listen_on(sockets: list[trio.socket.SocketType]) -> list[trio.SocketListener]:
    """Listen on sockets from `bind_tcp`."""
    for sock in sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.listen(LISTEN_BACKLOG)
    return [trio.SocketListener(sock) for sock in sockets]


async def listen_tcp(port: int, host: str) -> list[trio.SocketListener]:
    """`trio.open_tcp_listeners`, with the address in its error (`bind_tcp`)."""
    sockets = await bind_tcp(port, host)
    try:
        return listen_on(sockets)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise


def tune_connection(sock: socket.socket, send_buffer_bytes: int, receive_buffer_bytes: int) -> None:
    """Kafka's `socket.send.buffer.bytes` and `socket.receive.buffer.bytes`
    on an accepted connection (-1: the kernel's autotuning), and trio's
    16 KiB TCP_NOTSENT_LOWAT lifted: a broker streams large responses."""
    if send_buffer_bytes != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    if receive_buffer_bytes != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    notsent_lowat = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if notsent_lowat is not None:
        # 0: back to the system default (no limit but the send buffer).
        try:
            sock.setsockopt(socket.IPPROTO_TCP, notsent_lowat, 0)
        except OSError:
            pass
