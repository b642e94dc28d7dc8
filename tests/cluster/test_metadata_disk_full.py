"""A broker whose disk fills while its copy of the metadata log grows.

Real processes: one controller, one broker whose log dir (data and
metadata log) is a small tmpfs, filled to the last byte. New topics make
the metadata log grow; the broker cannot write it, and stops as a Kafka
broker whose metadata log directory fails does: with one line that names
the directory, the cause and the fix, not a traceback of the close that
failed on the same disk. With the space back it starts again and serves
the topics created meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chaos.nemesis import Disks
from cluster.launcher import LocalCluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


def create_topics(bootstrap: str, names: list[str]) -> None:
    """Ask for the topics; the answers do not matter (the broker may stop first), the metadata does."""
    import concurrent.futures

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, 4, 1) for n in names], operation_timeout=3)
    concurrent.futures.wait(list(futures.values()), timeout=5)


def stopped_within(node, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while node.is_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not node.is_running()


def test_a_full_disk_under_the_metadata_log_stops_the_broker_saying_why_and_it_recovers(tmp_path: Path) -> None:
    log_dir = tmp_path / "cluster" / "broker-2"  # LocalCluster's, made a mount point before it formats it
    disks = Disks({2: log_dir}, size_mb=16)
    disks.set_up()
    cluster = None
    try:
        cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=1)
        broker = cluster.brokers[0]
        assert broker.log_dir == log_dir
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        disks.fill(broker.node_id)
        for batch in range(6):
            create_topics(cluster.bootstrap, [f"t{batch}-{i}" for i in range(20)])
            if stopped_within(broker, 5):
                break
        assert not broker.is_running(), "the broker kept running on a full disk"
        assert broker.process is not None and broker.process.returncode == 2
        output = broker.tail(4000)
        assert "cannot be written (ENOSPC: No space left on device)" in output
        assert "Fix: free space on that disk" in output and "Traceback" not in output
        disks.heal()
        cluster.start(broker.node_id)
        cluster.wait_ready(timeout_s=60)
        from confluent_kafka.admin import AdminClient

        topics = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics
        assert "t0-0" in topics
    finally:
        if cluster is not None:
            cluster.stop_all(timeout_s=20)
        disks.tear_down()
