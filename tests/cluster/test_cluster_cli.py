"""The command line as users run it: `raftka dev`, `raftka topics`, `raftka cluster up`
stopping on SIGTERM, and start-up errors that name what to fix."""

import os
import signal
import socket
import subprocess

import pytest

from broker_testing import check_round_trip, workload
from cluster_testing import (
    ClusterUp,
    ReadyLine,
    confluent_consume,
    confluent_produce,
    pid_alive,
    raftka_command,
    run_cli,
)
from common.meta_properties import format_log_dir
from common.wire.ports import free_ports


def start_dev(data_dir):
    process = subprocess.Popen(raftka_command("dev", "--data-dir", str(data_dir), "--port", "0"),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    reader = ReadyLine(process)
    try:
        bootstrap = reader.wait("READY bootstrap=", 60, process).split("=", 1)[1]
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, bootstrap


def stop(process) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_dev_node_serves_clients_and_keeps_topics_across_restarts(tmp_path):
    process, bootstrap = start_dev(tmp_path / "dev")
    try:
        created = run_cli("topics", "create", "--bootstrap-server", bootstrap, "--topic", "events",
                          "--partitions", "2", "--config", "retention.ms=3600000")
        assert created.returncode == 0, created.stderr
        again = run_cli("topics", "create", "--bootstrap-server", bootstrap, "--topic", "events")
        assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
        records = workload(500)
        confluent_produce(bootstrap, "events", records, "all")
    finally:
        assert stop(process) == 0
    assert (tmp_path / "dev" / "data" / ".kafka_cleanshutdown").exists()

    process, bootstrap = start_dev(tmp_path / "dev")
    try:
        listed = run_cli("topics", "list", "--bootstrap-server", bootstrap)
        assert listed.stdout.split() == ["events"]
        described = run_cli("topics", "describe", "--bootstrap-server", bootstrap, "--topic", "events")
        assert "PartitionCount: 2" in described.stdout and "retention.ms=3600000" in described.stdout
        check_round_trip(records, confluent_consume(bootstrap, "events", 2, len(records)), 2)
        deleted = run_cli("topics", "delete", "--bootstrap-server", bootstrap, "--topic", "events")
        assert deleted.returncode == 0, deleted.stderr
        # The consumer had a group.id, so its FindCoordinator created the
        # internal `__consumer_offsets`, which Kafka's tool lists too.
        assert run_cli("topics", "list", "--bootstrap-server", bootstrap).stdout.split() == ["__consumer_offsets"]
    finally:
        assert stop(process) == 0


def test_sigterm_of_cluster_up_stops_every_process_cleanly(tmp_path):
    up = ClusterUp(tmp_path / "data", 1, 2)
    try:
        up.start()
        pids = up.node_pids()
        assert len(pids) == 3
        assert up.stop() == 0
        assert [pid for pid in pids.values() if pid_alive(pid)] == []
        for log_dir in up.broker_log_dirs():
            assert (log_dir / ".kafka_cleanshutdown").exists(), f"{log_dir} was not shut down cleanly"
        assert "stopped" in up.stderr_path.read_text()
    finally:
        up.kill_everything()


def broker_config(tmp_path, **keys) -> str:
    controller_port, broker_port = free_ports(2)
    props = {"node.id": "4", "process.roles": "broker", "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
             "listeners": f"PLAINTEXT://127.0.0.1:{broker_port}", "log.dirs": str(tmp_path / "broker-4"), **keys}
    path = tmp_path / "broker.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return str(path)


@pytest.mark.parametrize("case", ["bad value", "meta.properties of another node", "unformatted dir",
                                  "heartbeat not below session", "listener port", "voter port"])
def test_broker_start_up_errors_name_what_to_fix(tmp_path, case):
    keys = {"bad value": {"num.partitions": "six"}, "heartbeat not below session":
            {"broker.heartbeat.interval.ms": "9000"},
            # The OS would take 70000 as 4464 (70000 - 65536), silently.
            "listener port": {"listeners": "PLAINTEXT://127.0.0.1:70000"},
            "voter port": {"controller.quorum.voters": "1@127.0.0.1:0"}}.get(case, {})
    config = broker_config(tmp_path, **keys)
    if case != "unformatted dir":
        format_log_dir(tmp_path / "broker-4", "test-cluster", 5 if case.startswith("meta") else 4)
    result = run_cli("broker", "--config", config, timeout=30)
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"raftka broker: {config}: ")
    expected = {
        "bad value": "num.partitions='six' is not an integer",
        "meta.properties of another node": f"{tmp_path / 'broker-4' / 'meta.properties'} says node.id=5",
        "unformatted dir": "raftka storage format",
        "heartbeat not below session": "broker.heartbeat.interval.ms=9000 must be below broker.session.timeout.ms",
        "listener port": "listeners: port 70000 in 'PLAINTEXT://127.0.0.1:70000' is out of range: use 0-65535",
        "voter port": "controller.quorum.voters: port 0 in '1@127.0.0.1:0' is out of range: use 1-65535",
    }[case]
    assert expected in message


@pytest.mark.parametrize("args, says", [
    (("dev", "--port", "70000"), "raftka dev: --port 70000 is out of range: use 0-65535"),
    (("dev", "--controller-port", "0"), "raftka dev: --controller-port 0 is out of range: use 1-65535"),
    (("cluster", "up", "--base-port", "65500"),
     "raftka cluster up: --base-port 65500 would have the nodes listen on ports up to 65905"),
    (("cluster", "up", "--base-port", "-1"), "raftka cluster up: --base-port -1 is not a port"),
    (("cluster", "up", "--data-dir", "{file}/cluster"), "raftka cluster up: --data-dir {file}/cluster: cannot make"),
])
def test_node_command_lines_out_of_range_are_refused_before_anything_starts(tmp_path, args, says):
    """A port over 65535 used to be taken modulo 65536 by the OS (dev
    --port 70000 served on 4464); a --data-dir under a file was a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = tuple(a.format(file=blocker) for a in args)
    if args[0] == "dev":
        args += ("--data-dir", str(tmp_path / "dev"))
    result = run_cli(*args, timeout=30)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert says.format(file=blocker) in " ".join(result.stderr.split()), result.stderr[-3000:]
    assert "READY" not in result.stdout


@pytest.mark.parametrize("taken", ["kafka", "controller"])
def test_a_node_whose_port_is_taken_says_which_port(tmp_path, taken):
    """`raftka dev` has two listeners; "Address already in use" alone left
    the user to guess which port to free."""
    kafka_port, controller_port = free_ports(2)
    busy = kafka_port if taken == "kafka" else controller_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy))
        holder.listen()
        result = run_cli("dev", "--data-dir", str(tmp_path / "dev"), "--port", str(kafka_port),
                         "--controller-port", str(controller_port), timeout=60)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"Address already in use (127.0.0.1:{busy}): another process listens on that port" in result.stderr, \
        result.stderr[-3000:]
