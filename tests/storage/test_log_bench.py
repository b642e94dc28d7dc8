"""`raftka bench storage` end to end on a tiny size: rows, JSON, Parquet."""

import json

import pyarrow.dataset as ds
import pytest

from raftka.cli import main


def test_storage_bench_writes_rows_and_json(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["bench", "storage", "--size-mb", "2", "--json", "--results", str(results), "--dir", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    metrics = {(m["metric"], m["unit"]) for m in lines}
    assert ("log_append_throughput", "MB/s") in metrics
    assert ("plain_read_rate", "batches/s") in metrics
    assert ("append_ratio", "ratio") in metrics and ("read_ratio", "ratio") in metrics
    # Per record as well as per batch: the figures agree with each other.
    by_metric = {m["metric"]: m for m in lines}
    per_batch = by_metric["log_append_cpu_time_per_batch"]
    n = per_batch["records_per_batch"]
    assert n > 1 and by_metric["log_append_cpu_time_per_record"]["unit"] == "ns"
    assert by_metric["log_append_cpu_time_per_record"]["value"] * n / 1000 == pytest.approx(per_batch["value"])
    assert by_metric["plain_write_records_rate"]["value"] == pytest.approx(by_metric["plain_write_rate"]["value"] * n)
    assert all(m["scenario"] == "storage" and m["mode"] == "n/a" and m["size_mb"] == 2 for m in lines)
    assert all(m["value"] > 0 for m in lines)
    table = ds.dataset(str(results)).to_table().to_pylist()
    assert len(table) == len(lines)
    row = table[0]
    assert set(row) >= {"run_id", "params", "timestamp_ms", "git_sha", "hostname", "cpu_count", "python_version"}
    assert json.loads(row["params"])["batch_bytes"] <= 16 * 1024
    assert len({r["run_id"] for r in table}) == 1
    # A second run appends a second file to the same dataset.
    assert main(["bench", "storage", "--size-mb", "1", "--results", str(results), "--dir", str(tmp_path)]) == 0
    assert len({r["run_id"] for r in ds.dataset(str(results)).to_table().to_pylist()}) == 2
