"""`raftka chaos run --quorum-engine pysyncobj`: the queue workload while the
active controller (pysyncobj's leader) is killed, then frozen; nothing
acknowledged is lost and the metadata checks hold.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_chaos_run import SOAK, chaos_run, check_outcome

from chaos.schedule import Shape, make_schedule


@pytest.mark.skipif(not SOAK, reason="a soak: RAFTKA_SOAK=1 (the default suite SIGKILLs pysyncobj's leader under "
                    "writes: tests/quorum/test_process_kill.py)")
def test_a_short_run_killing_and_pausing_pysyncobj_s_leader_finds_nothing(tmp_path: Path) -> None:
    seed, duration = 12, 22
    planned = make_schedule(random.Random(seed), ["kill", "pause"], duration, Shape("kraft", (1, 2, 3), (4, 5, 6), 3))
    assert [(f.kind, f.shape or f.target) for f in planned] == [
        ("kill", "active-controller"), ("pause", "active-controller")], "the schedule changed: pick another seed"
    done = chaos_run(tmp_path, "--quorum-engine", "pysyncobj", "--duration", str(duration), "--nemesis", "kill,pause",
                     "--seed", str(seed), timeout=150)
    report = check_outcome(done, tmp_path, {"kill", "pause"})
    assert report["faults_by_kind"] == {"kill": 1, "pause": 1}
    assert "--quorum-engine pysyncobj" in (tmp_path / "report.md").read_text()
    props = (tmp_path / "cluster" / "controller-1.properties").read_text()
    assert "quorum.engine=pysyncobj" in props


def test_the_partition_nemesis_and_zookeeper_mode_are_refused_with_pysyncobj(tmp_path: Path) -> None:
    for extra in (("--nemesis", "kill,partition"), ("--mode", "zk")):
        done = chaos_run(tmp_path, "--quorum-engine", "pysyncobj", *extra, timeout=60)
        assert done.returncode == 2
        assert "not pysyncobj's own" in done.stderr and "--mode kraft" in done.stderr
