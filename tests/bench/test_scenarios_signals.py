"""Ctrl-C (SIGINT) or SIGTERM to a running `raftka bench ...` stops every process it started.

The bench's descendants (controller and broker processes, which run in
sessions of their own, and the load-generator processes) are collected from
/proc while it runs; after the signal the bench must exit 130 by itself
and none of them may be left, nor the cluster's temp dir.
"""

import signal
import time

import pytest

from scenarios_testing import BenchProcess, alive, command_line


def cluster_nodes(bench: BenchProcess) -> list[int]:
    return [pid for pid in bench.seen if " raftka.cli controller " in command_line(pid) or
            " raftka.cli broker " in command_line(pid)]


def load_generators(bench: BenchProcess) -> list[int]:
    return [pid for pid in bench.seen if "spawn_main" in command_line(pid) and alive(pid)]


@pytest.fixture
def bench_process():
    started = []

    def start(*args: str) -> BenchProcess:
        started.append(BenchProcess(*args))
        return started[-1]

    yield start
    for b in started:
        b.kill_everything()


def assert_stopped_everything(bench: BenchProcess, clusters_dir, timeout: float = 60) -> None:
    assert bench.process.wait(timeout) == 130, bench.lines[-20:]
    deadline = time.monotonic() + 5
    while (left := [pid for pid in bench.seen if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [(pid, command_line(pid)) for pid in left]
    assert list(clusters_dir.iterdir()) == [], "the runner's temp dir must be removed"


def test_ctrl_c_while_measuring_stops_the_cluster_and_the_load_generators(bench_process, tmp_path):
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    bench = bench_process("latency", "--rate", "200", "--duration", "120", "--warmup", "1", "--json",
                          "--results", str(tmp_path / "results"), "--dir", str(clusters))
    bench.watch_until(lambda b: b.printed("phase warm-up"), timeout=120)
    bench.watch_until(lambda b: len(load_generators(b)) >= 2, timeout=30)  # the producer and the consumer
    time.sleep(1.0)
    assert len(cluster_nodes(bench)) == 2
    bench.process.send_signal(signal.SIGINT)
    assert_stopped_everything(bench, clusters)
    # The bench makes --results before it runs; an interrupted run leaves it empty.
    assert [p for p in (tmp_path / "results").rglob("*") if p.is_file()] == [], "an interrupted run writes no rows"


def test_sigterm_while_the_cluster_starts_stops_it(bench_process, tmp_path):
    # The launcher's readiness probes run inside trio.run: the signal is re-sent until it lands outside.
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    bench = bench_process("controller-failover", "--json", "--results", str(tmp_path / "results"),
                          "--dir", str(clusters))
    bench.watch_until(lambda b: len(cluster_nodes(b)) == 4, timeout=60)
    bench.process.send_signal(signal.SIGTERM)
    assert_stopped_everything(bench, clusters)
