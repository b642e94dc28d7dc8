"""LinkCutter on real processes: a cut link drops a node's connections to
another node, while a client outside the nodes still gets through; a heal
restores the link; nothing of the cutter is left afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chaos.nemesis import LinkCutter, link_cutting_unavailable
from common.wire.ports import free_ports

pytestmark = pytest.mark.skipif(link_cutting_unavailable() is not None,
                                reason=link_cutting_unavailable() or "")

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"hello"); c.close()
"""
CLIENT = """
import socket, sys
try:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1.5)
    print(c.recv(5).decode())
except OSError as exc:
    print("failed", type(exc).__name__)
"""


def client_from(cutter: LinkCutter, node: int | None, port: int) -> str:
    preexec = None if node is None else (lambda: cutter.preexec(node))
    done = subprocess.run([sys.executable, "-c", CLIENT, str(port)], capture_output=True, text=True, timeout=20,
                          preexec_fn=preexec)
    return done.stdout.strip()


def test_a_cut_link_drops_one_nodes_connections_to_another_until_healed() -> None:
    p1, p2 = free_ports(2)
    cutter = LinkCutter({1: p1, 2: p2}, tag=f"test-{os.getpid()}")
    server = None
    try:
        cutter.set_up()
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(p1)], stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: cutter.preexec(1))
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        assert client_from(cutter, 2, p1) == "hello"

        cutter.cut([(2, 1)])  # one way: node 2's packets to node 1
        assert client_from(cutter, 2, p1).startswith("failed")
        assert client_from(cutter, None, p1) == "hello"  # a client, in no node's cgroup
        assert cutter.heal() > 0  # the SYNs it dropped

        assert client_from(cutter, 2, p1) == "hello"
        cutter.cut([(1, 2)])  # the other way: node 2's SYN arrives, node 1's answer does not
        assert client_from(cutter, 2, p1).startswith("failed")
        cutter.heal()
        assert client_from(cutter, 2, p1) == "hello"
    finally:
        if server is not None:
            server.kill()
            server.wait()
        cutter.tear_down()
    listed = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert cutter.table not in listed
    assert not cutter.group.exists()
