"""A dynamic controller quorum (KIP-853) grown and shrunk under a producer, as an operator runs it:
real `raftka controller` and `raftka broker` processes found through
`controller.quorum.bootstrap.servers`, changed with `raftka quorum
add-controller / remove-controller`, with a confluent-kafka producer writing
all along. The whole story (a broker, a producer, three controllers, a
leader killed) runs with RAFTKA_SOAK=1; the default suite grows and shrinks
a quorum of controllers alone."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.meta_properties import random_cluster_id
from common.wire.ports import free_ports

RAFTKA = [sys.executable, "-m", "raftka.cli"]
CLUSTER_ID = "dynQuorumTestCluster01"
FAST = ("controller.quorum.election.timeout.ms=300\ncontroller.quorum.fetch.timeout.ms=1500\n"
        "controller.quorum.election.backoff.max.ms=300\ncontroller.quorum.request.timeout.ms=1000\n")


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A `raftka` command, run in this process (the same code as the command
    line, without a Python start-up per call); its exit code and output."""
    from raftka.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


class Processes:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.ready: dict[str, threading.Event] = {}

    def start(self, name: str, role: str, config: str) -> None:
        with open(self.tmp / f"{name}.log", "w") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen([*RAFTKA, role, "--config", config], stdout=subprocess.PIPE, stderr=log,
                                    text=True)
        self.procs[name] = proc
        event = self.ready[name] = threading.Event()

        def watch() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("READY"):
                    event.set()

        threading.Thread(target=watch, daemon=True).start()

    def wait_ready(self, name: str, timeout: float = 30) -> None:
        assert self.ready[name].wait(timeout), f"{name} printed no READY line: {(self.tmp / f'{name}.log').read_text()[-2000:]}"

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.procs[name].send_signal(sig)
        self.procs[name].wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def finalized_features(port: int) -> dict[str, int]:
    """The finalized feature levels a broker's ApiVersions v4 answer reports."""
    import trio
    from kio.schema.api_versions.v4.request import ApiVersionsRequest

    from common.wire import open_connection

    async def ask() -> dict[str, int]:
        async with open_connection("127.0.0.1", port, connect_timeout_ms=5000) as conn:
            answer = await conn.request(ApiVersionsRequest(client_software_name="test", client_software_version="1"),
                                        timeout_ms=5000)
        return {f.name: int(f.max_version_level) for f in answer.finalized_features}

    return trio.run(ask)


def remove_voter_via(port: int, voter_id: int):
    """A RemoveRaftVoter sent to `port` (a broker forwards it); the answer."""
    import trio
    from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
    from kio.static.primitive import i32

    from common.wire import open_connection

    async def ask():
        async with open_connection("127.0.0.1", port, connect_timeout_ms=5000) as conn:
            return await conn.request(RemoveRaftVoterRequest(cluster_id=None, voter_id=i32(voter_id),
                                                             voter_directory_id=None), timeout_ms=30000)

    return trio.run(ask)


