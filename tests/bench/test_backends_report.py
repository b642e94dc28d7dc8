"""The three metadata backends side by side, from real bench rows.

`raftka bench topic-create` runs on raftka's Raft, on pysyncobj's
(`--quorum-engine pysyncobj`) and on ZooKeeper (`--mode zk`), small; then
`raftka report` must line the three up in one table, each cell the
bench's own figure, with the ratios to raftka's Raft. ZooKeeper mode runs
on real ZooKeeper (the Debian package); this test skips where it is not
installed.
"""

import json

import pytest
from scenarios_testing import json_rows, run_bench
from test_bench_report import cli, md_tables, number

from quorum.zookeeper.ensemble import zookeeper_missing_reason

needs_zookeeper = pytest.mark.skipif(zookeeper_missing_reason() is not None,
                                     reason=str(zookeeper_missing_reason()))

COMMON = ("topic-create", "--topics", "4", "--brokers", "1", "--rf", "1", "--concurrency", "2", "--json")


@needs_zookeeper
def test_report_sets_raftka_pysyncobj_and_zookeeper_side_by_side(spark, tmp_path, capsys):
    results = str(tmp_path / "results")
    figures: dict[str, dict[str, float]] = {}
    for backend, extra in (("raftka", ()), ("pysyncobj", ("--quorum-engine", "pysyncobj")),
                           ("zookeeper", ("--mode", "zk"))):
        out = run_bench(*COMMON, *extra, "--results", results, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = json_rows(out.stdout)
        assert {r["engine"] for r in rows} == {backend}
        figures[backend] = {r["metric"]: r["value"] for r in rows}

    assert cli(["report", "--results", results, "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    (table,) = md_tables((tmp_path / "report" / "report.md").read_text())["Backends (medians)"]
    lines = {line["scenario"] + " " + line["measurement"]: line for line in table}
    rate = lines["topic-create topic creations/s"]
    for backend, column in (("raftka", "raftka Raft"), ("pysyncobj", "pysyncobj"), ("zookeeper", "ZooKeeper")):
        assert number(rate[column]) == pytest.approx(figures[backend]["topic_create_rate"], rel=1e-3)
        assert number(lines["topic-create every broker lists every new topic"][column]) == pytest.approx(
            figures[backend]["topic_create_all_brokers_ms"], rel=1e-3)
    for backend, column in (("pysyncobj", "pysyncobj/raftka"), ("zookeeper", "ZooKeeper/raftka")):
        assert number(rate[column]) == pytest.approx(
            figures[backend]["topic_create_rate"] / figures["raftka"]["topic_create_rate"], rel=1e-3)
    assert rate["better"] == "higher" and "engine" not in rate["params"]

    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    (line,) = [b for b in summary["backends"] if b["metric"] == "topic_create_rate"]
    assert line["pysyncobj"] == figures["pysyncobj"]["topic_create_rate"]


def test_an_engine_with_zookeeper_mode_or_two_engines_name_the_setting(tmp_path):
    out = run_bench("topic-create", "--mode", "zk", "--quorum-engine", "pysyncobj", "--results", str(tmp_path))
    assert out.returncode == 2
    assert "quorum.engine=pysyncobj" in out.stderr and "--mode kraft" in out.stderr
    out = run_bench("metadata-scale", "--quorum-engine", "pysyncobj", "--set", "quorum.engine=raftka",
                    "--results", str(tmp_path))
    assert out.returncode == 2
    assert "--quorum-engine pysyncobj and --set quorum.engine=raftka disagree" in out.stderr
    out = run_bench("quorum", "--mode", "zk", "--only", "failover", "--results", str(tmp_path))
    assert out.returncode != 0 and "controller-failover --mode zk" in out.stderr


@needs_zookeeper
def test_bench_quorum_in_zookeeper_mode_times_the_same_writes_on_three_zookeeper_servers(tmp_path):
    out = run_bench("quorum", "--mode", "zk", "--duration", "1", "--writers", "4", "--batch-writers", "1",
                    "--results", str(tmp_path), "--json", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json_rows(out.stdout)
    assert {(r["mode"], r["engine"], r["voters"]) for r in rows} == {("zk", "zookeeper", 3)}
    rates = {(r["write"], r["writers"]): r["value"] for r in rows if r["metric"] == "committed_records_per_s"}
    assert set(rates) == {("single", 1), ("single", 4), ("batch", 1)} and all(v > 0 for v in rates.values())
    p50, p99 = ([r["value"] for r in rows if r["metric"] == m and r["writers"] == 1 and r["write"] == "single"]
                for m in ("commit_latency_p50", "commit_latency_p99"))
    assert 0 < p50[0] <= p99[0]
