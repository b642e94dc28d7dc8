"""`raftka chaos run` end to end: a real cluster, real clients, real faults.

The default suite runs one short KRaft run with `kill` and `partition` (the
seed's schedule kills the active controller, then isolates a partition
leader from the other nodes while its clients still reach it). With
RAFTKA_SOAK=1, a short `txn` run with the same nemeses, every
combination of nemeses runs the queue workload for RAFTKA_SOAK_SECONDS
(default 300) in KRaft mode and in ZooKeeper mode, four combinations the
txn workload, a 60 s KRaft run with the `eio` nemesis (disks failing
writes) checks that no broker stops, and 90 s runs of the `group` workload
(with the consumer protocol and the classic one) check that a consumer group
receives every acknowledged record.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.history import read_history
from chaos.nemesis import link_cutting_unavailable
from chaos.schedule import NEMESES, Shape, make_schedule

ROOT = Path(__file__).resolve().parents[2]
SOAK = os.environ.get("RAFTKA_SOAK") == "1"
SOAK_SECONDS = float(os.environ.get("RAFTKA_SOAK_SECONDS", "300"))


def chaos_run(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "raftka.cli", "chaos", "run", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def check_outcome(done: subprocess.CompletedProcess[str], out: Path, kinds: set[str]) -> dict:
    assert done.returncode == 0, f"chaos run found anomalies or failed:\n{done.stderr[-4000:]}\n" + (
        (out / "report.md").read_text()[:6000] if (out / "report.md").exists() else "")
    for name in ("history.jsonl", "report.json", "report.md", "report.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] and report["metadata"]["valid"]
    history = read_history(out / "history.jsonl")
    started = [e for e in history if e.process == "nemesis" and e.extra.get("phase") == "start"]
    healed = [e for e in history if e.process == "nemesis" and e.extra.get("phase") == "stop"]
    assert {e.f for e in started} == kinds and len(healed) == len(started)
    for e in healed:
        if e.f == "partition":
            assert e.extra["dropped_packets"] > 0, "a partition that dropped nothing was no partition"
    acked = [e for e in history if e.f == "send" and e.type == "ok"]
    assert len(acked) > 300
    # Records were acknowledged while faults were on, not only around them.
    windows = [(s.mono, h.mono) for s, h in zip(started, healed)]
    assert any(a <= e.mono <= b for e in acked for a, b in windows)
    final = {e.value for e in history if e.f == "final-read"}
    assert {e.value for e in acked} <= final
    return report


@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
def test_a_short_run_with_kills_and_partitions_finds_nothing_and_says_what_it_did(tmp_path: Path) -> None:
    seed, duration = 3, 22
    planned = make_schedule(random.Random(seed), ["kill", "partition"], duration,
                            Shape("kraft", (1, 2, 3), (4, 5, 6), 3))
    assert [(f.kind, f.shape or f.target) for f in planned] == [
        ("kill", "active-controller"), ("partition", "isolate-leader")], "the schedule changed: pick another seed"
    done = chaos_run(tmp_path, "--mode", "kraft", "--controllers", "3", "--brokers", "3", "--duration",
                     str(duration), "--nemesis", "kill,partition", "--seed", str(seed), timeout=110)
    report = check_outcome(done, tmp_path, {"kill", "partition"})
    assert report["faults_by_kind"] == {"kill": 1, "partition": 1}
    assert "raftka chaos run --mode kraft" in (tmp_path / "report.md").read_text()


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1 (the default suite has transactions through SIGKILLs "
                    "and coordinator failover: tests/cluster/test_txn_exactly_once.py, tests/cluster/test_txn_failover.py)")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
def test_a_short_transactional_run_commits_and_aborts_and_read_committed_sees_only_the_commits(
        tmp_path: Path) -> None:
    seed, duration = 3, 22
    done = chaos_run(tmp_path, "--mode", "kraft", "--duration", str(duration), "--nemesis", "kill,partition",
                     "--workload", "txn", "--seed", str(seed), timeout=150)
    report = check_outcome(done, tmp_path, {"kill", "partition"})
    txns = report["checker"]["stats"]["transactions"]
    assert txns["committed"] > 20 and txns["aborted"] > 5, txns
    history = read_history(tmp_path / "history.jsonl")
    committed = {e.value for e in history if e.f == "commit" and e.type == "ok"}
    aborted = {e.value for e in history if e.f == "abort" and e.type == "ok"}
    read_committed = [e for e in history if e.process == "final-confluent-rc" and e.f == "final-read"]
    sent_in = {e.value: e.key for e in history if e.f == "send" and e.type == "invoke"}
    assert {sent_in[e.value] for e in read_committed} == committed
    assert not {sent_in[e.value] for e in read_committed} & aborted


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1 (the default suite has the eio nemesis's "
                    "real-broker test, tests/chaos/test_disk_fault.py)")
def test_a_short_run_with_disks_failing_writes_finds_nothing(tmp_path: Path) -> None:
    done = chaos_run(tmp_path, "--mode", "kraft", "--duration", "60", "--nemesis", "eio", "--seed", "21",
                     timeout=400)
    report = check_outcome(done, tmp_path, {"eio"})
    assert report["checker"]["counts"]["stopped-disk-full"] == 0, "no broker stops on a disk failing its logs' writes"
    logs = "".join(p.read_text() for p in (tmp_path / "cluster").glob("broker-*.log"))
    assert "append failed: [Errno 5] Input/output error" in logs


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1 (the default suite has the real-broker test, "
                    "tests/cluster/test_log_dir_failure.py)")
def test_a_run_where_one_log_dir_of_a_broker_fails_finds_nothing(tmp_path: Path) -> None:
    """Two log dirs per broker: each `eio` fails one, which goes offline;
    its partitions' leaders move; the heal restarts the broker."""
    done = chaos_run(tmp_path, "--mode", "kraft", "--duration", "60", "--nemesis", "eio", "--seed", "31",
                     "--log-dirs", "2", timeout=400)
    check_outcome(done, tmp_path, {"eio"})
    logs = "".join(p.read_text() for p in (tmp_path / "cluster").glob("broker-*.log"))
    assert "-dir2 is offline: Input/output error" in logs
    assert "every log dir is offline" not in logs


