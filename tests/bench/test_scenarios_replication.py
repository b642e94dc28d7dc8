"""The replication benches (issue #5) end to end at small sizes, against real local clusters.

- `produce --rf N --acks all` measures an RF=1 acks=1 baseline on the same
  cluster and reports both and their ratio;
- `failover --led-partitions N` places N partitions so the victim leads
  every one (end to end in tests/bench/test_scenarios_modes.py, in
  ZooKeeper mode).
"""

from bench.failover_bench import layout, led_assignment
from bench.produce_bench import TARGET_REPLICATION_RATIO, bound_verdict
from scenarios_testing import by_metric, json_rows, run_bench, stored


def test_replicated_produce_is_reported_beside_an_rf1_acks1_baseline_with_their_ratio(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("produce", "--rf", "2", "--acks", "all", "--count", "3000", "--producers", "1",
                    "--partitions", "2", "--no-ceiling", "--sample-every", "10", "--results", results, "--json",
                    timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    ours = metrics["produce_records_per_s"]
    theirs = metrics["rf1_acks1_produce_records_per_s"]
    # --rf is --replication-factor, and the cluster got as many brokers as it needs.
    assert ours["replication_factor"] == 2 and ours["brokers"] == 2 and ours["acks"] == "all"
    assert ours["value"] > 0 and theirs["value"] > 0
    ratio = metrics["replication_records_per_s_ratio"]
    assert ratio["unit"] == "ratio" and abs(ratio["value"] - ours["value"] / theirs["value"]) < 1e-9
    for q in ("p50", "p99"):
        assert 0 < metrics[f"rf1_acks1_produce_latency_{q}"]["value"] < 60_000
        assert metrics[f"replication_latency_{q}_ratio"]["value"] > 0
    assert metrics["failed_records"]["value"] == 0
    # Where the ratio comes from: each phase's CPU and bytes per record.
    # Every record is stored once per replica, so the replicated topic grew
    # about twice as much per record (batch headers and timing make it
    # inexact).
    for prefix in ("", "rf1_acks1_"):
        assert metrics[f"{prefix}client_cpu_us_per_record"]["value"] > 0
        assert metrics[f"{prefix}broker_cpu_us_per_record"]["value"] > 0
    replicated = metrics["appended_bytes_per_record"]["value"]
    single = metrics["rf1_acks1_appended_bytes_per_record"]["value"]
    assert single >= 100 and 1.8 < replicated / single < 2.2, (replicated, single)
    # The bound: the baseline's CPU per record over the replicated load
    # generator's plus the page-cache write of what each record appended.
    write_us = metrics["page_cache_write_cpu_s_per_gb"]["value"] * replicated / 1e9 * 1e6
    expected = ((metrics["rf1_acks1_client_cpu_us_per_record"]["value"]
                 + metrics["rf1_acks1_broker_cpu_us_per_record"]["value"])
                / (metrics["client_cpu_us_per_record"]["value"] + write_us))
    assert abs(metrics["replication_ratio_bound"]["value"] - expected) < 1e-9 * expected
    # That write's share of each phase's broker CPU per record.
    assert abs(metrics["page_cache_write_us_per_record"]["value"] - write_us) < 1e-9 * write_us
    single_write_us = metrics["page_cache_write_cpu_s_per_gb"]["value"] * single / 1e3
    assert abs(metrics["rf1_acks1_page_cache_write_us_per_record"]["value"] - single_write_us) < 1e-9 * single_write_us
    rows, samples = stored(results, "produce")
    assert {r["metric"] for r in rows} == set(metrics)
    assert {s["metric"] for s in samples} == {"produce_latency", "rf1_acks1_produce_latency"}


def test_a_bound_below_the_target_is_called_out_with_the_machines_write_cost():
    # On a day the page cache costs 2.43 CPU-s/GB (bound 0.55), the reader
    # is told no broker could meet the target; at 0.2 (bound 0.9), nothing.
    told = bound_verdict(0.55, 2.43)
    assert told is not None and "below the target of 0.6" in told and "2.43 CPU-s per GB" in told
    assert bound_verdict(0.9, 0.2) is None
    assert bound_verdict(TARGET_REPLICATION_RATIO, 1.0) is None


def test_led_partitions_are_placed_with_the_victim_first_in_topics_of_at_most_500():
    replicas = led_assignment(2, [3, 4], 4, 3)
    assert all(r[0] == 2 and sorted(r[1:]) == [3, 4] for r in replicas)
    assert [r[1] for r in replicas] == [3, 4, 3, 4]  # followers take turns
    assert layout(None, 6) == {"bench-failover": 6}
    assert layout(500, 6) == {"bench-failover": 500}
    split = layout(1_201, 6)
    assert sum(split.values()) == 1_201 and max(split.values()) <= 500 and len(split) == 3
