"""bench.results: rows and raw samples land in Parquet and read back as
written; the samples never leak into the rows."""

import os

import pyarrow.dataset as ds
import pytest

from bench.results import SAMPLES_DIR, read_rows, read_samples, write_rows, write_samples


def test_rows_and_samples_round_trip(tmp_path):
    results = str(tmp_path / "results")
    params = {"record_size": 100, "acks": "all"}
    rows = [
        {"scenario": "produce", "mode": "kraft", "params": params, "metric": "throughput", "value": 12, "unit": "MB/s"},
        {"scenario": "produce", "mode": "kraft", "params": params, "metric": "latency_p99", "value": 3.5, "unit": "ms"},
    ]
    first = write_rows(results, rows, run_id="run-a")
    second = write_rows(results, rows[:1], run_id="run-a")
    assert first != second and os.path.exists(first) and os.path.exists(second)
    sample_file = write_samples(
        results, "run-a", scenario="produce", mode="kraft", params=params,
        metric="latency", unit="ms", values=[1, 2.5, 3.5],
    )
    assert os.path.dirname(sample_file) == os.path.join(results, SAMPLES_DIR, "run-a")

    got = read_rows(results)
    assert len(got) == 3
    assert {r["run_id"] for r in got} == {"run-a"}
    assert all(r["params"] == '{"acks": "all", "record_size": 100}' for r in got)
    assert sorted(r["value"] for r in got) == [3.5, 12.0, 12.0]
    assert all(r["git_sha"] and r["timestamp_ms"] > 0 for r in got)
    # A plain pyarrow dataset over the results dir sees the rows only.
    assert ds.dataset(results, format="parquet").count_rows() == 3

    samples = read_samples(results)
    assert [s["value"] for s in samples] == [1.0, 2.5, 3.5]
    assert {(s["run_id"], s["metric"], s["unit"], s["params"]) for s in samples} == {
        ("run-a", "latency", "ms", '{"acks": "all", "record_size": 100}')
    }


def test_missing_fields_and_empty_samples_are_refused(tmp_path):
    with pytest.raises(ValueError, match="lacks unit"):
        write_rows(str(tmp_path), [{"scenario": "s", "mode": "zk", "params": {}, "metric": "m", "value": 1}])
    with pytest.raises(ValueError, match="no samples"):
        write_samples(str(tmp_path), "r", scenario="s", mode="zk", params={}, metric="m", unit="ms", values=[])
    assert read_rows(str(tmp_path / "nothing")) == [] and read_samples(str(tmp_path)) == []
