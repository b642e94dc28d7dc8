"""`raftka bench produce --transactional` end to end at a small size, against a real local cluster:
transactional producers beside idempotent ones in the same run, read_committed consumers over both."""

import json

from scenarios_testing import by_metric, json_rows, run_bench, stored


def test_transactional_produce_is_reported_beside_idempotent_with_read_committed_throughput(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("produce", "--transactional", "--commit-interval-ms", "20", "--count", "3000",
                    "--producers", "1", "--partitions", "2", "--sample-every", "10", "--results", results, "--json",
                    timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    ours = metrics["txn_produce_records_per_s"]
    theirs = metrics["idempotent_produce_records_per_s"]
    assert ours["transactional"] is True and ours["commit_interval_ms"] == 20 and ours["acks"] == "all"
    assert ours["value"] > 0 and theirs["value"] > 0
    ratio = metrics["txn_records_per_s_ratio"]
    assert ratio["unit"] == "ratio" and abs(ratio["value"] - ours["value"] / theirs["value"]) < 1e-9
    # Every record produced was read back with read_committed, from both topics.
    assert metrics["failed_records"]["value"] == 0 and metrics["read_committed_missing_records"]["value"] == 0
    assert metrics["txn_read_committed_records_per_s"]["value"] > 0
    assert metrics["idempotent_read_committed_records_per_s"]["value"] > 0
    assert metrics["txn_commits"]["value"] >= 1
    for name in ("idempotent_produce_latency", "txn_produce_latency", "txn_commit_latency", "txn_visible_latency"):
        p50, p99 = metrics[f"{name}_p50"]["value"], metrics[f"{name}_p99"]["value"]
        assert 0 < p50 <= p99 < 60_000, (name, p50, p99)
    rows, samples = stored(results, "produce")
    assert {r["metric"] for r in rows} == set(metrics)
    assert json.loads(rows[0]["params"])["commit_interval_ms"] == 20
    assert {s["metric"] for s in samples} == {"idempotent_produce_latency", "txn_produce_latency",
                                              "txn_commit_latency", "txn_visible_latency"}
