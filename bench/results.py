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
        if not isinstance(full["params"], str):
            full["params"] = json.dumps(full["params"], sort_keys=True)
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
    n = 0
    while True:
        path = os.path.join(results_dir, f"part-{run_id}-{n}.parquet")
        if not os.path.exists(path):
            break
        n += 1
    pq.write_table(table, path)
    return path
