"""`raftka report` end to end: synthetic runs written through bench.results,
the report built by local Spark, and every number checked against the same
statistics computed here in plain Python from the rows read back."""

import argparse
import json
import os
import random
import statistics
from collections import defaultdict

import pytest

from bench.histogram import LatencyHistogram
from bench.results import read_rows, read_samples, write_rows, write_samples
from bench.report.units import direction
from raftka import report_cli

T0_MS = 1_800_000_000_000
RUNS = 5
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raftka")
    report_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def write_dataset(results: str) -> dict[str, str]:
    """Five runs per mode of a produce scenario, three of a failover one,
    raw latency samples, and planted changes in each mode's last run:
    kraft throughput at 1000 B drops 40% (a regression), zk p99 latency
    rises 50% (a regression), kraft p99 latency falls 40% (an improvement),
    and a unit-less ratio moves 30% (changed, never a regression)."""
    rng = random.Random(7)
    last = {}
    for i in range(RUNS):
        for mode, base in (("kraft", 100.0), ("zk", 80.0)):
            run_id = f"produce-{mode}-{i}"
            ts = T0_MS + i * 60_000 + (mode == "zk") * 1_000
            final = i == RUNS - 1
            rows = []
            for record_size in (100, 1000, 10000):
                drop = 0.6 if final and mode == "kraft" and record_size == 1000 else 1.0
                # Two rows of one measurement in a run: the run counts once, by their median.
                for _ in range(2):
                    value = base * record_size**0.3 * rng.uniform(0.985, 1.015) * drop
                    rows.append({"scenario": "produce", "mode": mode, "params": {"record_size": record_size, "acks": "all"},
                                 "metric": "throughput", "value": value, "unit": "MB/s", "timestamp_ms": ts})
            p99 = 12.0 * rng.uniform(0.98, 1.02) * (1.5 if final and mode == "zk" else 0.6 if final else 1.0)
            rows.append({"scenario": "produce", "mode": mode, "params": {"acks": "all"}, "metric": "latency_p99",
                         "value": p99, "unit": "ms", "timestamp_ms": ts})
            rows.append({"scenario": "produce", "mode": mode, "params": {"acks": "all"}, "metric": "batching_ratio",
                         "value": 2.0 * (1.3 if final else rng.uniform(0.99, 1.01)), "unit": "ratio", "timestamp_ms": ts})
            write_rows(results, rows, run_id=run_id)
            latencies = [rng.lognormvariate(1.0, 0.6) * (1.5 if final and mode == "zk" else 1.0) for _ in range(1500)]
            write_samples(results, run_id, scenario="produce", mode=mode, params={"acks": "all"},
                          metric="produce_latency", unit="ms", values=latencies)
            last[mode] = run_id
    for i in range(3):
        for mode, slope in (("kraft", 0.02), ("zk", 0.2)):
            rows = [{"scenario": "failover", "mode": mode, "params": {"partitions": n}, "metric": "failover_time",
                     "value": 0.5 + slope * n * rng.uniform(0.99, 1.01), "unit": "s",
                     "timestamp_ms": T0_MS + 3_600_000 + i * 60_000}
                    for n in (1, 10, 100)]
            write_rows(results, rows, run_id=f"failover-{mode}-{i}")
    return last


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (the inclusive method)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def expected_from_rows(rows: list[dict], baseline: str | None = None):
    """The report's statistics, straight from the rows, in plain Python."""
    run_start = defaultdict(lambda: float("inf"))
    for r in rows:
        run_start[r["run_id"]] = min(run_start[r["run_id"]], r["timestamp_ms"])
    by_key_run = defaultdict(list)
    for r in rows:
        by_key_run[(r["scenario"], r["mode"], r["metric"], r["params"], r["unit"]), r["run_id"]].append(r["value"])
    per_key = defaultdict(dict)  # key -> run_id -> value
    for (key, run_id), values in by_key_run.items():
        per_key[key][run_id] = statistics.median(values)
    stats, comparisons = {}, {}
    for key, runs in per_key.items():
        values = list(runs.values())
        p25, p50, p75 = (quantile(values, q) for q in (0.25, 0.5, 0.75))
        stats[key] = {"n_runs": len(values), "median": p50, "p25": p25, "p75": p75, "iqr": p75 - p25,
                      "min": min(values), "max": max(values)}
        order = sorted(runs, key=lambda run_id: (run_start[run_id], run_id))
        base_id = baseline if baseline is not None else (order[-2] if len(order) > 1 else None)
        if base_id not in runs:
            continue
        history = [runs[run_id] for run_id in order[:-1]]
        h25, h50, h75 = (quantile(history, q) for q in (0.25, 0.5, 0.75))
        band = max(0.05, (h75 - h25) / abs(h50))
        change = runs[order[-1]] / runs[base_id] - 1
        unit = key[4]
        worse = -change if unit.endswith("/s") else change if unit in ("ms", "s") else None
        if worse is None:
            verdict = "changed" if abs(change) > band else "within noise"
        else:
            verdict = "regression" if worse > band else "improvement" if worse < -band else "within noise"
        comparisons[key] = {"last_run_id": order[-1], "baseline_run_id": base_id, "history_runs": len(history),
                            "last": runs[order[-1]],
                            "baseline": runs[base_id], "change": change, "noise_band": band, "verdict": verdict}
    ratios = {}
    for (scenario, mode, metric, params, unit), st in stats.items():
        zk = stats.get((scenario, "zk", metric, params, unit))
        if mode == "kraft" and zk:
            ratios[(scenario, metric, params, unit)] = st["median"] / zk["median"]
    return stats, ratios, comparisons


