"""The replication benches (issue #5) end to end at small sizes, against real local clusters.

- `produce --rf N --acks all` measures an RF=1 acks=1 baseline on the same
  cluster and reports both and their ratio;
- `failover --led-partitions N` places N partitions so the victim leads
  every one (end to end in tests/bench/test_scenarios_modes.py, in
  ZooKeeper mode).
"""

from bench.failover_bench import layout, led_assignment
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
    rows, samples = stored(results, "produce")
    assert {r["metric"] for r in rows} == set(metrics)
    assert {s["metric"] for s in samples} == {"produce_latency", "rf1_acks1_produce_latency"}


def test_led_partitions_are_placed_with_the_victim_first_in_topics_of_at_most_500():
    replicas = led_assignment(2, [3, 4], 4, 3)
    assert all(r[0] == 2 and sorted(r[1:]) == [3, 4] for r in replicas)
    assert [r[1] for r in replicas] == [3, 4, 3, 4]  # followers take turns
    assert layout(None, 6) == {"bench-failover": 6}
    assert layout(500, 6) == {"bench-failover": 500}
    split = layout(1_201, 6)
    assert sum(split.values()) == 1_201 and max(split.values()) <= 500 and len(split) == 3
