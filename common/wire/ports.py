"""Ports for a local cluster's processes, chosen before the processes start.

A process that is told its port in a config file must be given one that
is still free when it binds, up to seconds later. Picking one by binding
port 0 and closing the socket does not make sure of that: the kernel hands
out the same ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999
by default) to every other bind to port 0 and to the local end of every
outgoing connection, and the tests and benches open thousands of
connections. One of them can take the port in between, and the process
then fails with "Address already in use".

`free_ports` picks below that range instead, where neither can land; only
an explicit bind to that very port can. A port is checked free by binding
it with SO_REUSEADDR, as the servers do (trio's listeners, Java's
ServerSocket), so a port whose last connections wait in TIME_WAIT counts
as free. The ports are taken in turn from a random point of the range, so
one process does not hand out a port twice until it has gone round the
whole range, and two processes picking at once seldom meet. If the
ephemeral range leaves no room below it, port 0 is used, as before.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port handed out: above the registered ports most services use.
LOWEST_PORT = 20000
#: Where the kernel's ephemeral range starts when /proc does not say.
DEFAULT_EPHEMERAL_LOW = 32768


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


class PortPicker:
    """Hands out free ports in turn from `start` (default: a random point)."""

    def __init__(self, start: int | None = None) -> None:
        self._next = start

    def pick(self, count: int, host: str) -> list[int]:
        low, high = LOWEST_PORT, _ephemeral_low()
        if high - low < 2 * count:
            return _kernel_ports(count, host)
        if self._next is None or not low <= self._next < high:
            self._next = random.randrange(low, high)
        ports: list[int] = []
        for _ in range(high - low):
            port, self._next = self._next, low + (self._next + 1 - low) % (high - low)
            if _is_free(host, port):
                ports.append(port)
                if len(ports) == count:
                    return ports
        raise OSError(f"no {count} free ports on {host} between {low} and {high}: "
                      f"stop the processes that listen there, or use port 0")


def _is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_ports(count: int, host: str) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


_picker = PortPicker()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports on `host` that nothing listens on now, for
    processes that will bind them later (see the module's doc)."""
    return _picker.pick(count, host)