def key_of(item: dict, with_mode: bool = True) -> tuple:
    params = json.dumps(item["params"], sort_keys=True)
    if with_mode:
        return item["scenario"], item["mode"], item["metric"], params, item["unit"]
    return item["scenario"], item["metric"], params, item["unit"]


def md_tables(markdown: str) -> dict[str, list[list[dict]]]:
    """Every markdown table under a `### title`, as lists of row dicts."""
    tables: dict[str, list[list[dict]]] = defaultdict(list)
    title, lines = None, markdown.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### "):
            title = line[4:]
        elif line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            headers = [c.strip() for c in line.strip("|").split(" | ")]
            rows = []
            for row_line in lines[i + 2:]:
                if not row_line.startswith("| "):
                    break
                rows.append(dict(zip(headers, (c.strip() for c in row_line.strip("|").split(" | ")))))
            tables[title].append(rows)
    return tables


def label(params_json: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(json.loads(params_json).items())) or "-"


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def test_direction_of_units():
    assert [direction(u) for u in ("MB/s", "records/s", "batches/s", "ms", "us", "s", "cpu_s", "ratio", "bytes")] == [
        "higher", "higher", "higher", "lower", "lower", "lower", "lower", None, None]


def test_report_numbers_equal_plain_python(spark, tmp_path):
    results, out = str(tmp_path / "results"), str(tmp_path / "report")
    last = write_dataset(results)
    assert cli(["report", "--results", results, "--out", out, "--master", "local[2]"]) == 0

    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    rows = read_rows(results)
    stats, ratios, comparisons = expected_from_rows(rows)

    assert len(summary["runs"]) == 2 * RUNS + 6
    assert {key_of(s) for s in summary["stats"]} == set(stats)
    for s in summary["stats"]:
        want = stats[key_of(s)]
        for field in want:
            assert s[field] == pytest.approx(want[field], rel=1e-12), (key_of(s), field)
    assert {key_of(r, with_mode=False): r["ratio"] for r in summary["mode_ratios"]} == pytest.approx(ratios, rel=1e-12)
    assert len(ratios) == 3 + 2 + 3  # throughput x 3 sizes, latency_p99, batching_ratio, failover x 3

    got = {key_of(c): c for c in summary["comparisons"]}
    assert set(got) == set(comparisons)
    for key, want in comparisons.items():
        for field, value in want.items():
            assert got[key][field] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), (key, field)
        assert got[key]["regression"] == (want["verdict"] == "regression")
    # The planted changes are found, and nothing else is called a regression.
    flagged = {(c["mode"], c["metric"], c["params"].get("record_size")): c["verdict"]
               for c in summary["comparisons"] if c["verdict"] != "within noise"}
    assert flagged == {
        ("kraft", "throughput", 1000): "regression",
        ("zk", "latency_p99", None): "regression",
        ("kraft", "latency_p99", None): "improvement",
        ("kraft", "batching_ratio", None): "changed",
        ("zk", "batching_ratio", None): "changed",
    }

    # Raw samples: Spark's percentiles are the exact nearest-rank ones at this size.
    samples = defaultdict(LatencyHistogram)
    for s in read_samples(results):
        samples[s["run_id"]].record(s["value"])
    assert len(summary["latency_samples"]) == 2 * RUNS
    for x in summary["latency_samples"]:
        want = samples[x["run_id"]].summary()
        assert x["count"] == want["count"] == 1500
        for p in ("p50", "p95", "p99", "p99_9", "max"):
            assert x[p] == want[p], (x["run_id"], p)
    assert {c["run_id"] for c in summary["cdfs"]} == set(last.values())

    # report.md shows the same numbers (rounded) and marks the regressions.
    markdown = (tmp_path / "report" / "report.md").read_text()
    tables = md_tables(markdown)
    across_runs = [row for table in tables["Across runs"] for row in table]
    assert len(across_runs) == len(stats)
    for row in across_runs:
        (match,) = [st for (_, mode, metric, params, unit), st in stats.items()
                    if (mode, metric, label(params), unit) == (row["mode"], row["metric"], row["params"], row["unit"])]
        assert int(row["runs"]) == match["n_runs"]
        assert number(row["median"]) == pytest.approx(match["median"], rel=1e-3)
        assert number(row["IQR"]) == pytest.approx(match["iqr"], rel=1e-3, abs=1e-3)
    (regression_rows,) = tables["Regressions (2)"]
    assert {(r["mode"], r["metric"], r["params"]) for r in regression_rows} == {
        ("kraft", "throughput", "acks=all, record_size=1000"), ("zk", "latency_p99", "acks=all")}
    # Flagged twice each: in the headline table at the top and in the regressions table.
    assert markdown.count("**regression**") == 4
    headline = next(rows for title, tables_ in tables.items() if title.startswith("Headline") for rows in tables_)
    assert {(r["mode"], r["metric"]) for r in headline if r["verdict"] == "**regression**"} == {
        ("kraft", "throughput"), ("zk", "latency_p99")}

    # Plots: every kind drawn, valid PNGs next to the HTML, linked from both documents.
    html = (tmp_path / "report" / "report.html").read_text()
    kinds = {p["kind"] for p in summary["plots"]}
    assert kinds == {"compare", "throughput_vs_record_size", "latency_cdf", "failover_vs_partitions"}
    from PIL import Image

    for plot in summary["plots"]:
        path = tmp_path / "report" / plot["file"]
        assert path.read_bytes()[:8] == PNG_MAGIC
        with Image.open(path) as image:
            image.verify()
        assert f"src='{plot['file']}'" in html
        assert f"]({plot['file']})" in markdown
    assert html.count("<strong>regression</strong>") == 4


def test_chosen_baseline_and_unknown_baseline(spark, tmp_path, capsys):
    results, out = str(tmp_path / "results"), str(tmp_path / "report")
    write_dataset(results)
    assert cli(["report", "--results", results, "--out", out, "--baseline", "produce-kraft-0"]) == 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    _, _, comparisons = expected_from_rows(read_rows(results), baseline="produce-kraft-0")
    got = {key_of(c): c for c in summary["comparisons"]}
    # Only the keys that run measured are compared: kraft's produce metrics.
    assert set(got) == set(comparisons) and {k[:2] for k in got} == {("produce", "kraft")}
    for key, want in comparisons.items():
        assert got[key]["baseline_run_id"] == "produce-kraft-0"
        assert got[key]["change"] == pytest.approx(want["change"], rel=1e-12)
        assert got[key]["verdict"] == want["verdict"]

    assert cli(["report", "--results", results, "--out", out, "--baseline", "no-such-run"]) == 2
    assert "--baseline no-such-run is not a run" in capsys.readouterr().err
    assert cli(["report", "--results", str(tmp_path / "empty"), "--out", out]) == 2
    assert "no result rows" in capsys.readouterr().err
    assert os.path.exists(os.path.join(out, "report.md"))
