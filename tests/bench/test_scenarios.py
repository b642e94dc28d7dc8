"""The cluster scenarios end to end on tiny parameters, each against a real local cluster.

Each must start its cluster, measure, write rows with every required field
(and raw samples where it keeps them) to the Parquet dataset, print the
same rows with --json, record its environment, and stop what it started.
"""

import datetime
import json
import os
import re

import pyarrow.parquet as pq
import pytest

from bench.results import SERIES_DIR
from bench.runner import read_environment
from bench.suite import QUICK, plan
from scenarios_testing import by_metric, json_rows, run_bench, stored

FAST_SESSION = ["--set", "broker.session.timeout.ms=1500", "--set", "broker.heartbeat.interval.ms=300"]


def test_suite_repeats_latency_runs_with_percentiles_samples_and_environment(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("suite", "--quick", "--only", "latency", "--repeats", "2", "--results", results, "--json",
                    timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = json_rows(out.stdout)
    rows, samples = stored(results, "latency")
    run_ids = {r["run_id"] for r in rows}
    assert len(run_ids) == 2, "two repeats are two runs: the report's noise figures need both"
    assert {r["run_id"] for r in printed} == run_ids and len(printed) == len(rows)
    for run_id in run_ids:
        metrics = {r["metric"]: r for r in rows if r["run_id"] == run_id}
        p = [metrics[f"e2e_latency_{k}"]["value"] for k in ("p50", "p95", "p99", "p99_9", "max")]
        assert 0 < p[0] <= p[1] <= p[2] <= p[3] <= p[4] < 5000, p
        assert all(metrics[f"e2e_latency_{k}"]["unit"] == "ms" for k in ("p50", "p99_9", "max"))
        assert metrics["records_lost"]["value"] == 0 and metrics["delivery_failures"]["value"] == 0
        assert json.loads(metrics["e2e_latency_p50"]["params"])["rate"] == 500
        # Every measured record (3 s at 500/s; the 1 s warm-up excluded) has its raw sample.
        mine = [s for s in samples if s["run_id"] == run_id]
        assert len(mine) == 1500 and {s["metric"] for s in mine} == {"e2e_latency"}
        assert max(s["value"] for s in mine) == metrics["e2e_latency_max"]["value"]
        # Per second of the measured phase: end-to-end latency by the second records were due, and broker CPU.
        series = pq.read_table(os.path.join(results, SERIES_DIR, run_id)).to_pylist()
        by = {m: sorted((r["t_s"], r["value"]) for r in series if r["metric"] == m)
              for m in ("e2e_latency_p50", "e2e_latency_p99", "broker_cpu_cores")}
        assert [t for t, _ in by["e2e_latency_p50"]] == [1.0, 2.0, 3.0], by
        assert all(p50 <= p99 for (_, p50), (_, p99) in zip(by["e2e_latency_p50"], by["e2e_latency_p99"]))
        assert max(v for _, v in by["e2e_latency_p99"]) <= metrics["e2e_latency_max"]["value"]
        assert len(by["broker_cpu_cores"]) >= 2 and all(0 <= v <= os.cpu_count() + 0.5
                                                         for _, v in by["broker_cpu_cores"]), by
        assert any(v > 0 for _, v in by["broker_cpu_cores"]), "the broker works while records flow"
        env = read_environment(results, run_id)
        assert env["cpu_count"] >= 1 and env["python_version"].count(".") == 2
        assert len(env["git_sha"]) == 40 and env["scenario"] == "latency" and env["params"]["rate"] == 500
        assert env["suite_id"] and "librdkafka" in env
        (cluster,) = env["clusters"]
        assert cluster["controllers"] == 1 and "process.roles=broker" in cluster["configs"]["broker-2"]


def test_failover_moves_every_partition_of_the_killed_leader(tmp_path):
    results = str(tmp_path / "results")
    started = datetime.datetime.now()
    clusters = tmp_path / "not" / "made" / "yet"
    out = run_bench("failover", "--brokers", "2", "--replication-factor", "2", "--partitions", "2",
                    *FAST_SESSION, "--results", results, "--json", "--dir", str(clusters), timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert clusters.is_dir()  # --dir is made if missing, like mkdir -p
    # The fault's wall-clock time, as the node logs write theirs, to line them up with it.
    (at,) = re.findall(r"^kill: broker \d at (\d\d:\d\d:\d\d,\d{3})$", out.stderr, re.MULTILINE)
    at = datetime.datetime.combine(started.date(), datetime.datetime.strptime(at, "%H:%M:%S,%f").time())
    assert started <= at <= datetime.datetime.now(), (started, at)
    metrics = by_metric(json_rows(out.stdout))
    assert metrics["partitions_without_leader"]["value"] == 0
    for clock in ("metadata", "produce", "client"):
        worst = metrics[f"leader_failover_{clock}_ms_max"]
        assert worst["unit"] == "ms" and worst["fault"] == "kill" and worst["session_timeout_ms"] == 1500
        # The controller learns of a SIGKILLed broker only when its session expires.
        assert 1000 < worst["value"] < 30_000, worst
        assert metrics[f"leader_failover_{clock}_ms_min"]["value"] <= worst["value"]
    # The cluster noticed the failure (the survivor's Metadata dropped the
    # victim) once the session expired (300 ms heartbeats, 1500 ms session),
    # and no new leader was named before that (give or take the probe's poll).
    fenced = metrics["leader_failover_fenced_ms"]["value"]
    assert 1000 < fenced < 30_000 and fenced <= metrics["leader_failover_metadata_ms_min"]["value"] + 500
    for clock in ("metadata", "produce", "client"):
        after = metrics[f"leader_failover_{clock}_ms_median_after_fence"]["value"]
        assert after == pytest.approx(metrics[f"leader_failover_{clock}_ms_median"]["value"] - fenced)
    assert re.search(r"│ fenced +│ +[\d,]+ │", out.stderr)
    # The CPU the cluster spent from the fence to the last write, and the bench's own.
    cpu = {group: metrics[f"leader_failover_{group}_cpu_s_after_fence"] for group in ("brokers", "controllers", "bench")}
    assert all(row["unit"] == "s" and 0 <= row["value"] < 30 for row in cpu.values()), cpu
    per_partition = metrics["leader_failover_cluster_cpu_us_per_partition_after_fence"]
    assert per_partition["value"] == pytest.approx(
        (cpu["brokers"]["value"] + cpu["controllers"]["value"]) / per_partition["led"] * 1e6)
    assert 0 <= metrics["leader_failover_machine_busy_after_fence"]["value"] <= 1
    assert re.search(r"CPU from the fence to the last write \([\d.]+ s\): brokers [\d.]+ s, controllers [\d.]+ s",
                     " ".join(out.stderr.split()))  # rich wraps long lines
    rows, samples = stored(results, "failover")
    assert {r["metric"] for r in rows} == set(metrics)
    moved = {s["metric"] for s in samples}
    assert moved == {"leader_failover_metadata", "leader_failover_produce", "leader_failover_client"}


def test_controller_failover_times_the_election_and_the_first_write_after_it(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("controller-failover", "--results", results, "--json", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    election, write = metrics["controller_election_ms"]["value"], metrics["controller_failover_ms"]["value"]
    assert 0 < election < 30_000 and 0 < write < 30_000
    assert metrics["controller_failover_ms"]["controllers"] == 3
    rows, _ = stored(results, "controller-failover")
    assert len(rows) == 2


def test_metadata_scale_sees_every_partition_on_every_broker_and_times_a_restart(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("metadata-scale", "--controllers", "1", "--brokers", "2", "--partitions", "30", "--topics", "3",
                    "--results", results, "--json", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    assert 0 < metrics["create_topics_ms"]["value"] <= metrics["metadata_propagation_ms"]["value"] + 1000
    assert metrics["metadata_propagation_ms"]["partitions"] == 30
    restart = [metrics[m]["value"] for m in ("broker_restart_ready_ms", "broker_restart_unfenced_ms",
                                              "broker_catchup_ms")]
    assert all(0 < v < 120_000 for v in restart) and metrics["broker_shutdown_ms"]["value"] > 0
    _, samples = stored(results, "metadata-scale")
    assert len(samples) == 2  # one per broker: when it listed every partition


@pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="a soak: RAFTKA_SOAK=1 (20-40 minutes)")
def test_one_broker_holds_100000_partitions_through_a_controlled_shutdown_and_restart(tmp_path):
    # Beyond the open-files limit (20,000 on the test machines): segment
    # files are opened lazily; no metadata batch carries more than 10,000
    # partition changes, so the controlled shutdown and the restart's
    # elections fit.
    results = str(tmp_path / "results")
    out = run_bench("metadata-scale", "--controllers", "1", "--brokers", "1", "--partitions", "100000",
                    "--topics", "100", "--sample", "2000", "--timeout", "1800", "--results", results, "--json",
                    timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = by_metric(json_rows(out.stdout))
    assert metrics["metadata_propagation_ms"]["partitions"] == 100000
    assert metrics["broker_shutdown_ms"]["value"] < 300_000
    assert metrics["broker_catchup_ms"]["value"] < 1_800_000


@pytest.mark.parametrize("quick", [True, False])
def test_every_suite_entry_is_a_valid_command_line(quick):
    from raftka.cli import build_parser

    parser = build_parser()
    for name, argv in plan(quick=quick, repeats=1, only=None):
        args = parser.parse_args(["bench", name, *argv])
        assert args.scenario == name and callable(args.func)


def test_the_quick_suite_runs_each_entry_round_robin():
    runs = plan(quick=True, repeats=3, only=None)
    assert len(runs) == 3 * len(QUICK) and runs[: len(QUICK)] == runs[len(QUICK): 2 * len(QUICK)]
    assert [name for name, _ in plan(quick=True, repeats=2, only={"latency", "failover"})] == [
        "latency", "failover", "latency", "failover"]


@pytest.mark.parametrize("args, says", [
    (("produce", "--rf", "0"), "--replication-factor (0)"),
    (("produce", "--partitions", "0"), "--partitions (0)"),
    (("consume", "--controllers", "0"), "--controllers (0)"),
    (("produce", "--brokers", "1", "--rf", "2"), "--replication-factor 2 needs at least that many --brokers"),
    (("produce", "--set", "log.retention.ms"), "--set 'log.retention.ms': expected KEY=VALUE"),
    (("failover", "--partitions", "0"), "--partitions, --timeout and --session-timeout-ms must be positive"),
    (("failover", "--client-partitions", "-1"), "--client-partitions at least 0"),
    (("produce", "--results", "{file}/results"), "--results {file}/results: cannot make the directory"),
    (("produce", "--tansu", "{file}"), "--tansu {file} is not an executable file"),
    (("failover", "--dir", "{file}/clusters"), "--dir {file}/clusters: cannot make the directory (Not a directory)"),
    (("storage", "--dir", "{file}/files"), "--dir {file}/files: cannot make the directory"),
    (("quorum", "--dir", "{file}/controllers"), "--dir {file}/controllers: cannot make the directory"),
    (("quorum", "--writers", "0"), "--writers"),
    (("quorum", "--duration", "0"), "--duration"),
])
def test_bad_options_are_refused_before_anything_runs(tmp_path, args, says):
    """Most of these used to say what was wrong only after a client-ceiling
    run, a cluster start or the whole measurement, or as a traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = tuple(a.format(file=blocker) for a in args)
    if "--results" not in args:
        args += ("--results", str(tmp_path / "results"))
    if "--dir" not in args:
        args += ("--dir", str(tmp_path / "clusters"))
    out = run_bench(*args, timeout=60)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert says.format(file=blocker) in out.stderr, out.stderr[-3000:]
    assert "client ceiling" not in out.stderr + out.stdout  # nothing was measured first
    clusters = tmp_path / "clusters"
    assert not clusters.exists() or not any(clusters.iterdir())  # no cluster was started


def test_rebalance_measures_both_protocols_and_the_consumer_protocol_keeps_partitions_flowing(tmp_path):
    results = str(tmp_path / "results")
    out = run_bench("rebalance", "--members", "2", "--partitions", "6", "--results", results, "--json", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json_rows(out.stdout)
    got = {(r["protocol"], r["metric"]): r["value"] for r in rows}
    assert set(got) == {(p, m) for p in ("classic", "consumer") for m in ("join_to_split_s", "kept_pause_s", "steady_pause_s")}
    # The newcomer is taken in within a few heartbeats (300 ms each), and a
    # kept partition waits for records no longer than a heartbeat or two.
    assert 0 < got[("consumer", "join_to_split_s")] < 5
    assert got[("consumer", "kept_pause_s")] < 1.0
    assert "classic/consumer" in out.stdout + out.stderr
    assert len(stored(results, "rebalance")[0]) == 6
