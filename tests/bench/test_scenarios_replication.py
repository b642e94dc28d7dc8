"""The replication benches (issue #5) end to end at small sizes, against real local clusters.

- `produce --rf N --acks all` measures an RF=1 acks=1 baseline on the same
  cluster and reports both and their ratio;
- `failover --led-partitions N` places N partitions so the victim leads
  every one, and times each of them from the fault.
"""

import json

from bench.failover_bench import layout, led_assignment
from scenarios_testing import by_metric, json_rows, run_bench, stored

FAST_SESSION = ["--set", "broker.session.timeout.ms=1500", "--set", "broker.heartbeat.interval.ms=300"]


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


def test_produce_at_rf1_acks1_has_no_baseline_to_compare_with(tmp_path):
    out = run_bench("produce", "--count", "1000", "--producers", "1", "--partitions", "1", "--no-ceiling",
                    "--results", str(tmp_path / "results"), "--json", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    assert "produce_records_per_s" in metrics and metrics["produce_records_per_s"]["brokers"] == 1
    assert not any(m.startswith(("rf1_", "replication_")) for m in metrics)


def test_failover_times_every_partition_the_killed_broker_led(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("failover", "--led-partitions", "12", "--acks", "all", "--client-partitions", "4",
                    *FAST_SESSION, "--results", results, "--json", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    assert metrics["partitions_without_leader"]["value"] == 0
    produce = metrics["leader_failover_produce_ms_median"]
    assert produce["led"] == 12 and produce["placement"] == "led" and produce["acks"] == "all"
    for clock in ("metadata", "produce", "client"):
        low, mid, p99, top = (metrics[f"leader_failover_{clock}_ms_{s}"]["value"]
                              for s in ("min", "median", "p99", "max"))
        # Nothing moves before the controller sees the session expire.
        assert 1000 < low <= mid <= p99 <= top < 30_000, (clock, low, mid, p99, top)
    _, samples = stored(results, "failover")
    per_clock = {}
    for s in samples:
        per_clock.setdefault(s["metric"], []).append(s)
    assert len(per_clock["leader_failover_produce"]) == 12 and len(per_clock["leader_failover_client"]) == 4
    assert json.loads(per_clock["leader_failover_produce"][0]["params"])["led"] == 12


def test_led_partitions_are_placed_with_the_victim_first_and_split_at_the_request_limit():
    replicas = led_assignment(2, [3, 4], 4, 3)
    assert all(r[0] == 2 and sorted(r[1:]) == [3, 4] for r in replicas)
    assert [r[1] for r in replicas] == [3, 4, 3, 4]  # followers take turns
    assert layout(None, 6) == {"bench-failover": 6}
    assert layout(10_000, 6) == {"bench-failover": 10_000}
    split = layout(25_001, 6)
    assert sum(split.values()) == 25_001 and max(split.values()) <= 10_000 and len(split) == 3
