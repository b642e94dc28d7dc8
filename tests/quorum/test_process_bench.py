"""`raftka bench quorum` end to end on small counts: every measurement is
printed as JSON and written as a result row."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.results import read_rows


def test_bench_quorum_measures_writes_failover_and_catch_up(tmp_path):
    results = tmp_path / "results"
    out = subprocess.run(
        [sys.executable, "-m", "raftka.cli", "bench", "quorum", "--duration", "0.5", "--writers", "4",
         "--batch-writers", "2", "--failover-runs", "1", "--catchup-records", "6000", "--snapshot-bytes", "100000",
         "--dir", str(tmp_path), "--results", str(results), "--json"],
        capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    by_metric = {(r["metric"], r.get("write"), r.get("writers")): r for r in rows}
    for write, writers in (("single", 1), ("single", 4), ("batch", 2)):
        assert by_metric[("committed_records_per_s", write, writers)]["value"] > 0
        p50 = by_metric[("commit_latency_p50", write, writers)]["value"]
        assert 0 < p50 <= by_metric[("commit_latency_p99", write, writers)]["value"]
    assert 0 < by_metric[("failover_median", None, None)]["value"] < 30
    catch_up = by_metric[("observer_catch_up", None, None)]
    assert catch_up["records_in_log"] >= 6000
    assert catch_up["snapshot_end_offset"] > 0, "the observer started from a snapshot"
    assert all(r["scenario"] == "quorum" and r["mode"] == "kraft" for r in rows)
    assert {r["metric"] for r in read_rows(str(results))} == {r["metric"] for r in rows}
