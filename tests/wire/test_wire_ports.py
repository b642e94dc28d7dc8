"""`free_ports`: ports for processes that bind them later, out of the kernel's ephemeral range."""

import socket
from pathlib import Path

import pytest

from common.wire.ports import LOWEST_PORT, PortPicker, free_ports


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_are_distinct_bindable_and_below_the_range_outgoing_connections_use():
    low, _ = _ephemeral_range()
    if low < LOWEST_PORT + 100:
        pytest.skip(f"this machine's ephemeral range starts at {low}: free_ports falls back to port 0")
    ports = free_ports(5) + free_ports(5)
    assert len(set(ports)) == 10
    for port in ports:
        assert LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_something_listens_on_is_skipped():
    picker = PortPicker()
    (port,) = picker.pick(1, "127.0.0.1")
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        again = PortPicker(start=port).pick(2, "127.0.0.1")
    assert port not in again  # it was next in turn, but taken
    assert len(set(again)) == 2