def describe(port: int) -> dict:
    out = run("quorum", "describe", "--bootstrap-controller", f"127.0.0.1:{port}", "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def controller_configs(tmp_path: Path, ports: dict[int, int], bootstrap: str) -> dict[str, str]:
    configs = {}
    for n, port in ports.items():
        path = tmp_path / f"c{n}.properties"
        path.write_text(f"node.id={n}\nprocess.roles=controller\nlog.dirs={tmp_path}/c{n}\n"
                        f"listeners=CONTROLLER://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n"
                        + bootstrap + FAST)
        configs[f"c{n}"] = str(path)
    return configs


def test_a_standalone_controller_takes_a_second_voter_and_lets_it_go(tmp_path):
    """`format --standalone`, a second controller formatted to join, `quorum
    add-controller` / `remove-controller`, and what `quorum describe` shows."""
    ports = dict(zip((1, 2), free_ports(2), strict=True))
    configs = controller_configs(tmp_path, ports, f"controller.quorum.bootstrap.servers=127.0.0.1:{ports[1]}\n")
    assert run("storage", "format", "-c", configs["c1"], "-t", CLUSTER_ID, "--standalone").returncode == 0
    joining = run("storage", "format", "-c", configs["c2"], "-t", CLUSTER_ID, "--no-initial-controllers")
    assert joining.returncode == 0, joining.stderr
    procs = Processes(tmp_path)
    try:
        for name in ("c1", "c2"):
            procs.start(name, "controller", configs[name])
        for name in ("c1", "c2"):
            procs.wait_ready(name)
        status = until(lambda: (s := describe(ports[1]))["current_observers"] == [2] and s, 30, "2 observing")
        assert status["current_voters"] == [1] and status["leader_id"] == 1
        # The first leader wrote the voter set into the log: the observer's copy names it.
        segment = str(tmp_path / "c2" / "__cluster_metadata-0" / "00000000000000000000.log")
        until(lambda: f"KRAFT_VOTERS voters: [1@127.0.0.1:{ports[1]}/" in run(
            "dump-log", "--print-data-log", segment).stdout, 10, "the voter set in the observer's log")
        out = run("quorum", "add-controller", "--config", configs["c2"])
        assert out.returncode == 0, out.stderr
        again = run("quorum", "add-controller", "--config", configs["c2"])
        assert again.returncode == 1 and "already a voter" in again.stderr
        rows = {r["node_id"]: r for r in describe(ports[2])["replicas"]}
        assert rows[2]["status"] == "Follower" and rows[1]["status"] == "Leader"
        meta = (tmp_path / "c2" / "meta.properties").read_text()
        assert f"directory.id={rows[2]['directory_id']}" in meta
        out = run("quorum", "remove-controller", "--bootstrap-controller", f"127.0.0.1:{ports[1]}",
                  "--controller-id", "2", "--controller-directory-id", rows[2]["directory_id"])
        assert out.returncode == 0, out.stderr
        assert describe(ports[1])["current_voters"] == [1]
    finally:
        procs.stop_all()


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="a broker, a producer and three controllers: "
                    "RAFTKA_SOAK=1 runs it")
