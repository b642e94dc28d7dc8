"""`raftka bench omb --workload FILE`: an OMB workload YAML run against a real cluster, its OMB result
file read back by `raftka report --import-omb`, and workload files that are wrong."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from bench.omb_bench import read_workload
from bench.report.omb import export_omb, import_omb
from bench.results import SERIES_DIR, read_rows
from common.errors import RaftkaError
from tests.bench.scenarios_testing import run_bench

TINY = """\
# two topics of two partitions, 100-byte messages, one subscription each
name: tiny-100b
topics: 2
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
    # The default --out-dir, inside --results: the dataset still reads (below) with the JSON there.
    results, out = str(tmp_path / "results"), tmp_path / "results" / "_omb"
    proc = run_bench("omb", "--workload", str(workload), "--duration-s", "2", "--warmup-s", "0.5",
                     "--results", results, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What the workload asks for and the bench does not do is said, not silently dropped.
    assert "producerStartRate 10000" in proc.stdout  # a field of OMB's forks: read, not run
    (name,) = os.listdir(out)
    assert name.startswith("tiny-100b-raftka-") and name.endswith(".json")
    result = json.loads((out / name).read_text())
    assert result["workload"] == "tiny-100b" and result["messageSize"] == 100
    assert result["partitions"] == 2 and result["topics"] == 2 and result["producersPerTopic"] == 1
    assert result["consumersPerTopic"] == 1
    # Per-second publish rates over the measured 2 s (a partial last second is dropped), at the
    # workload's producerRate of 1,000 records/s over both topics (a producer behind schedule catches up).
    rates = result["publishRate"]
    assert len(rates) >= 1 and all(0 < r < 1500 for r in rates), rates
    assert 700 < sum(rates) / len(rates) < 1200, rates
    quantiles = [result[f"aggregatedPublishLatency{q}pct"] for q in ("50", "99", "999", "9999")]
    assert 0 < quantiles[0] <= quantiles[1] <= quantiles[2] <= quantiles[3] <= result["aggregatedPublishLatencyMax"]
    # The consumers read during the measured phase: a consume rate in each second, near the publish rate.
    assert len(result["consumeRate"]) == 2 and all(r > 0 for r in result["consumeRate"]), result["consumeRate"]
    e2e = [result[f"aggregatedEndToEndLatency{q}pct"] for q in ("50", "75", "95", "99", "999", "9999")]
    assert 0 < e2e[0] <= e2e[3] <= e2e[5] <= result["aggregatedEndToEndLatencyMax"], e2e
    assert len(result["endToEndLatency50pct"]) == len(result["consumeRate"]) and all(
        p50 <= p99 for p50, p99 in zip(result["endToEndLatency50pct"], result["endToEndLatency99pct"]))
    produce = [r for r in read_rows(results) if r["scenario"] == "produce"]
    assert json.loads(produce[0]["params"])["workload"] == "tiny-100b"
    metrics = {r["metric"]: r["value"] for r in produce}
    assert {"produce_records_per_s", "produce_latency_p99", "end_to_end_latency_p99"} <= set(metrics)
    # Every record the producers had acknowledged reached the subscription of its topic.
    assert metrics["unconsumed_records"] == 0 and metrics["consume_records_per_s"] > 0
    assert metrics["end_to_end_latency_p50"] <= metrics["end_to_end_latency_p99"]
    # The brokers' CPU in each second of the measured phase, as a series beside the rates.
    run_dir = os.path.join(results, SERIES_DIR, produce[0]["run_id"])
    series = pq.read_table(run_dir).to_pylist()
    cpu = [r for r in series if r["metric"] == "broker_cpu_cores"]
    assert len(cpu) >= 1 and all(r["unit"] == "cores" and 0 <= r["value"] <= os.cpu_count() + 0.5 for r in cpu), cpu
    assert any(r["value"] > 0 for r in cpu)
    assert {"consume_records_per_s", "end_to_end_latency_p99"} <= {r["metric"] for r in series}

    # What `raftka report --import-omb` runs before the (Spark) report: the file reads back.
    assert len(import_omb(results, [str(out / name)], "raftka-omb")) == 1
    rows = {r["metric"]: r for r in read_rows(results) if r["scenario"] == "omb"}
    assert json.loads(rows["produce_latency_p99"]["params"])["system"] == "raftka-omb"
    assert rows["produce_latency_p99"]["value"] == result["aggregatedPublishLatency99pct"]
    mean_rate = sum(result["publishRate"]) / len(result["publishRate"])
    assert abs(rows["produce_records_per_s"]["value"] - mean_rate) < 1e-6 * mean_rate
    assert rows["end_to_end_latency_p99"]["value"] == result["aggregatedEndToEndLatency99pct"]
    mean_consume = sum(result["consumeRate"]) / len(result["consumeRate"])
    assert abs(rows["consume_records_per_s"]["value"] - mean_consume) < 1e-6 * mean_consume
    # `raftka report --export-omb` of the stored run rebuilds the consumer side from its histogram and series.
    (again,) = export_omb(results, str(tmp_path / "exported"), run_ids=[produce[0]["run_id"]])
    again = json.loads(open(again).read())
    assert again["consumeRate"] == result["consumeRate"] and again["consumersPerTopic"] == 1
    assert again["aggregatedEndToEndLatencyMax"] == pytest.approx(result["aggregatedEndToEndLatencyMax"])
    assert again["aggregatedEndToEndLatency99pct"] == pytest.approx(result["aggregatedEndToEndLatency99pct"], rel=0.01)


def test_bad_workload_file_names_the_field(tmp_path):
    size = "messageSize: 100\n"
    cases = [
        (TINY.replace(size, ""), "no 'messageSize'"),
        (TINY.replace(size, "messageSize: big\n"), "messageSize must be int, not 'big'"),
        (TINY.replace(size, "messageSize: 0\n"), "messageSize must be at least 1"),
        (TINY.replace(size, size + "mesageSize: 100\n"), "unknown workload field 'mesageSize'"),
        (TINY.replace(size, size + "messageSize: 200\n"), "messageSize is given twice"),
        (TINY.replace("producerRate: 1000\n", "producerRate: -5\n"), "producerRate must be 0"),
        (TINY.replace("consumerBacklogSizeGB: 0\n", "consumerBacklogSizeGB: 1\n"), "set consumerBacklogSizeGB: 0"),
        (TINY.replace(size, "messageSize: 4\n"), "use messageSize: 8 or more"),
        (TINY.replace("consumerPerSubscription: 1\n", "consumerPerSubscription: 0\n"),
         "give each subscription at least one consumer"),
    ]
    for i, (text, expected) in enumerate(cases):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(text)
        with pytest.raises(RaftkaError) as exc:
            read_workload(str(path))
        assert expected in str(exc.value) and str(path) in str(exc.value), (expected, str(exc.value))
    # The command says it in one line and exits 2 before starting any cluster.
    proc = run_bench("omb", "--workload", str(tmp_path / "bad1.yaml"), "--results", str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2 and "messageSize must be int, not 'big'" in proc.stderr, proc.stdout + proc.stderr
    assert "cluster up" not in proc.stdout
