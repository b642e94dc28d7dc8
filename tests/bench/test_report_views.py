"""What `raftka report` shows beyond the per-run tables: comparisons labelled
by the parameter that differs, series inside runs with fault windows, latency
histograms merged across runs, change points across commits, and OpenMessaging
Benchmark results beside raftka's. Synthetic datasets with known answers, and
one real small produce + failover run."""

import json
import os
import random

import pytest
from scenarios_testing import run_bench
from test_bench_report import PNG_MAGIC, T0_MS, cli, md_tables, number

from bench.histogram import LatencyHistogram
from bench.report.changepoints import split_points
from bench.report.omb import read_test_result
from bench.results import (
    read_rows,
    read_samples,
    write_events,
    write_histogram,
    write_rows,
    write_series,
)
from bench.suite import FAST_SESSION

SHAS = [f"{i:02d}" + "abcdef0123" * 4 for i in range(10)]
STEP_AT = 6  # the planted change: commits 6.. run 30 % slower


def omb_result(path, driver="Kafka", size=100):
    """A small OMB result file, as its `TestResult` writes them (fields trimmed to what a run fills)."""
    data = {
        "workload": "1-topic-1-partition-100b", "driver": driver, "messageSize": size, "topics": 1,
        "partitions": 1, "producersPerTopic": 1, "consumersPerTopic": 1,
        "publishRate": [50_000.0, 52_000.0, 48_000.0], "publishErrorRate": [0.0, 0.0, 0.0],
        "consumeRate": [49_990.0, 52_010.0, 48_000.0], "backlog": [0, 0, 0],
        "publishLatencyAvg": [2.1, 2.0, 2.3], "publishLatency50pct": [1.9, 1.8, 2.0],
        "publishLatency99pct": [6.0, 7.5, 6.2], "publishLatencyMax": [20.0, 25.0, 18.0],
        "aggregatedPublishLatencyAvg": 2.1, "aggregatedPublishLatency50pct": 1.9,
        "aggregatedPublishLatency75pct": 2.4, "aggregatedPublishLatency95pct": 4.0,
        "aggregatedPublishLatency99pct": 6.6, "aggregatedPublishLatency999pct": 12.0,
        "aggregatedPublishLatency9999pct": 19.0, "aggregatedPublishLatency99999pct": 24.0,
        "aggregatedPublishLatencyMax": 25.0,
        "aggregatedPublishLatencyQuantiles": {"50.0": 1.9, "99.0": 6.6, "99.9": 12.0},
        "endToEndLatency50pct": [3.0, 3.1, 2.9], "aggregatedEndToEndLatency50pct": 3.0,
        "aggregatedEndToEndLatency99pct": 9.0, "aggregatedEndToEndLatency999pct": 15.0,
        "aggregatedEndToEndLatency9999pct": 22.0, "aggregatedEndToEndLatencyMax": 30.0,
    }
    path.write_text(json.dumps(data))
    return data


