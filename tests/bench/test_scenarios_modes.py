"""The metadata scenarios in both modes (issue #8), end to end at small sizes.

Rows must carry the mode they ran in, so `raftka report` can set the modes
side by side; ZooKeeper mode runs on real ZooKeeper (the Debian package),
and these tests skip where it is not installed.
"""

import json

import pytest

from quorum.zookeeper.ensemble import zookeeper_missing_reason
from scenarios_testing import by_metric, json_rows, run_bench, stored

needs_zookeeper = pytest.mark.skipif(zookeeper_missing_reason() is not None,
                                     reason=str(zookeeper_missing_reason()))


@needs_zookeeper
def test_zk_failover_times_every_partition_led_by_a_killed_broker_that_is_not_the_controller(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("failover", "--mode", "zk", "--led-partitions", "10", "--acks", "all",
                    "--client-partitions", "4", "--session-timeout-ms", "4000", "--results", results, "--json",
                    timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    assert metrics["partitions_without_leader"]["value"] == 0
    produce = metrics["leader_failover_produce_ms_median"]
    assert produce["mode"] == "zk" and produce["led"] == 10 and produce["placement"] == "led"
    assert produce["session_timeout_ms"] == 4000
    for clock in ("metadata", "produce", "client"):
        low, mid, p99, top = (metrics[f"leader_failover_{clock}_ms_{s}"]["value"]
                              for s in ("min", "median", "p99", "max"))
        # Nothing moves before ZooKeeper expires the dead broker's session.
        assert 2000 < low <= mid <= p99 <= top < 40_000, (clock, low, mid, p99, top)
    # ZooKeeper expired the session; the controller's UpdateMetadata then
    # dropped the broker from the survivors' live brokers, with the new leaders.
    fenced = metrics["leader_failover_fenced_ms"]["value"]
    assert 2000 < fenced <= metrics["leader_failover_metadata_ms_min"]["value"] + 500
    # The CPU after the fence counts the ZooKeeper servers (java) and the brokers; no controller process runs.
    assert metrics["leader_failover_zookeeper_cpu_s_after_fence"]["value"] >= 0
    assert metrics["leader_failover_brokers_cpu_s_after_fence"]["value"] >= 0
    assert "leader_failover_controllers_cpu_s_after_fence" not in metrics
    _, samples = stored(results, "failover", mode="zk")
    produce_samples = [s for s in samples if s["metric"] == "leader_failover_produce"]
    assert len(produce_samples) == 10 and json.loads(produce_samples[0]["params"])["led"] == 10
    assert len([s for s in samples if s["metric"] == "leader_failover_client"]) == 4


@needs_zookeeper
def test_zk_cold_start_brings_every_partition_back_led_and_writable(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("cold-start", "--mode", "zk", "--partitions", "10", "--topics", "2", "--results", results,
                    "--json", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    ready, leaders, writable = (metrics[m]["value"] for m in ("cold_start_ready_ms", "cold_start_leaders_ms",
                                                                "cold_start_writable_ms"))
    assert 0 < ready <= leaders <= writable < 120_000
    assert metrics["cluster_stop_ms"]["value"] > 0
    assert metrics["cold_start_writable_ms"]["partitions"] == 10 and metrics["cold_start_writable_ms"]["mode"] == "zk"
    rows, _ = stored(results, "cold-start", mode="zk")
    assert len(rows) == 4


def test_topic_create_rate_and_per_topic_latency(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("topic-create", "--topics", "8", "--concurrency", "2", "--brokers", "2", "--rf", "2",
                    "--results", results, "--json", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    rate = metrics["topic_create_rate"]
    assert rate["unit"] == "topics/s" and rate["value"] > 0 and rate["topics"] == 8 and rate["mode"] == "kraft"
    p50, p99 = metrics["topic_create_ms_p50"]["value"], metrics["topic_create_ms_p99"]["value"]
    assert 0 < p50 <= p99 <= metrics["topic_create_all_brokers_ms"]["value"]
    # The batch cannot beat its slowest topic: 8 topics, 2 at a time.
    assert 8 / rate["value"] * 1000 >= p99 - 1
    _, samples = stored(results, "topic-create")
    assert len(samples) == 8