def test_a_standalone_controller_grows_to_three_loses_its_leader_and_shrinks_with_every_acked_record_kept(tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition

    ports = free_ports(4)
    cport = {1: ports[0], 2: ports[1], 3: ports[2]}
    bport = ports[3]
    bootstrap = f"controller.quorum.bootstrap.servers=127.0.0.1:{cport[1]}\n"
    configs = controller_configs(tmp_path, cport, bootstrap)
    broker = tmp_path / "b.properties"
    broker.write_text(f"node.id=10\nprocess.roles=broker\nlog.dirs={tmp_path}/b\n"
                      f"listeners=PLAINTEXT://127.0.0.1:{bport}\ncontroller.listener.names=CONTROLLER\n"
                      + bootstrap + FAST + "num.partitions=2\nauto.create.topics.enable=true\n")
    configs["b"] = str(broker)
    formatted = run("storage", "format", "-c", configs["c1"], "-t", CLUSTER_ID, "--standalone")
    assert formatted.returncode == 0 and "Bootstrapping a dynamic quorum with voters 1@" in formatted.stdout, \
        formatted.stderr
    for name, flag in (("c2", "--no-initial-controllers"), ("c3", "--no-initial-controllers"), ("b", None)):
        out = run("storage", "format", "-c", configs[name], "-t", CLUSTER_ID, *([flag] if flag else []))
        assert out.returncode == 0, out.stderr

    procs = Processes(tmp_path)
    acked: list[tuple[int, int, bytes]] = []
    stop = threading.Event()
    errors: list[str] = []
    try:
        procs.start("c1", "controller", configs["c1"])
        procs.wait_ready("c1")
        procs.start("b", "broker", configs["b"])
        procs.wait_ready("b", timeout=60)

        def produce() -> None:
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{bport}", "acks": "all", "linger.ms": 5,
                                 "enable.idempotence": True})

            def delivered(err, msg) -> None:
                if err is None:
                    acked.append((msg.partition(), msg.offset(), msg.value()))
                else:
                    errors.append(str(err))

            i = 0
            while not stop.is_set():
                producer.produce("dyn", value=b"v%06d" % i, on_delivery=delivered)
                producer.poll(0.01)
                i += 1
            producer.flush(30)

        writer = threading.Thread(target=produce)
        writer.start()
        # Two more controllers join as observers, then become voters one at a time.
        for name in ("c2", "c3"):
            procs.start(name, "controller", configs[name])
            procs.wait_ready(name)
        for name in ("c2", "c3"):
            out = run("quorum", "add-controller", "--config", configs[name], timeout=60)
            assert out.returncode == 0, out.stderr
            assert "Added controller" in out.stdout
        status = describe(cport[1])
        assert sorted(status["current_voters"]) == [1, 2, 3] and status["leader_id"] == 1
        assert all(r["directory_id"] for r in status["replicas"] if r["node_id"] in (1, 2, 3))
        assert 10 in status["current_observers"]
        # The broker tells clients the quorum is dynamic: kraft.version 1 finalized (ApiVersions v3+).
        assert finalized_features(bport)["kraft.version"] == 1
        # The original leader dies; the grown quorum elects another and metadata still changes.
        procs.kill("c1")
        status = until(lambda: (s := describe(cport[2]))["leader_id"] in (2, 3) and s, 30, "a new leader")
        created = until(lambda: run("topics", "create", "--bootstrap-server", f"127.0.0.1:{bport}", "--topic",
                                    "after-failover", "--partitions", "1").returncode == 0, 30, "a topic created")
        assert created
        # The dead controller leaves the voter set.
        out = run("quorum", "remove-controller", "--bootstrap-controller", f"127.0.0.1:{cport[2]}",
                  "--controller-id", "1", timeout=60)
        assert out.returncode == 0, out.stderr
        assert sorted(describe(cport[2])["current_voters"]) == [2, 3]
        # A second removal of the same voter is refused, saying why.
        again = run("quorum", "remove-controller", "--bootstrap-controller", f"127.0.0.1:{cport[2]}",
                    "--controller-id", "1", timeout=60)
        assert again.returncode == 1 and "is not a voter" in again.stderr
        # A broker forwards the voter APIs to the leader, as Kafka's do.
        forwarded = remove_voter_via(bport, 1)
        assert (int(forwarded.error_code), "is not a voter" in (forwarded.error_message or "")) == (127, True)
        stop.set()
        writer.join(60)
        assert acked, f"the producer got no acks ({errors[:3]})"
        # Every acknowledged record is readable.
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{bport}", "group.id": "check",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        partitions = sorted({p for p, _, _ in acked})
        consumer.assign([TopicPartition("dyn", p, 0) for p in partitions])
        want = {(p, o): v for p, o, v in acked}
        seen: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 30
        while not want.keys() <= seen.keys() and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen[(msg.partition(), msg.offset())] = msg.value()
        consumer.close()
        missing = [k for k in want if seen.get(k) != want[k]]
        assert not missing, f"{len(missing)} of {len(want)} acked records unreadable, e.g. {missing[:3]}"
    finally:
        stop.set()
        procs.stop_all()


