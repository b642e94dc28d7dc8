"""`raftka storage` and `raftka controller` as an operator meets them: a
data dir that belongs elsewhere is refused with a message naming the file
and the fix; a clean stop is quick."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from cluster.local_quorum import LocalQuorum
from common.meta_properties import format_log_dir, read_meta
from common.wire.ports import free_ports

RAFTKA = [sys.executable, "-m", "raftka.cli"]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RAFTKA, *args], capture_output=True, text=True, timeout=timeout)


def controller_config(tmp_path, node_id: int, log_dir) -> str:
    (port,) = free_ports(1)
    path = tmp_path / f"c{node_id}.properties"
    path.write_text(f"node.id={node_id}\nprocess.roles=controller\n"
                    f"controller.quorum.voters={node_id}@127.0.0.1:{port}\nlog.dirs={log_dir}\n")
    return str(path)


def test_random_uuid_prints_a_kafka_style_cluster_id():
    out = run("storage", "random-uuid")
    assert out.returncode == 0
    assert len(out.stdout.strip()) == 22


def test_cluster_ids_never_start_with_a_dash():
    """One id in 64 would, drawn plainly; `--cluster-id -x...` then reads as an option."""
    from common.meta_properties import random_cluster_id

    assert not any(random_cluster_id().startswith("-") for _ in range(5000))


def test_format_writes_meta_properties_once(tmp_path):
    config = controller_config(tmp_path, 4, tmp_path / "data")
    first = run("storage", "format", "--config", config, "--cluster-id", "abcdefghijklmnopqrstuv")
    assert first.returncode == 0, first.stderr
    meta = read_meta(tmp_path / "data")
    directory_id = meta.pop("directory.id")
    assert meta == {"version": "1", "cluster.id": "abcdefghijklmnopqrstuv", "node.id": "4"}
    assert len(directory_id) == 22  # KIP-858: each dir its own random id
    again = run("storage", "format", "--config", config, "--cluster-id", "abcdefghijklmnopqrstuv")
    assert again.returncode == 2 and "--ignore-formatted" in again.stderr
    ignored = run("storage", "format", "--config", config, "--cluster-id", "abcdefghijklmnopqrstuv",
                  "--ignore-formatted")
    assert ignored.returncode == 0
    other = run("storage", "format", "--config", config, "--cluster-id", "zzzzzzzzzzzzzzzzzzzzzz",
                "--ignore-formatted")
    assert other.returncode == 2 and "another cluster" in other.stderr


def test_a_controller_refuses_a_data_dir_of_another_node(tmp_path):
    format_log_dir(tmp_path / "data", "abcdefghijklmnopqrstuv", 1)
    out = run("controller", "--config", controller_config(tmp_path, 2, tmp_path / "data"))
    assert out.returncode == 2
    assert f"{tmp_path / 'data'}/meta.properties" in out.stderr
    assert "node.id=1" in out.stderr and "node.id=2" in out.stderr
    assert "point log.dirs at this node's own directory" in out.stderr


def test_a_controller_refuses_an_unformatted_data_dir(tmp_path):
    out = run("controller", "--config", controller_config(tmp_path, 1, tmp_path / "empty"))
    assert out.returncode == 2
    assert "raftka storage format" in out.stderr


def test_sigterm_stops_a_controller_cleanly_and_it_restarts_on_its_data(tmp_path):
    with LocalQuorum(tmp_path, 1) as quorum:
        quorum.start(1)
        quorum.wait_listening(1)
        time.sleep(0.5)
        started = time.monotonic()
        quorum.kill(1, signal.SIGTERM)
        assert quorum.processes[1].returncode == 0
        assert time.monotonic() - started < 5
        quorum.start(1)
        quorum.wait_listening(1)
        # READY is printed just after the listener opens: give it a moment.
        deadline = time.monotonic() + 10
        while quorum.output_path(1).read_text().count("READY node=1") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert quorum.output_path(1).read_text().count("READY node=1") == 2


def test_a_pysyncobj_controller_names_the_setting_when_its_port_is_taken(tmp_path):
    import socket

    format_log_dir(tmp_path / "data", "abcdefghijklmnopqrstuv", 1)
    config = controller_config(tmp_path, 1, tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with open(config, "a") as f:
            f.write(f"quorum.engine=pysyncobj\nquorum.pysyncobj.port={port}\n")
        out = run("controller", "--config", config)
    assert out.returncode == 2, out.stderr
    assert f"127.0.0.1:{port}" in out.stderr and "quorum.pysyncobj.port" in out.stderr


def test_an_unknown_quorum_engine_is_refused(tmp_path):
    format_log_dir(tmp_path / "data", "abcdefghijklmnopqrstuv", 1)
    config = controller_config(tmp_path, 1, tmp_path / "data")
    with open(config, "a") as f:
        f.write("quorum.engine=etcd\n")
    out = run("controller", "--config", config)
    assert out.returncode == 2
    assert "quorum.engine=etcd" in out.stderr and "raftka, pysyncobj" in out.stderr


def test_a_quorum_mixing_engines_names_the_setting(tmp_path):
    # Controllers 1 and 2 on pysyncobj, 3 on raftka's Raft: 1 and 2 form a
    # majority and serve; 3 never becomes leader; the pysyncobj controllers say
    # which setting to fix, both for 3's Raft requests and for 3's silence on
    # pysyncobj's port.
    with LocalQuorum(tmp_path, 3, {"quorum.engine": "pysyncobj"}) as quorum:
        path = quorum.config_path(3)
        path.write_text(path.read_text().replace("quorum.engine=pysyncobj", "quorum.engine=raftka"))
        quorum.start_all()
        for node_id in quorum.voters:
            quorum.wait_listening(node_id)
        deadline = time.monotonic() + 30
        logs = ""
        while time.monotonic() < deadline:
            logs = quorum.output_path(1).read_text() + quorum.output_path(2).read_text()
            if "every controller must have the same quorum.engine" in logs and "cannot reach controller 3" in logs:
                break
            time.sleep(0.5)
        quorum.stop_all()
    assert "every controller must have the same quorum.engine" in logs
    assert "cannot reach controller 3" in logs and "quorum.engine=pysyncobj" in logs
