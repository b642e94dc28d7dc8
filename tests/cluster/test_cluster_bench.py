"""`raftka bench produce|consume` and `raftka demo`, end to end on small counts.

They must run a real cluster, measure, write their rows (and latency
samples) to the Parquet dataset, print one JSON object per measurement
with --json, and leave no process behind.
"""

import json
import re

from bench.results import read_rows, read_samples
from cluster_testing import run_cli


def json_rows(stdout: str) -> dict[str, dict]:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert all({"scenario", "mode", "metric", "value", "unit"} <= r.keys() for r in rows)
    return {r["metric"]: r for r in rows}


def test_bench_produce_reports_throughput_latency_cpu_and_ceiling(tmp_path):
    result = run_cli("bench", "produce", "--count", "3000", "--producers", "1", "--partitions", "2",
                     "--results", str(tmp_path / "results"), "--json", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json_rows(result.stdout)
    assert rows["produce_records_per_s"]["value"] > 0 and rows["produce_records_per_s"]["unit"] == "records/s"
    assert rows["failed_records"]["value"] == 0
    assert rows["appended_bytes"]["value"] >= 3000 * 100  # every record's value reached the log
    assert rows["broker_cpu_s_per_gb"]["value"] >= 0  # /proc counts 10 ms ticks: a short run may see none
    assert rows["produce_latency_p99"]["value"] >= rows["produce_latency_p50"]["value"] > 0
    assert rows["client_ceiling_records_per_s"]["value"] > 0
    # The page-cache write reference ran on what the phase appended.
    assert rows["page_cache_write_cpu_s_per_gb"]["value"] > 0
    assert rows["produce_records_per_s"]["partitions"] == 2 and rows["produce_records_per_s"]["acks"] == "1"
    stored = {r["metric"] for r in read_rows(str(tmp_path / "results"))}
    assert set(rows) <= stored
    samples = read_samples(str(tmp_path / "results"))
    assert len(samples) == 30 and {s["metric"] for s in samples} == {"produce_latency"}  # every 100th record


def test_bench_consume_reads_every_record_and_reports_cpu_per_gb(tmp_path):
    result = run_cli("bench", "consume", "--count", "5000", "--consumers", "2", "--producers", "1",
                     "--partitions", "2", "--results", str(tmp_path / "results"), "--json", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json_rows(result.stdout)
    assert rows["missing_records"]["value"] == 0
    assert rows["consume_records_per_s"]["value"] > 0
    assert rows["served_bytes"]["value"] >= 5000 * 100
    assert rows["broker_cpu_s_per_gb"]["unit"] == "cpu_s"
    # The sendfile floor sent the same segment files, and the broker's figure is read against it.
    floor = rows["sendfile_floor_cpu_s_per_gb"]["value"]
    assert floor > 0
    assert abs(rows["broker_over_sendfile_floor"]["value"] - rows["broker_cpu_s_per_gb"]["value"] / floor) < 1e-9


def test_demo_runs_a_cluster_end_to_end(tmp_path):
    result = run_cli("demo", "--records", "20000", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "20,000 records of 100 B" in result.stdout
    assert "cluster stopped cleanly" in result.stdout
    # Each phase on one line: records/s, MB/s, seconds, then the CPU seconds
    # of the client and of the brokers, and how busy the machine was.
    for phase in ("produce", "consume"):
        [line] = [line for line in result.stdout.splitlines() if line.startswith(f"│ {phase} ")]
        records_per_s, mb_per_s, seconds, client_cpu_s, brokers_cpu_s, busy = \
            re.findall(r"[\d,.]+%?", line)
        assert float(records_per_s.replace(",", "")) > 0 and float(mb_per_s) > 0 and float(seconds) > 0
        assert float(client_cpu_s) > 0, line  # this process's CPU clock, to the nanosecond
        assert float(brokers_cpu_s) > 0, line  # the brokers served or replicated 2 MB in the phase
        assert busy.endswith("%")


def test_demo_refuses_a_bad_count_before_starting_a_cluster(tmp_path):
    for args, says in ((("--records", "0"), "--records must be at least 1 (got 0)"),
                       (("--brokers", "2", "--replication-factor", "3"),
                        "--replication-factor 3 must be between 1 and --brokers (2)")):
        result = run_cli("demo", *args, timeout=60)
        assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
        assert f"raftka demo: {says}" in result.stderr
        assert "Traceback" not in result.stderr
        assert result.stdout.strip() == ""  # no cluster was started, nothing was measured