COMBINATIONS = [c for n in range(1, len(NEMESES) + 1) for c in itertools.combinations(NEMESES, n)]


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.parametrize("mode", ["kraft", "zk"])
@pytest.mark.parametrize("nemeses", COMBINATIONS, ids=lambda c: "+".join(c))
def test_soak(tmp_path: Path, mode: str, nemeses: tuple[str, ...]) -> None:
    seed = random.Random(f"{mode}{nemeses}").randrange(1_000_000)
    done = chaos_run(tmp_path, "--mode", mode, "--duration", str(SOAK_SECONDS), "--nemesis", ",".join(nemeses),
                     "--seed", str(seed), timeout=SOAK_SECONDS + 600)
    check_outcome(done, tmp_path, set(nemeses))


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.parametrize("mode", ["kraft", "zk"])
@pytest.mark.parametrize("nemeses", [("kill", "pause", "partition"), ("clock", "kill"), ("disk",), ("eio",)],
                         ids=lambda c: "+".join(c))
def test_soak_transactions(tmp_path: Path, mode: str, nemeses: tuple[str, ...]) -> None:
    seed = random.Random(f"txn{mode}{nemeses}").randrange(1_000_000)
    done = chaos_run(tmp_path, "--mode", mode, "--duration", str(SOAK_SECONDS), "--nemesis", ",".join(nemeses),
                     "--workload", "txn", "--seed", str(seed), timeout=SOAK_SECONDS + 600)
    check_outcome(done, tmp_path, set(nemeses))


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
def test_soak_secure(tmp_path: Path) -> None:
    """Every client on SASL_SSL listeners whose sessions last 10 s: re-authentication under kill, pause, partition."""
    out = tmp_path / "secure"
    done = chaos_run(out, "--secure", "--duration", str(SOAK_SECONDS), "--nemesis", "kill,pause,partition",
                     "--seed", "3939", timeout=SOAK_SECONDS + 600)
    check_outcome(done, out, {"kill", "pause", "partition"})
    assert "--secure" in (out / "report.md").read_text()


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
def test_soak_dynamic_quorum_voter_changes(tmp_path: Path) -> None:
    """KIP-853 under faults: controllers leave the voter set and come back while others are killed, paused
    and cut off."""
    nemeses = ("voters", "kill", "pause", "partition")
    done = chaos_run(tmp_path, "--dynamic-quorum", "--duration", str(SOAK_SECONDS), "--nemesis", ",".join(nemeses),
                     "--seed", "8530", timeout=SOAK_SECONDS + 600)
    check_outcome(done, tmp_path, set(nemeses))
    changes = [e for e in read_history(tmp_path / "history.jsonl") if e.process == "nemesis" and e.f == "voters"]
    assert changes and all(e.extra.get("error") is None and not e.extra.get("errors") for e in changes), changes


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
def test_soak_dynamic_quorum_wiped_controllers_replaced(tmp_path: Path) -> None:
    """KIP-853 under faults: a controller's disk is wiped, it is formatted again and swapped in for its old
    identity (remove the old id and directory id, add the new) while others are killed, paused and cut off."""
    nemeses = ("replace", "kill", "pause", "partition")
    done = chaos_run(tmp_path, "--dynamic-quorum", "--duration", str(SOAK_SECONDS), "--nemesis", ",".join(nemeses),
                     "--seed", "8540", timeout=SOAK_SECONDS + 600)
    check_outcome(done, tmp_path, set(nemeses))
    changes = [e for e in read_history(tmp_path / "history.jsonl") if e.process == "nemesis" and e.f == "replace"]
    assert changes and all(e.extra.get("error") is None and not e.extra.get("errors") for e in changes), changes


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1 (the default suite has the online migration and the "
                    "static rollback with real clients, tests/broker/test_group_migration.py)")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