def write_views_dataset(results: str) -> dict:
    rng = random.Random(44)
    known: dict = {}
    # A sweep: record size differs, acks and brokers do not; both modes; 2 runs each.
    for i in range(2):
        for mode in ("kraft", "zk"):
            rows = [{"scenario": "produce", "mode": mode, "metric": "produce_records_per_s", "unit": "records/s",
                     "params": {"record_size": size, "acks": "all", "brokers": 1},
                     "value": 100_000 / (1 + size / 1000) * (0.8 if mode == "zk" else 1) * rng.uniform(0.98, 1.02),
                     "timestamp_ms": T0_MS + i * 60_000}
                    for size in (100, 1000, 10000)]
            write_rows(results, rows, run_id=f"sweep-{mode}-{i}")
    # Two runs' latency histograms with known samples.
    a = [rng.lognormvariate(0.5, 0.8) for _ in range(3000)]
    b = [rng.lognormvariate(1.5, 0.5) for _ in range(2000)] + [250.0]
    for run_id, values in (("hist-a", a), ("hist-b", b)):
        write_rows(results, [{"scenario": "produce", "mode": "kraft", "metric": "produce_latency_p99", "unit": "ms",
                              "params": {"record_size": 100, "acks": "all", "brokers": 1},
                              "value": 1.0, "timestamp_ms": T0_MS + 200_000}], run_id=run_id)
        write_histogram(results, run_id, scenario="produce", mode="kraft",
                        params={"record_size": 100, "acks": "all", "brokers": 1},
                        metric="produce_latency", unit="ms", values=values)
    known["b"] = b
    known["merged"] = LatencyHistogram(exact_limit=0)
    known["merged"].record_many(a + b)
    # A history across 10 commits, 2 runs each: a planted step, and a flat noisy metric.
    for c, sha in enumerate(SHAS):
        for r in range(2):
            level = 100.0 if c < STEP_AT else 70.0
            rows = [{"scenario": "storage", "mode": "n/a", "params": {"size_mb": 64}, "metric": metric,
                     "unit": "MB/s", "value": value, "git_sha": sha, "timestamp_ms": T0_MS + 400_000 + c * 10_000 + r}
                    for metric, value in (("log_append_throughput", level * rng.uniform(0.99, 1.01)),
                                          ("log_read_throughput", 200.0 * rng.uniform(0.97, 1.03)))]
            write_rows(results, rows, run_id=f"hist-{c}-{r}")
    # A run with a series and a fault window.
    write_rows(results, [{"scenario": "failover", "mode": "kraft", "params": {"partitions": 3}, "unit": "ms",
                          "metric": "leader_failover_produce_ms_max", "value": 2500.0,
                          "timestamp_ms": T0_MS + 600_000}], run_id="fault-0")
    write_series(results, "fault-0", scenario="failover", mode="kraft", params={"partitions": 3},
                 metric="partitions_writable_again", unit="partitions",
                 points=[(t / 10, 0 if t < 20 else 3) for t in range(40)])
    write_events(results, "fault-0", scenario="failover", mode="kraft", params={"partitions": 3},
                 events=[("kill broker 2", 0.0, 2.5)])
    # Broker CPU of that run, 1,000 points (drawn as at most 401 bin means), and of a run without
    # result rows (no start time: never the last run).
    write_series(results, "fault-0", scenario="failover", mode="kraft", params={"partitions": 3},
                 metric="broker_cpu_cores", unit="cores", points=[(t / 100, 0.5) for t in range(1000)])
    write_series(results, "stray-0", scenario="failover", mode="kraft", params={"partitions": 3},
                 metric="broker_cpu_cores", unit="cores", points=[(t / 100, 1.5) for t in range(1000)])
    return known


