"""Bench result rows: one row per measurement, appended to a Parquet dataset.

Every bench writes through `write_rows(results_dir, rows)`. A row is

| field          | type    | meaning                                          |
|----------------|---------|--------------------------------------------------|
| run_id         | string  | one id per bench invocation                      |
| scenario       | string  | `storage`, ...                                   |
| mode           | string  | `n/a`, `kraft` or `zk`                           |
| params         | string  | JSON object of the scenario's parameters         |
| metric         | string  | what was measured, e.g. `log_append_throughput`  |
| value          | double  |                                                  |
| unit           | string  | `MB/s`, `batches/s`, `us`, `ratio`, ...          |
| timestamp_ms   | int64   | wall clock when the row was written              |
| git_sha        | string  | HEAD of the checkout the bench ran from          |
| hostname       | string  |                                                  |
| cpu_count      | int32   |                                                  |
| python_version | string  |                                                  |

Each call appends one new file `part-<run_id>-<n>.parquet` to the dataset
directory, so concurrent runs never rewrite each other's files and
`pyarrow.dataset.dataset(results_dir)` (or Spark) reads them all.

Raw latency samples are kept per run beside the rows, through
`write_samples`, in `<results_dir>/_samples/<run_id>/part-<n>.parquet`
(columns: run_id, scenario, mode, params, metric, value, unit: one row per
sample). The leading `_` makes Spark's and pyarrow's dataset discovery skip
that folder when they read the rows; `raftka report` reads it on its own
for the latency CDFs. Anything else kept inside `results_dir` (such as the
report's default output, `_report/`) must likewise start with `_`.

Three more tables sit beside the rows the same way, one folder per run:
`_series/` (per-interval values inside a run, `write_series`), `_events/`
(faults and their heals on the series' clock, `write_events`) and
`_histograms/` (each latency measurement's HdrHistogram-style buckets,
`write_histogram`, which the report merges across repeated runs).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
import uuid
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("scenario", pa.string()),
        ("mode", pa.string()),
        ("params", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("unit", pa.string()),
        ("timestamp_ms", pa.int64()),
        ("git_sha", pa.string()),
        ("hostname", pa.string()),
        ("cpu_count", pa.int32()),
        ("python_version", pa.string()),
    ]
)

SAMPLES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("scenario", pa.string()),
        ("mode", pa.string()),
        ("params", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("unit", pa.string()),
    ]
)

SAMPLES_DIR = "_samples"

#: Per-interval values inside a run (throughput, latency percentiles, CPU),
#: `t_s` seconds after the measured phase began.
SERIES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("scenario", pa.string()),
        ("mode", pa.string()),
        ("params", pa.string()),
        ("metric", pa.string()),
        ("t_s", pa.float64()),
        ("value", pa.float64()),
        ("unit", pa.string()),
    ]
)
SERIES_DIR = "_series"

#: What happened inside a run (a fault injected and healed), on the series' clock.
EVENTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("scenario", pa.string()),
        ("mode", pa.string()),
        ("params", pa.string()),
        ("event", pa.string()),
        ("start_s", pa.float64()),
        ("end_s", pa.float64()),
    ]
)
EVENTS_DIR = "_events"

#: A run's latency histogram, one row per non-empty bucket (HdrHistogram-style
#: log-linear buckets of `bench.histogram`, 3 significant digits): buckets of
#: repeated runs add up, so the report merges them.
HISTOGRAM_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("scenario", pa.string()),
        ("mode", pa.string()),
        ("params", pa.string()),
        ("metric", pa.string()),
        ("unit", pa.string()),
        ("bucket", pa.float64()),
        ("count", pa.int64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
    ]
)
HISTOGRAMS_DIR = "_histograms"

_REQUIRED = ("scenario", "mode", "params", "metric", "value", "unit")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def git_sha() -> str:
    """HEAD of the repository this file is in, or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def complete_rows(rows: Iterable[Mapping[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Fill the environment fields of each row; check the required ones."""
    env = {
        "run_id": run_id,
        "timestamp_ms": int(time.time() * 1000),
        "git_sha": git_sha(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
        "python_version": platform.python_version(),
    }
    out = []
    for row in rows:
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise ValueError(f"result row {dict(row)!r} lacks {', '.join(missing)}")
        full = {**env, **row}
        full["params"] = params_json(full["params"])
        full["value"] = float(full["value"])
        out.append(full)
    return out


def write_rows(results_dir: str, rows: Iterable[Mapping[str, Any]], run_id: str | None = None) -> str:
    """Append `rows` to the Parquet dataset in `results_dir`; return the
    path of the file written."""
    run_id = run_id or new_run_id()
    full = complete_rows(rows, run_id)
    os.makedirs(results_dir, exist_ok=True)
    table = pa.Table.from_pylist(full, schema=SCHEMA)
    path = _new_part_path(results_dir, f"part-{run_id}-")
    pq.write_table(table, path)
    return path


def params_json(params: Mapping[str, Any] | str) -> str:
    """The canonical `params` string: JSON with sorted keys."""
    return params if isinstance(params, str) else json.dumps(params, sort_keys=True)


def write_samples(
    results_dir: str,
    run_id: str,
    *,
    scenario: str,
    mode: str,
    params: Mapping[str, Any] | str,
    metric: str,
    unit: str,
    values: Iterable[float],
) -> str:
    """Keep the raw samples of one measurement (e.g. every request latency
    behind a `produce_latency_p99` row) of run `run_id`; return the file
    written. Pass the same run_id, scenario, mode, params and metric as the
    run's rows so the report can match them."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"no samples for {scenario}/{metric} of run {run_id}; record some or skip the call")
    n = len(values)
    columns = {
        "run_id": [run_id] * n,
        "scenario": [scenario] * n,
        "mode": [mode] * n,
        "params": [params_json(params)] * n,
        "metric": [metric] * n,
        "value": values,
        "unit": [unit] * n,
    }
    run_dir = os.path.join(results_dir, SAMPLES_DIR, run_id)
    os.makedirs(run_dir, exist_ok=True)
    path = _new_part_path(run_dir, "part-")
    pq.write_table(pa.Table.from_pydict(columns, schema=SAMPLES_SCHEMA), path)
    return path


def write_series(
    results_dir: str,
    run_id: str,
    *,
    scenario: str,
    mode: str,
    params: Mapping[str, Any] | str,
    metric: str,
    unit: str,
    points: Iterable[tuple[float, float]],
) -> str | None:
    """Keep one per-interval series of run `run_id`: `(t_s, value)` points,
    t_s seconds after the measured phase began. None when there are none."""
    points = [(float(t), float(v)) for t, v in points]
    if not points:
        return None
    n = len(points)
    columns = {
        "run_id": [run_id] * n, "scenario": [scenario] * n, "mode": [mode] * n,
        "params": [params_json(params)] * n, "metric": [metric] * n,
        "t_s": [t for t, _ in points], "value": [v for _, v in points], "unit": [unit] * n,
    }
    return _write_beside(results_dir, SERIES_DIR, run_id, pa.Table.from_pydict(columns, schema=SERIES_SCHEMA))


def write_events(
    results_dir: str,
    run_id: str,
    *,
    scenario: str,
    mode: str,
    params: Mapping[str, Any] | str,
    events: Iterable[tuple[str, float, float]],
) -> str | None:
    """Keep the events of run `run_id`: `(what, start_s, end_s)` on the
    series' clock (a fault from its injection to its heal)."""
    events = list(events)
    if not events:
        return None
    n = len(events)
    columns = {
        "run_id": [run_id] * n, "scenario": [scenario] * n, "mode": [mode] * n,
        "params": [params_json(params)] * n, "event": [e for e, _, _ in events],
        "start_s": [float(s) for _, s, _ in events], "end_s": [float(e) for _, _, e in events],
    }
    return _write_beside(results_dir, EVENTS_DIR, run_id, pa.Table.from_pydict(columns, schema=EVENTS_SCHEMA))


def write_histogram(
    results_dir: str,
    run_id: str,
    *,
    scenario: str,
    mode: str,
    params: Mapping[str, Any] | str,
    metric: str,
    unit: str,
    values: Iterable[float],
) -> str | None:
    """Keep the latency histogram of one measurement of run `run_id` (its
    buckets, see HISTOGRAM_SCHEMA); None when there are no values."""
    from bench.histogram import LatencyHistogram

    hist = LatencyHistogram(exact_limit=0)
    hist.record_many(values)
    if not hist.count:
        return None
    buckets = hist.buckets()
    n = len(buckets)
    columns = {
        "run_id": [run_id] * n, "scenario": [scenario] * n, "mode": [mode] * n,
        "params": [params_json(params)] * n, "metric": [metric] * n, "unit": [unit] * n,
        "bucket": [b for b, _ in buckets], "count": [c for _, c in buckets],
        "min": [hist.min] * n, "max": [hist.max] * n,
    }
    return _write_beside(results_dir, HISTOGRAMS_DIR, run_id, pa.Table.from_pydict(columns, schema=HISTOGRAM_SCHEMA))


def _write_beside(results_dir: str, folder: str, run_id: str, table: pa.Table) -> str:
    run_dir = os.path.join(results_dir, folder, run_id)
    os.makedirs(run_dir, exist_ok=True)
    path = _new_part_path(run_dir, "part-")
    pq.write_table(table, path)
    return path


def read_rows(results_dir: str) -> list[dict[str, Any]]:
    """Every row of the dataset, as dicts, without Spark (tests and quick
    looks; `raftka report` reads the same files through Spark)."""
    if not os.path.isdir(results_dir):
        return []
    return ds.dataset(results_dir, format="parquet", schema=SCHEMA).to_table().to_pylist()


def read_samples(results_dir: str) -> list[dict[str, Any]]:
    """Every raw sample kept by `write_samples`, as dicts."""
    samples_dir = os.path.join(results_dir, SAMPLES_DIR)
    if not os.path.isdir(samples_dir):
        return []
    return ds.dataset(samples_dir, format="parquet", schema=SAMPLES_SCHEMA).to_table().to_pylist()


def _new_part_path(directory: str, prefix: str) -> str:
    """A `<prefix><n>.parquet` path in `directory` that does not exist yet."""
    n = 0
    while os.path.exists(path := os.path.join(directory, f"{prefix}{n}.parquet")):
        n += 1
    return path