def test_format_refuses_what_cannot_start_a_dynamic_quorum_and_says_what_to_do(tmp_path):
    static = tmp_path / "static.properties"
    static.write_text(f"node.id=1\nprocess.roles=controller\nlog.dirs={tmp_path}/s\n"
                      "controller.quorum.voters=1@127.0.0.1:9093\n")
    out = run("storage", "format", "-c", str(static), "-t", CLUSTER_ID, "--standalone")
    assert out.returncode == 2 and "controller.quorum.bootstrap.servers" in out.stderr
    configs = controller_configs(tmp_path, {1: 19093}, "controller.quorum.bootstrap.servers=127.0.0.1:19093\n")
    other = run("storage", "format", "-c", configs["c1"], "-t", CLUSTER_ID,
                "--initial-controllers", "2@127.0.0.1:19094:" + "A" * 22)
    assert other.returncode == 2 and "does not name this node (node.id=1)" in other.stderr
    bad = run("storage", "format", "-c", configs["c1"], "-t", CLUSTER_ID, "--initial-controllers", "1@host:19093")
    assert bad.returncode == 2 and "ID@HOST:PORT:DIRECTORY-ID" in bad.stderr
    both = tmp_path / "both.properties"
    both.write_text(static.read_text() + "controller.quorum.bootstrap.servers=127.0.0.1:9093\n")
    refused = run("storage", "format", "-c", str(both), "-t", CLUSTER_ID, "--standalone")
    assert refused.returncode == 2 and "are both set" in refused.stderr
    # Every listed controller gets its own directory id, and the voter set at offset 0.
    directory = random_cluster_id()  # the form `raftka storage random-uuid` prints
    ok = run("storage", "format", "-c", configs["c1"], "-t", CLUSTER_ID,
             "--initial-controllers", f"1@127.0.0.1:19093:{directory},2@127.0.0.1:19094:{'C' * 22}")
    assert ok.returncode == 0, ok.stderr
    assert f"directory.id={directory}" in (tmp_path / "c1" / "meta.properties").read_text()
    assert (tmp_path / "c1" / "__cluster_metadata-0" / "00000000000000000000-0000000000.checkpoint").exists()


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="two more controller processes: RAFTKA_SOAK=1 runs it")
def test_a_static_quorum_becomes_dynamic_with_a_kraft_version_upgrade_and_then_grows(tmp_path):
    ports = free_ports(3)
    static = tmp_path / "c1.properties"
    static.write_text(f"node.id=1\nprocess.roles=controller\nlog.dirs={tmp_path}/c1\n"
                      f"controller.quorum.voters=1@127.0.0.1:{ports[0]}\n" + FAST)
    configs = controller_configs(tmp_path, {2: ports[1]}, f"controller.quorum.bootstrap.servers=127.0.0.1:{ports[0]}\n")
    assert run("storage", "format", "-c", str(static), "-t", CLUSTER_ID).returncode == 0
    assert run("storage", "format", "-c", configs["c2"], "-t", CLUSTER_ID, "--no-initial-controllers").returncode == 0
    broker = tmp_path / "b.properties"
    broker.write_text(f"node.id=10\nprocess.roles=broker\nlog.dirs={tmp_path}/b\n"
                      f"listeners=PLAINTEXT://127.0.0.1:{ports[2]}\n"
                      f"controller.quorum.voters=1@127.0.0.1:{ports[0]}\n" + FAST)
    assert run("storage", "format", "-c", str(broker), "-t", CLUSTER_ID).returncode == 0
    procs = Processes(tmp_path)
    try:
        procs.start("c1", "controller", str(static))
        procs.wait_ready("c1")
        procs.start("b", "broker", str(broker))
        procs.wait_ready("b", timeout=60)
        assert "kraft.version" not in finalized_features(ports[2])  # level 0: not listed
        procs.start("c2", "controller", configs["c2"])
        procs.wait_ready("c2")
        refused = run("quorum", "add-controller", "--config", configs["c2"])
        assert refused.returncode == 1 and "--feature kraft.version=1" in refused.stderr
        upgraded = run("features", "upgrade", "--bootstrap-controller", f"127.0.0.1:{ports[0]}",
                       "--feature", "kraft.version=1")
        assert upgraded.returncode == 0, upgraded.stderr
        added = run("quorum", "add-controller", "--config", configs["c2"])
        assert added.returncode == 0, added.stderr
        assert sorted(describe(ports[0])["current_voters"]) == [1, 2]
        # The broker, still configured with controller.quorum.voters, reports the new level
        # from the next metadata change on.
        assert run("topics", "create", "--bootstrap-server", f"127.0.0.1:{ports[2]}", "--topic", "after-upgrade",
                   "--partitions", "1").returncode == 0
        until(lambda: finalized_features(ports[2]).get("kraft.version") == 1, 15, "kraft.version 1 on the broker")
    finally:
        procs.stop_all()
