"""`raftka quorum status --bootstrap-controller HOST:PORT` against three
real controllers: what `kafka-metadata-quorum describe --status` shows,
on either quorum engine (with pysyncobj the same fields come from its
status: term, commit point, match indexes, connections)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cluster.local_quorum import LocalQuorum
from common.wire.ports import free_ports

FAST = {
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "1500",
    "controller.quorum.election.backoff.max.ms": "300",
    "controller.quorum.request.timeout.ms": "1000",
}


def status(address: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftka.cli", "quorum", "status", "--bootstrap-controller",
                           address, *extra], capture_output=True, text=True, timeout=30)


@pytest.fixture(scope="module", params=["raftka", "pysyncobj"])
def quorum(request, tmp_path_factory):
    # pysyncobj keeps its default timeouts: its shorter ones elect too often on a busy machine.
    overrides = FAST if request.param == "raftka" else {"quorum.engine": "pysyncobj"}
    with LocalQuorum(tmp_path_factory.mktemp("quorum-cli"), 3, overrides) as q:
        q.start_all()
        for node_id in q.voters:
            q.wait_listening(node_id)
        q.engine = request.param
        yield q


def settled_status(quorum: LocalQuorum, node_id: int) -> dict:
    """The JSON status once every voter has caught up with the leader."""
    host, port = quorum.voters[node_id]
    deadline = time.monotonic() + 20
    while True:
        out = status(f"{host}:{port}", "--json")
        if out.returncode == 0:
            data = json.loads(out.stdout)
            if all(r["lag"] == 0 for r in data["replicas"]) and data["high_watermark"] > 0:
                return data
        assert time.monotonic() < deadline, out.stderr
        time.sleep(0.2)


def test_any_voter_leads_the_tool_to_the_leader_s_view(quorum):
    views = [settled_status(quorum, node_id) for node_id in quorum.voters]
    leaders = {(v["leader_id"], v["leader_epoch"]) for v in views}
    assert len(leaders) == 1, views
    data = views[0]
    assert data["engine"] == quorum.engine
    assert data["current_voters"] == [1, 2, 3] and data["current_observers"] == []
    statuses = {r["node_id"]: r["status"] for r in data["replicas"]}
    assert statuses[data["leader_id"]] == "Leader"
    assert sorted(statuses.values()) == ["Follower", "Follower", "Leader"]
    assert all(r["log_end_offset"] == data["high_watermark"] for r in data["replicas"])
    # Wall-clock ms of the leader's last contact with each follower: recent.
    now_ms = time.time() * 1000
    assert all(0 <= now_ms - r["last_fetch_timestamp"] < 10_000 for r in data["replicas"]), data["replicas"]


def test_text_output_names_leader_epoch_high_watermark_and_each_replica(quorum):
    data = settled_status(quorum, 1)
    host, port = quorum.voters[2]
    out = status(f"{host}:{port}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line and not line[0].isdigit())
    assert fields["Engine"].strip() == quorum.engine
    assert int(fields["LeaderId"]) == data["leader_id"]
    assert int(fields["LeaderEpoch"]) == data["leader_epoch"]
    assert int(fields["HighWatermark"]) >= data["high_watermark"]
    assert fields["CurrentVoters"].strip() == "[1, 2, 3]"
    rows = [line.split() for line in lines if line[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == [1, 2, 3]
    assert {r[-1] for r in rows} == {"Leader", "Follower"}


def test_an_unreachable_controller_is_reported_not_crashed_on():
    (port,) = free_ports(1)
    out = status(f"127.0.0.1:{port}", "--timeout-ms", "1000")
    assert out.returncode == 2
    assert "cannot connect" in out.stderr
    assert "Traceback" not in out.stderr