@pytest.mark.parametrize(("protocol", "seed"), [("mixed", 41), ("mixed-static", 43)])
def test_a_group_migrating_between_protocols_under_faults_loses_nothing(tmp_path: Path, protocol: str,
                                                                        seed: int) -> None:
    # One classic member and one restarted every 15 s with the other protocol:
    # the group upgrades to the consumer protocol and downgrades back again and
    # again while controllers and brokers are killed, paused and cut off. With
    # mixed-static (group.instance.id), each consumer-to-classic restart is a
    # static member replacement that turns the group classic again.
    done = chaos_run(tmp_path, "--mode", "kraft", "--duration", "90", "--nemesis", "kill,pause,partition",
                     "--group-protocol", protocol, "--seed", str(seed), timeout=500)
    check_outcome(done, tmp_path, {"kill", "pause", "partition"})
    history = read_history(tmp_path / "history.jsonl")
    opened = {e.process: e.extra.get("protocol") for e in history if e.f == "open" and e.process.startswith("c-group")}
    polled = {e.process for e in history if e.f == "poll" and e.type == "ok"}
    assert {"consumer", "classic"} <= {opened[p] for p in polled if p.startswith("c-group-m")}, opened
    assert "c-group" in polled


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1")
@pytest.mark.skipif(link_cutting_unavailable() is not None, reason=link_cutting_unavailable() or "")
@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_soak_consumer_group_delivers_every_acknowledged_record(tmp_path: Path, protocol: str) -> None:
    """A group of 3 consumers (KIP-848's consumer protocol, or the classic
    one) under kills, pauses and partitions of brokers and controllers: the
    members together receive every acknowledged record (at least once)."""
    done = chaos_run(tmp_path, "--mode", "kraft", "--controllers", "3", "--brokers", "3", "--duration", "90",
                     "--nemesis", "kill,pause,partition", "--workload", "group", "--group-protocol", protocol,
                     "--seed", "7", timeout=700)
    report = check_outcome(done, tmp_path, {"kill", "pause", "partition"})
    (group,) = report["checker"]["stats"]["groups"].values()
    assert group["protocol"] == protocol and group["members"] == 3, group
    assert group["undelivered"] == 0 and group["delivered"] == report["checker"]["stats"]["sends_acknowledged"]
    assert f"--group-protocol {protocol}" in (tmp_path / "report.md").read_text() or protocol == "classic"