@pytest.fixture(scope="module")
def views(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("views")
    results, out, exported = str(tmp / "results"), tmp / "report", tmp / "omb-out"
    known = write_views_dataset(results)
    known["omb"] = omb_result(tmp / "kafka-omb.json")
    assert cli(["report", "--results", results, "--out", str(out), "--import-omb", str(tmp / "kafka-omb.json"),
                "--export-omb", str(exported)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    return {"summary": summary, "out": out, "known": known, "results": results, "exported": exported,
            "markdown": (out / "report.md").read_text()}


def test_a_sweep_figure_labels_the_parameter_that_differs(views):
    summary = views["summary"]
    (plot,) = [p for p in summary["plots"] if p["kind"] == "compare" and p["scenario"] == "produce"]
    assert plot["data"]["vary"] == ["record_size"]
    assert plot["data"]["constants"] == {"acks": "all", "brokers": 1}
    assert plot["data"]["x_labels"] == ["record_size=100", "record_size=1000", "record_size=10000"]
    assert plot["data"]["sides"] == ["kraft", "zk"]
    assert "acks=all, brokers=1" in plot["caption"]
    for p in summary["plots"]:
        assert len(p["file"]) <= 40 and p["file"].startswith(p["scenario"].lower()), p["file"]
        assert (views["out"] / p["file"]).read_bytes()[:8] == PNG_MAGIC
        assert f"{p['title']}*: {p['caption']}" in views["markdown"]
    (line_plot,) = [p for p in summary["plots"] if p["kind"] == "throughput_vs_record_size"]
    assert {line["label"] for line in line_plot["data"]["lines"]} == {"kraft", "zk"}
    assert all(line["points"] == 3 for line in line_plot["data"]["lines"])


def test_histograms_of_two_runs_merge_to_the_histogram_of_all_their_samples(views):
    (merged,) = [m for m in views["summary"]["merged_histograms"] if m["metric"] == "produce_latency"]
    want = views["known"]["merged"]
    assert merged["n_runs"] == 2 and merged["count"] == want.count == 5001
    for name, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p99_9", 99.9), ("p99_99", 99.99)):
        assert merged[name] == want.percentile(p), name
    assert merged["max"] == 250.0 and merged["p99_99"] <= 250.0
    (row,) = md_tables(views["markdown"])["Latency histograms merged across runs (nearest rank, 3 significant digits)"][0]
    assert number(row["p99.99"]) == pytest.approx(want.percentile(99.99), rel=1e-3)
    assert any(p["kind"] == "merged_latency" for p in views["summary"]["plots"])


def test_a_planted_step_is_found_at_its_commit_and_a_flat_noisy_series_has_none(views):
    changes = views["summary"]["change_points"]
    assert [(c["metric"], c["before_sha"], c["after_sha"], c["verdict"]) for c in changes] == [
        ("log_append_throughput", SHAS[STEP_AT - 1], SHAS[STEP_AT], "regression")]
    assert changes[0]["change"] == pytest.approx(-0.3, abs=0.03)
    (table,) = md_tables(views["markdown"])["Change points (1)"]
    assert table[0]["first commit after"] == SHAS[STEP_AT][:10]
    history = [p for p in views["summary"]["plots"] if p["kind"] == "history"]
    assert [p["data"]["change_points"] for p in history if p["data"]["metric"] == "log_append_throughput"] == [
        [{"before_sha": SHAS[STEP_AT - 1], "after_sha": SHAS[STEP_AT]}]]


def test_change_point_search_on_plain_series():
    rng = random.Random(7)
    for _ in range(20):
        flat = [100 * rng.uniform(0.97, 1.03) for _ in range(30)]
        assert split_points(flat, 0.05) == []
    steps = [10.0] * 5 + [20.0] * 5 + [30.0] * 5
    assert split_points(steps, 0.05) == [5, 10]
    # A change smaller than the noise floor is no change point, however clean.
    assert split_points([100.0] * 5 + [103.0] * 5, 0.05) == []


def test_a_series_is_drawn_with_its_fault_window(views):
    plots = {p["data"]["metric"]: p for p in views["summary"]["plots"]
             if p["kind"] == "series" and p["scenario"] == "failover"}
    plot = plots["partitions_writable_again"]
    assert plot["data"]["events"] == [{"event": "kill broker 2", "start_s": 0.0, "end_s": 2.5, "run_id": "fault-0"}]
    assert plot["data"]["lines"][0]["points"] == 40
    # Broker CPU, the last run's: 1,000 points averaged into 400 bins of time (and the last point's own).
    cpu = plots["broker_cpu_cores"]
    assert cpu["data"]["events"] and [line["run_id"] for line in cpu["data"]["lines"]] == ["fault-0"]
    (series,) = [s for s in views["summary"]["series"] if s["metric"] == "broker_cpu_cores"]
    assert 300 <= len(series["points"]) <= 401 and {v for _, v in series["points"]} == {0.5}
    assert series["points"][0][0] == 0.0 and series["points"][-1][0] == pytest.approx(9.99)


def test_an_omb_result_is_imported_beside_raftka_and_raftka_runs_export_as_omb(views):
    summary = views["summary"]
    (entry,) = summary["systems"]
    assert entry["system"] == "Kafka" and entry["params"]["record_size"] == 100
    assert entry["raftka_params"]["record_size"] == 100
    values = {m["metric"]: m for m in entry["metrics"]}
    assert values["produce_records_per_s"]["other"] == pytest.approx(50_000.0)
    assert values["produce_latency_p99_99"]["other"] == 19.0
    assert values["produce_latency_p99_99"]["raftka"] == views["known"]["merged"].percentile(99.99)
    # End-to-end latency beside the producer's: the imported side has it, the sweep's produce runs do not.
    assert values["end_to_end_latency_p99"]["other"] == 9.0 and values["end_to_end_latency_p99"]["raftka"] is None
    sweep = [s for s in summary["stats"] if s["scenario"] == "produce" and s["mode"] == "kraft"
             and s["metric"] == "produce_records_per_s" and s["params"]["record_size"] == 100]
    assert values["produce_records_per_s"]["raftka"] == sweep[0]["median"]
    tables = md_tables(views["markdown"])
    (table,) = next(t for title, t in tables.items() if title.startswith("Kafka (1-topic-1-partition-100b)"))
    assert number(table[0]["Kafka"]) == pytest.approx(50_000.0)
    assert number(next(r for r in table if r["measurement"] == "end-to-end latency p99")["Kafka"]) == 9.0
    assert "Not mapped: publishErrorRate" in views["markdown"]
    assert any(p["kind"] == "systems" for p in summary["plots"])
    series = [s for s in summary["series"] if s["scenario"] == "omb" and s["metric"] == "produce_records_per_s"]
    assert series[0]["points"] == [[10.0, 50_000.0], [20.0, 52_000.0], [30.0, 48_000.0]]
    # Export: every raftka produce run, in the format OMB (and this import) reads.
    files = sorted(os.listdir(views["exported"]))
    assert len(files) == 6  # 4 sweep runs, 2 histogram runs
    zk = read_test_result(str(views["exported"] / "raftka-produce-sweep-zk-0.json"))
    assert zk["driver"] == "raftka-zk" and zk["publishRate"][0] > 0
    exported = read_test_result(str(views["exported"] / "raftka-produce-hist-b.json"))
    assert exported["driver"] == "raftka" and exported["messageSize"] == 100
    assert exported["aggregatedPublishLatencyMax"] == 250.0
    b_only = LatencyHistogram(exact_limit=0)
    b_only.record_many(views["known"]["b"])
    assert exported["aggregatedPublishLatency99pct"] == b_only.percentile(99)


def test_one_run_draws_no_degenerate_figure(spark, tmp_path):
    """The demo's report: one run, one parameter set, one mode."""
    results = str(tmp_path / "results")
    params = {"records": 100000, "record_size": 100, "partitions": 3, "brokers": 3}
    write_rows(results, [{"scenario": "demo", "mode": "kraft", "params": params, "metric": m, "value": v, "unit": u}
                         for m, v, u in (("produce_records_per_s", 60000.0, "records/s"),
                                         ("produce_mb_per_s", 6.0, "MB/s"),
                                         ("consume_records_per_s", 80000.0, "records/s"))], run_id="demo-1")
    assert cli(["report", "--results", results, "--out", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["plots"] == []
    assert "produce_records_per_s" in (tmp_path / "report" / "report.md").read_text()


def test_a_real_produce_and_failover_run_report_series_faults_and_merged_latency(spark, tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("produce", "--duration", "3", "--producers", "1", "--partitions", "1", "--brokers", "1",
                    "--no-ceiling", "--no-floor", "--record-size", "100", "--results", results, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run_bench("failover", "--brokers", "2", "--replication-factor", "2", "--partitions", "2",
                    *FAST_SESSION, "--client-partitions", "0", "--results", results, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert cli(["report", "--results", results, "--out", str(tmp_path / "report")]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    series = {(s["scenario"], s["metric"]): s for s in summary["series"]}
    rates = series[("produce", "produce_records_per_s")]["points"]
    assert len(rates) >= 2 and all(v > 0 for _, v in rates[:-1])
    p50, p99 = (series[("produce", f"produce_latency_{p}")]["points"] for p in ("p50", "p99"))
    assert len(p99) >= 2 and all(0 < a <= b for (_, a), (_, b) in zip(p50, p99))
    writable = series[("failover", "partitions_writable_again")]
    led = writable["params"]["led"]  # the partitions the killed broker led
    assert writable["points"][0][1] < led and writable["points"][-1][1] == led
    (fault,) = summary["events"]
    assert fault["event"].startswith("kill broker") and fault["end_s"] > 0.5
    kinds = {(p["scenario"], p["kind"]) for p in summary["plots"]}
    assert {("produce", "series"), ("failover", "series"), ("produce", "merged_latency")} <= kinds
    (plot,) = [p for p in summary["plots"] if p["scenario"] == "failover" and p["kind"] == "series"]
    assert plot["data"]["events"][0]["end_s"] == fault["end_s"]
    # The merged histogram of one run is that run's samples, in 3-significant-digit buckets.
    (merged,) = [m for m in summary["merged_histograms"] if m["metric"] == "produce_latency"]
    hist = LatencyHistogram(exact_limit=0)
    hist.record_many(s["value"] for s in read_samples(results) if s["metric"] == "produce_latency")
    assert merged["count"] == hist.count and merged["p99_9"] == hist.percentile(99.9)
    assert merged["max"] == hist.max
    assert {r["scenario"] for r in read_rows(results)} == {"produce", "failover"}
