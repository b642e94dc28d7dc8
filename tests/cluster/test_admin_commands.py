"""The kafka-*.sh-style commands against a live `raftka dev`, checked on their output:
storage format's short options, consumer-groups, records delete, log-dirs describe."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer

from cluster_testing import ReadyLine, raftka_command, run_cli
from common.wire.ports import free_ports

DATA: dict = {}
COMMANDS = [("dump-log", None), ("metadata-shell", None), ("storage", "format"), ("configs", "describe"), ("configs", "alter"), ("consumer-groups", "list"),
            ("consumer-groups", "describe"), ("consumer-groups", "delete"), ("consumer-groups", "reset-offsets"),
            ("records", "delete"), ("log-dirs", "describe"), ("log-dirs", "move")]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    data = tmp_path_factory.mktemp("dev")
    port, controller_port = free_ports(2)
    process = subprocess.Popen(
        raftka_command("dev", "--data-dir", str(data / "node"), "--port", str(port),
                       "--controller-port", str(controller_port)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        ReadyLine(process).wait("READY bootstrap=", 120, process)
        DATA["dir"] = data / "node" / "data"
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(60)


def _ok(*args: str) -> str:
    out = run_cli(*args)
    assert out.returncode == 0, f"{args}: {out.stderr}"
    return out.stdout


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()[1:]]


@pytest.mark.parametrize("group,command", COMMANDS)
def test_every_command_has_help(group, command):
    assert "usage:" in _ok(*[a for a in (group, command) if a], "--help")


def test_storage_format_takes_kafkas_short_options(tmp_path):
    config = tmp_path / "server.properties"
    config.write_text(f"process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:9093\n"
                      f"listeners=PLAINTEXT://127.0.0.1:9092\nlog.dirs={tmp_path / 'data'}\n")
    _ok("storage", "format", "-t", "MkU3OEVBNTcwNTJENDM2Qk", "-c", str(config))
    assert "cluster.id=MkU3OEVBNTcwNTJENDM2Qk" in (tmp_path / "data" / "meta.properties").read_text()
    _ok("storage", "format", "-t", "MkU3OEVBNTcwNTJENDM2Qk", "-c", str(config), "-g")


def test_consumer_groups_and_records_commands(bootstrap):
    _ok("topics", "create", "--bootstrap-server", bootstrap, "--topic", "cmd", "--partitions", "2")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        producer.produce("cmd", b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "readers", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["cmd"])
    read, deadline = 0, time.monotonic() + 60
    while read < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        read += message is not None and message.error() is None
    consumer.commit(asynchronous=False)
    consumer.close()

    assert "readers" in _ok("consumer-groups", "list", "-b", bootstrap).split()
    assert _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--state", "Empty")) == [["readers", "Empty"]]
    assert _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--type", "classic", "--state")) == [
        ["readers", "Classic", "Empty"]]
    assert _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "readers")) == [
        ["readers", "cmd", "0", "10", "10", "0", "-", "-", "-"],
        ["readers", "cmd", "1", "10", "10", "0", "-", "-", "-"]]

    def new_offsets(*spec: str) -> list[list[str]]:
        return _rows(_ok("consumer-groups", "reset-offsets", "-b", bootstrap, "--group", "readers", *spec))

    # --dry-run (the default) prints and commits nothing.
    assert new_offsets("--topic", "cmd", "--shift-by", "-3") == [["readers", "cmd", "0", "7"], ["readers", "cmd", "1", "7"]]
    assert new_offsets("--topic", "cmd:1", "--to-offset", "99", "--dry-run") == [["readers", "cmd", "1", "10"]]
    assert new_offsets("--all-topics", "--to-earliest") == [["readers", "cmd", "0", "0"], ["readers", "cmd", "1", "0"]]
    assert new_offsets("--all-topics", "--to-datetime", "2000-01-01T00:00:00.000") == [
        ["readers", "cmd", "0", "0"], ["readers", "cmd", "1", "0"]]
    assert new_offsets("--all-topics", "--by-duration", "PT0S") == [
        ["readers", "cmd", "0", "10"], ["readers", "cmd", "1", "10"]]
    committed = _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "readers"))
    assert [row[3] for row in committed] == ["10", "10"]
    # --execute commits.
    new_offsets("--topic", "cmd:0", "--to-offset", "4", "--execute")
    committed = _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "readers"))
    assert [(row[2], row[3], row[5]) for row in committed] == [("0", "4", "6"), ("1", "10", "0")]
    bad = run_cli("consumer-groups", "reset-offsets", "-b", bootstrap, "--group", "readers", "--all-topics",
                  "--by-duration", "one hour")
    assert bad.returncode == 2 and "ISO-8601" in bad.stderr

    out = _ok("records", "delete", "-b", bootstrap, "--topic", "cmd", "--partition", "0", "--offset", "6")
    assert "partition: cmd-0\tlow_watermark: 6" in out
    # The group's committed offset 4 is now below the log start: to-earliest clamps to 6.
    assert new_offsets("--topic", "cmd:0", "--to-earliest") == [["readers", "cmd", "0", "6"]]

    dirs = json.loads(_ok("log-dirs", "describe", "-b", bootstrap, "--topic-list", "cmd"))
    (broker,) = dirs["brokers"]
    (log_dir,) = broker["logDirs"]
    assert sorted(p["partition"] for p in log_dir["partitions"]) == ["cmd-0", "cmd-1"]
    assert all(p["size"] > 0 and p["offsetLag"] == 0 for p in log_dir["partitions"])

    assert "was successful" in _ok("consumer-groups", "delete", "-b", bootstrap, "--group", "readers")
    assert "readers" not in _ok("consumer-groups", "list", "-b", bootstrap).split()


def test_dump_log_prints_batches_records_indexes_and_metadata(bootstrap):
    _ok("topics", "create", "--bootstrap-server", bootstrap, "--topic", "dumped", "--partitions", "1")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        producer.produce("dumped", key=b"k%d" % i, value=b"value-%d" % i, timestamp=1700000000000 + i)
        producer.flush(30)
    segment = DATA["dir"] / "dumped-0" / "00000000000000000000"
    out = _ok("dump-log", "--files", f"{segment}.log", "--print-data-log")
    batches = [line for line in out.splitlines() if line.startswith("baseOffset:")]
    records = [line for line in out.splitlines() if line.startswith("| offset:")]
    assert [line.split()[1] for line in batches] == ["0", "1", "2"]
    assert "| offset: 1 CreateTime: 1700000000001 keySize: 2 valueSize: 7" in records[1]
    assert records[2].endswith("key: k2 payload: value-2")
    only_batches = _ok("dump-log", f"{segment}.log")
    assert "| offset:" not in only_batches and "baseOffset: 2 lastOffset: 2 count: 1" in only_batches
    metadata = _ok("dump-log", "-p", str(DATA["dir"] / "__cluster_metadata-0" / "00000000000000000000.log"))
    assert "controlType: LEADER_CHANGE" in metadata
    assert "payload: TopicRecord(name='dumped'" in metadata


def test_dump_log_reads_offset_and_time_indexes(tmp_path):
    import struct

    index = tmp_path / "00000000000000000100.index"
    index.write_bytes(struct.pack(">iiii", 0, 0, 7, 4096) + bytes(16))  # a preallocated tail of zeros
    time_index = tmp_path / "00000000000000000100.timeindex"
    time_index.write_bytes(struct.pack(">qi", 1700000000000, 7) + bytes(12))
    assert _ok("dump-log", str(index)).splitlines()[1:] == ["offset: 100 position: 0", "offset: 107 position: 4096"]
    assert _ok("dump-log", str(time_index)).splitlines()[1:] == ["timestamp: 1700000000000 offset: 107"]


def test_consumer_groups_commands_on_a_consumer_protocol_group(bootstrap):
    """Two librdkafka consumers with group.protocol=consumer (KIP-848): listed
    as type Consumer, described with their partitions and epochs; once they
    close, reset-offsets rewinds the empty group and a new member resumes there."""
    import argparse
    import threading

    import trio
    from kio.schema.describe_groups.v6 import request as dg
    from kio.schema.errors import ErrorCode

    from raftka import wire_cli

    _ok("topics", "create", "--bootstrap-server", bootstrap, "--topic", "kip848", "--partitions", "4")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(40):
        producer.produce("kip848", b"v%d" % i, partition=i % 4)
    assert producer.flush(30) == 0
    config = {"bootstrap.servers": bootstrap, "group.id": "kip848-readers", "group.protocol": "consumer",
              "auto.offset.reset": "earliest", "enable.auto.commit": False}
    stop, read, lock = threading.Event(), [], threading.Lock()

    def member(name: str) -> None:
        consumer = Consumer({**config, "client.id": name})
        consumer.subscribe(["kip848"])
        try:
            while not stop.is_set():
                message = consumer.poll(0.1)
                if message is not None and message.error() is None:
                    with lock:
                        read.append(message.value())
                    consumer.commit(message, asynchronous=False)
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(n,)) for n in ("m0", "m1")]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            members = _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "kip848-readers",
                                "--members", "--verbose"))
            if len(read) == 40 and sorted(int(r[4]) for r in members) == [2, 2]:
                break
            time.sleep(0.5)
        assert sorted(r[3] for r in members) == ["m0", "m1"] and sorted(int(r[4]) for r in members) == [2, 2], members
        # Each member's epoch and partitions; reconciled, they are the target's.
        assert all(0 < int(r[5]) <= int(r[7]) and r[6] == r[8] for r in members), members
        (state,) = _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "kip848-readers",
                             "--state", "--verbose"))
        assert state[4] == "Stable" and int(state[5]) >= int(state[6]) == int(members[0][7]) and state[7] == "2", state
        owned = sorted(int(p) for r in members for p in r[6].split(":")[1].split(","))
        assert owned == [0, 1, 2, 3]
        listed = _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--type"))
        assert ["kip848-readers", "Consumer"] in listed and ["readers", "Classic"] not in listed
        assert _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--type", "consumer", "--state")) == [
            ["kip848-readers", "Consumer", "Stable"]]
        assert _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--type", "classic")) == [
            r for r in listed if r[1] == "Classic"]
        # DescribeGroups (the classic API) answers for it as Kafka 4 does: not a classic group.
        described = trio.run(wire_cli.bootstrap_request, argparse.Namespace(bootstrap_server=bootstrap),
                             dg.DescribeGroupsRequest(groups=("kip848-readers",), include_authorized_operations=False))
        (group,) = described.groups
        assert (group.error_code, group.error_message, group.group_state) == (
            ErrorCode.group_id_not_found, "Group kip848-readers is not a classic group.", "Dead")
        rows = _rows(_ok("consumer-groups", "describe", "-b", bootstrap, "--group", "kip848-readers"))
        assert [(r[2], r[3], r[5]) for r in rows] == [(str(p), "10", "0") for p in range(4)]
        assert all(r[6] != "-" for r in rows), rows
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    # Closed, the members left: the group is empty, and its offsets can be reset.
    assert _rows(_ok("consumer-groups", "list", "-b", bootstrap, "--type", "consumer", "--state")) == [
        ["kip848-readers", "Consumer", "Empty"]]
    assert _rows(_ok("consumer-groups", "reset-offsets", "-b", bootstrap, "--group", "kip848-readers",
                     "--topic", "kip848", "--to-earliest", "--execute")) == [
        ["kip848-readers", "kip848", str(p), "0"] for p in range(4)]
    consumer = Consumer({**config, "client.id": "m2"})
    consumer.subscribe(["kip848"])
    again, deadline = [], time.monotonic() + 60
    while len(again) < 40 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            again.append(message.value())
    consumer.close()
    assert sorted(again) == sorted(read), "the new member did not resume at the reset offsets"
    assert "was successful" in _ok("consumer-groups", "delete", "-b", bootstrap, "--group", "kip848-readers")
    assert "kip848-readers" not in _ok("consumer-groups", "list", "-b", bootstrap).split()
