"""`raftka metadata-shell` against the metadata log and snapshots of a live `raftka dev`."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from cluster_testing import ReadyLine, raftka_command, run_cli

from common.wire.ports import free_ports

DEV: dict = {}


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    """A running node whose controller snapshots after every few records, with two topics."""
    data = tmp_path_factory.mktemp("dev")
    port, controller_port = free_ports(2)
    process = subprocess.Popen(
        raftka_command("dev", "--data-dir", str(data / "node"), "--port", str(port),
                       "--controller-port", str(controller_port),
                       "--set", "metadata.log.max.record.bytes.between.snapshots=1"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ReadyLine(process).wait("READY bootstrap=", 120, process)
        bootstrap = f"127.0.0.1:{port}"
        _ok("topics", "create", "--bootstrap-server", bootstrap, "--topic", "orders", "--partitions", "3")
        _ok("topics", "create", "--bootstrap-server", bootstrap, "--topic", "payments", "--partitions", "1",
            "--config", "retention.ms=60000")
        DEV["bootstrap"] = bootstrap
        yield data / "node"
    finally:
        process.terminate()
        process.wait(60)


def _ok(*args: str) -> str:
    out = run_cli(*args)
    assert out.returncode == 0, f"{args}: {out.stderr}"
    return out.stdout


def _shell(source: str, *command: str):
    return run_cli("metadata-shell", "--directory", source, *command)


def test_lists_topics_and_shows_partitions_brokers_and_configs(dev):
    """Read while the node runs: the log is append-only and the shell takes whole batches only."""
    assert _ok("metadata-shell", "--directory", str(dev), "ls", "/topics").split() == ["orders", "payments"]
    assert _ok("metadata-shell", "--directory", str(dev), "ls", "/topics/orders").split() == ["id", "0", "1", "2"]
    partition = _ok("metadata-shell", "--directory", str(dev), "cat", "/topics/orders/2")
    assert "replicas=[1], isr=[1]" in partition and "leader=1," in partition
    brokers = _ok("metadata-shell", "--directory", str(dev), "tree", "/brokers")
    assert "registration: RegisterBrokerRecord(brokerId=1," in brokers and "isFenced: false" in brokers
    # The same directory named three ways: dev data dir, log dir, metadata log dir.
    for source in (dev / "data", dev / "data" / "__cluster_metadata-0"):
        assert _ok("metadata-shell", "-d", str(source), "cat", "/configs/TOPIC/payments/retention.ms") == "60000\n"
    topic_id = _ok("metadata-shell", "-d", str(dev), "cat", "/topics/payments/id").strip()
    assert _ok("metadata-shell", "-d", str(dev), "cat", f"/topicIds/{topic_id}") == "payments\n"


def test_reads_a_snapshot_file_alone(dev):
    directory = dev / "data" / "__cluster_metadata-0"
    deadline = time.monotonic() + 60
    while not (snapshots := sorted(directory.glob("*.checkpoint"))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert snapshots, "the controller wrote no snapshot"
    out = _ok("metadata-shell", "--snapshot", str(snapshots[-1]), "find", "/topics")
    assert "/topics/orders/0" in out.splitlines()
    assert _ok("metadata-shell", "--snapshot", str(snapshots[-1]), "cat", "/local/source").strip() == str(snapshots[-1])
    # The directory: the newest snapshot, then the log after it, which holds a topic made later.
    _ok("topics", "create", "--bootstrap-server", DEV["bootstrap"], "--topic", "refunds", "--partitions", "2")
    assert _ok("metadata-shell", "-d", str(dev), "ls", "/topics").split() == ["orders", "payments", "refunds"]


def test_interactive_prompt_keeps_a_current_directory(dev):
    out = subprocess.run(raftka_command("metadata-shell", "-d", str(dev)), check=False, input="cd /topics/orders\npwd\ncat 0\n"
                         "cd ../payments\nls\ncd /nowhere\nexit\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "/topics/orders\n" in out.stdout and "leader=1," in out.stdout and "id\n0\n" in out.stdout
    assert "cd: /nowhere: no such file or directory" in out.stderr


def test_errors_say_what_is_wrong(dev, tmp_path):
    missing = run_cli("metadata-shell", "--directory", str(tmp_path / "none"), "ls")
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    empty = run_cli("metadata-shell", "--directory", str(tmp_path), "ls")
    assert empty.returncode == 2 and "holds no metadata log" in empty.stderr
    segment = dev / "data" / "__cluster_metadata-0" / "00000000000000000000.log"
    not_snapshot = run_cli("metadata-shell", "--snapshot", str(segment), "ls")
    assert not_snapshot.returncode == 2 and "is not a raftka metadata snapshot" in not_snapshot.stderr
    unknown = _shell(str(dev), "cat", "/topics/orders/7")
    assert unknown.returncode == 1 and "/topics/orders/7: no such file or directory" in unknown.stderr
    assert "is a directory" in _shell(str(dev), "cat", "/topics").stderr
    assert "unknown command 'frob'" in _shell(str(dev), "frob").stderr
    assert "--snapshot" in run_cli("metadata-shell", "--help").stdout
