"""`raftka report` at scale: 1,000 runs and 10 million series rows in under
2 minutes on the 2-core VM (RAFTKA_SOAK=1; the dataset takes a while to write)."""

import json
import os
import random
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_bench_report import T0_MS, cli

from bench.results import (
    SERIES_DIR,
    SERIES_SCHEMA,
    params_json,
    write_histogram,
    write_rows,
)

RUNS = 1000
POINTS = 10_000  # per run: 10 million series rows in all

pytestmark = pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="a soak: set RAFTKA_SOAK=1")


def test_a_thousand_runs_and_ten_million_series_rows_report_in_under_two_minutes(spark, tmp_path):
    results = str(tmp_path / "results")
    rng = random.Random(1)
    for i in range(RUNS):
        run_id = f"run-{i:04d}"
        params = {"record_size": [100, 1000][i % 2], "acks": "1"}
        mode = ["kraft", "zk"][(i // 2) % 2]
        sha = f"{i // 20:04d}" + "0" * 36
        write_rows(results, [{"scenario": "produce", "mode": mode, "params": params, "metric": m,
                              "value": v * rng.uniform(0.95, 1.05), "unit": u, "git_sha": sha,
                              "timestamp_ms": T0_MS + i * 1000}
                             for m, v, u in (("produce_records_per_s", 200_000, "records/s"),
                                             ("produce_latency_p99", 20, "ms"), ("broker_cpu_s_per_gb", 2, "cpu_s"))],
                   run_id=run_id)
        write_histogram(results, run_id, scenario="produce", mode=mode, params=params, metric="produce_latency",
                        unit="ms", values=[rng.lognormvariate(1, 0.7) for _ in range(2000)])
        t = np.arange(POINTS, dtype=np.float64) * 0.1
        table = pa.table({"run_id": [run_id] * POINTS, "scenario": ["produce"] * POINTS, "mode": [mode] * POINTS,
                          "params": [params_json(params)] * POINTS, "metric": ["produce_records_per_s"] * POINTS,
                          "t_s": t, "value": 200_000 + 1000 * np.sin(t), "unit": ["records/s"] * POINTS},
                         schema=SERIES_SCHEMA)
        os.makedirs(os.path.join(results, SERIES_DIR, run_id), exist_ok=True)
        pq.write_table(table, os.path.join(results, SERIES_DIR, run_id, "part-0.parquet"))
    t0 = time.monotonic()
    assert cli(["report", "--results", results, "--out", str(tmp_path / "report")]) == 0
    seconds = time.monotonic() - t0
    print(f"report of {RUNS} runs, {RUNS * POINTS:,} series rows: {seconds:.1f} s")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert len(summary["runs"]) == RUNS
    assert {m["n_runs"] for m in summary["merged_histograms"]} == {RUNS // 4}
    assert all(len(s["points"]) <= 401 for s in summary["series"])
    assert seconds < 120, seconds
