"""The loopback ZooKeeper ensemble launcher: 3 servers keep serving through a leader's death; failures explain themselves."""

import socket
import time

import pytest
from kazoo.client import KazooClient

from quorum.zookeeper.ensemble import ZooKeeperEnsemble, server_mode, zookeeper_missing_reason
from quorum.zookeeper.errors import EnsembleError
from common.wire.ports import free_ports

pytestmark = pytest.mark.skipif(zookeeper_missing_reason() is not None,
                                reason=f"needs a local ZooKeeper: {zookeeper_missing_reason()}")


def test_three_servers_survive_the_leader_and_stop_cleanly(tmp_path):
    ensemble = ZooKeeperEnsemble(tmp_path, 3, tick_time_ms=500, force_sync=False)
    with ensemble:
        assert "server.3=127.0.0.1:" in (tmp_path / "zk1" / "zoo.cfg").read_text()
        assert (tmp_path / "zk2" / "data" / "myid").read_text().strip() == "2"
        zk = KazooClient(ensemble.connect_string, timeout=4.0)
        zk.start(10)
        zk.create("/kept", b"v")
        leader = ensemble.leader_id()
        assert leader is not None
        ensemble.stop_server(leader)
        ensemble.wait_serving(20)
        deadline = time.monotonic() + 20
        while ensemble.leader_id() in (None, leader) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ensemble.leader_id() not in (None, leader)
        assert zk.get("/kept")[0] == b"v"  # the client moved to a surviving server
        zk.stop()
        zk.close()
    assert all(s.process is None for s in ensemble.servers)
    assert all(server_mode("127.0.0.1", s.client_port) is None for s in ensemble.servers)


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    (port,) = free_ports(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        ensemble = ZooKeeperEnsemble(tmp_path, 1, base_port=port, tick_time_ms=500)
        with pytest.raises(EnsembleError, match="log tail"):
            ensemble.start(timeout_s=15)
    assert ensemble.servers[0].process is None
