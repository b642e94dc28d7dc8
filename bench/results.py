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
