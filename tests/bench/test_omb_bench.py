"""`raftka bench omb --workload FILE`: an OMB workload YAML run against a real cluster, its OMB result
file read back by `raftka report --import-omb`, and workload files that are wrong."""

from __future__ import annotations

import json
import os

from bench.report.omb import import_omb
from bench.results import read_rows
from tests.bench.scenarios_testing import run_bench

TINY = """\
# one topic, two partitions, 100-byte messages
name: tiny-100b
topics: 1
partitionsPerTopic: 2
messageSize: 100
payloadFile: "payload/payload-100b.data"
subscriptionsPerTopic: 1
consumerPerSubscription: 1
producersPerTopic: 1
producerRate: 1000
producerStartRate: 10000
consumerBacklogSizeGB: 0
testDurationMinutes: 15
warmupDurationMinutes: 5
"""


def test_omb_workload_runs_and_its_result_round_trips(tmp_path):
    workload = tmp_path / "tiny.yaml"
    workload.write_text(TINY)
    results, out = str(tmp_path / "results"), tmp_path / "omb"
    proc = run_bench("omb", "--workload", str(workload), "--duration-s", "3", "--warmup-s", "0.5",
                     "--results", results, "--out-dir", str(out), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What the workload asks for and the bench does not do is said, not silently dropped.
    assert "producerRate 1000" in proc.stdout and "consumers" in proc.stdout
    assert "producerStartRate 10000" in proc.stdout  # a field of OMB's forks: read, not run
    (name,) = os.listdir(out)
    assert name.startswith("tiny-100b-raftka-") and name.endswith(".json")
    result = json.loads((out / name).read_text())
    assert result["workload"] == "tiny-100b" and result["messageSize"] == 100
    assert result["partitions"] == 2 and result["topics"] == 1 and result["producersPerTopic"] == 1
    # Per-second publish rates over the measured 3 s (a partial last second is dropped).
    assert len(result["publishRate"]) >= 2 and all(r > 0 for r in result["publishRate"])
    quantiles = [result[f"aggregatedPublishLatency{q}pct"] for q in ("50", "99", "999", "9999")]
    assert 0 < quantiles[0] <= quantiles[1] <= quantiles[2] <= quantiles[3] <= result["aggregatedPublishLatencyMax"]
    produce = [r for r in read_rows(results) if r["scenario"] == "produce"]
    assert json.loads(produce[0]["params"])["workload"] == "tiny-100b"
    assert {"produce_records_per_s", "produce_latency_p99"} <= {r["metric"] for r in produce}

    # What `raftka report --import-omb` runs before the (Spark) report: the file reads back.
    assert len(import_omb(results, [str(out / name)], "raftka-omb")) == 1
    rows = {r["metric"]: r for r in read_rows(results) if r["scenario"] == "omb"}
    assert json.loads(rows["produce_latency_p99"]["params"])["system"] == "raftka-omb"
    assert rows["produce_latency_p99"]["value"] == result["aggregatedPublishLatency99pct"]
    mean_rate = sum(result["publishRate"]) / len(result["publishRate"])
    assert abs(rows["produce_records_per_s"]["value"] - mean_rate) < 1e-6 * mean_rate


def test_bad_workload_file_names_the_field(tmp_path):
    cases = {
        "messageSize: 100\n": "messageSize",  # replaced below: a missing required field
        "messageSize: big\n": "messageSize must be int, not 'big'",
        "messageSize: 0\n": "messageSize must be at least 1",
        "messageSize: 100\nmesageSize: 100\n": "unknown workload field 'mesageSize'",
    }
    for i, (size_lines, expected) in enumerate(cases.items()):
        text = TINY.replace("messageSize: 100\n", size_lines)
        if i == 0:
            text = TINY.replace("messageSize: 100\n", "")
            expected = "no 'messageSize'"
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        proc = run_bench("omb", "--workload", str(path), "--results", str(tmp_path / "results"), timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert expected in proc.stderr and str(path) in proc.stderr, proc.stderr
