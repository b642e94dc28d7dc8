"""The bench runner: what every cluster scenario shares.

Theory of operation
-------------------
A scenario (`raftka bench latency`, `failover`, ...) opens one `Runner`
and does its work inside it:

    with Runner("failover", args, params) as runner:
        cluster = runner.cluster(controllers=1, brokers=3)   # started, READY
        ...warm-up..., runner.phase("measure")
        t0 = runner.inject(cluster, victim, "kill")           # fault injection
        runner.row("leader_failover_ms", ..., "ms")
    # rows, raw samples and the environment are written; everything stopped

- **Clusters** come from `LocalCluster` (the `raftka cluster up`
  machinery), in a temp dir of the runner's own, each node with
  PR_SET_PDEATHSIG so that even a SIGKILLed bench leaves no node behind.
  `mode="zk"` is passed to the launcher once it accepts a `mode`; until
  then it raises `ModeNotAvailableError`, which says so.
- **Stopping.** While the runner is open, SIGINT and SIGTERM raise
  `BenchInterrupted` (a KeyboardInterrupt: `raftka` exits 130) in the main
  thread. A signal that lands inside a `trio.run` (trio code must not see
  an exception at an arbitrary bytecode) is re-sent 50 ms later, until it
  lands outside; trio code that runs for long goes through
  `runner.trio_run`, which listens for the signals itself and cancels.
  On the way out, whatever the reason, the runner resumes paused nodes,
  stops every cluster it started (SIGTERM, SIGKILL after a timeout) with
  further signals ignored, and removes its temp dir (kept, and named, if
  the scenario failed, for the node logs). Load-generator processes are
  reaped by `load_generator.run_workers` as the exception unwinds.
- **Faults.** `inject(cluster, node_id, fault)` with fault `kill`
  (SIGKILL, waits until the process is gone), `stop` (SIGSTOP: the node
  freezes with its sockets open, as in a long GC pause or a VM stall;
  resumed by `resume` or at cleanup) or `term` (SIGTERM: a clean,
  controlled shutdown). It returns the monotonic time just before the
  signal, the zero of the failover clocks.
- **Results.** `row(metric, value, unit)` and `samples(metric, unit,
  values)` collect; `finish()` writes the rows (`bench.results.write_rows`)
  and raw samples under one run id, and the run's environment as a CBOR
  sidecar `<results>/_runs/<run_id>.cbor` (`read_environment`): git sha
  and whether the tree was dirty, CPU count, Python, platform, librdkafka,
  load average, the command line, the scenario's params and every node's
  config file. With `--json` each row is also printed as one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.cli import add_common_options
from common.errors import RaftkaError

MODES = ("kraft", "zk")
#: quorum.engine values; the first is the default.
ENGINES = ("raftka", "pysyncobj")
FAULTS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}
RUNS_DIR = "_runs"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
_RESEND_S = 0.05


class BenchError(RaftkaError):
    """A scenario cannot run as asked or its cluster misbehaved; the message says what to change."""


class ModeNotAvailableError(BenchError):
    """The metadata mode asked for is not available in this build."""


class BenchInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached a running bench."""


def add_run_options(p: argparse.ArgumentParser, *, controllers: int, brokers: int) -> None:
    """The options every cluster scenario takes (plus --results and --json)."""
    p.add_argument("--mode", choices=MODES, default="kraft",
                   help="metadata mode of the cluster: kraft (a Raft quorum of --controllers) or zk (a ZooKeeper "
                        "ensemble of --controllers servers; a broker is the controller)")
    p.add_argument("--controllers", type=int, default=controllers, help=f"controllers (default {controllers})")
    p.add_argument("--brokers", type=int, default=brokers, help=f"brokers (default {brokers})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for every node, e.g. --set broker.session.timeout.ms=3000")
    p.add_argument("--dir", default=None,
                   help="where the cluster's temp dir goes (made if missing; default: system temp)")
    add_common_options(p)


def add_engine_option(p: argparse.ArgumentParser) -> None:
    """`--quorum-engine`: which Raft the KRaft controllers run (the three-way metadata comparison)."""
    p.add_argument("--quorum-engine", choices=ENGINES, default=None,
                   help="the KRaft controllers' Raft (quorum.engine): raftka's own (default) or pysyncobj's; "
                        "rows carry it as params.engine (zookeeper with --mode zk)")


def engine_overrides(args: argparse.Namespace, overrides: dict[str, str]) -> str:
    """Put `--quorum-engine` into the cluster's `overrides` (quorum.engine) and
    return the metadata backend the rows carry: raftka, pysyncobj or zookeeper."""
    chosen = getattr(args, "quorum_engine", None)
    set_engine = overrides.get("quorum.engine")
    if chosen and set_engine and chosen != set_engine:
        raise BenchError(f"--quorum-engine {chosen} and --set quorum.engine={set_engine} disagree: give one of them")
    engine = chosen or set_engine or ENGINES[0]
    if getattr(args, "mode", "kraft") == "zk":
        if engine != ENGINES[0]:
            raise BenchError(f"quorum.engine={engine} is a KRaft controllers' setting; with --mode zk the "
                             "metadata lives in ZooKeeper: drop --quorum-engine or use --mode kraft")
        return "zookeeper"
    if engine != ENGINES[0]:
        overrides["quorum.engine"] = engine
    return engine


def require_mode(mode: str) -> bool:
    """Raise ModeNotAvailableError unless the launcher can start `mode`; whether it takes a `mode` argument."""
    import inspect

    from cluster import LocalCluster

    if "mode" in inspect.signature(LocalCluster).parameters:
        return True
    if mode != "kraft":
        raise ModeNotAvailableError(
            f"--mode {mode} is not available yet: the local cluster launcher starts KRaft clusters only "
            "(the ZooKeeper-mode controller is still being built); use --mode kraft")
    return False


def filesystem_type(path: str) -> str:
    """The type (ext4, tmpfs, overlay, ...) of the filesystem holding `path`, from /proc/mounts."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")) \
                        and len(fields[1]) >= len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        pass
    return kind


#: The key that sets how long a dead broker keeps its partitions, per mode.
SESSION_TIMEOUT_KEYS = {"kraft": "broker.session.timeout.ms", "zk": "zookeeper.session.timeout.ms"}


def session_overrides(mode: str, session_timeout_ms: int | None, overrides: dict[str, str]) -> tuple[dict[str, str], int]:
    """`overrides` with the mode's session timeout key set (unless --set gave it), and its value.

    KRaft fences a broker `broker.session.timeout.ms` after its last
    heartbeat; ZooKeeper mode moves its leaders when its ZooKeeper session
    (`zookeeper.session.timeout.ms`) expires. Comparing the modes fairly
    means the same value for both."""
    key = SESSION_TIMEOUT_KEYS[mode]
    out = dict(overrides)
    if session_timeout_ms is not None:
        out.setdefault(key, str(session_timeout_ms))
        if mode == "kraft":
            # Kafka's ratio: a 2000 ms heartbeat in a 9000 ms session (shorter sessions need shorter beats).
            out.setdefault("broker.heartbeat.interval.ms", str(max(100, min(2000, session_timeout_ms // 4))))
    default = 9000 if mode == "kraft" else 18000
    return out, int(out.get(key, default))


def parse_sets(items: list[str]) -> dict[str, str]:
    from common.config import parse_overrides

    return parse_overrides(items)


# --- environment -------------------------------------------------------------------------


def environment(argv: list[str] | None = None) -> dict[str, Any]:
    """What a result depends on besides the code: see the module docstring."""
    from bench.results import git_sha

    env: dict[str, Any] = {
        "git_sha": git_sha(),
        "git_dirty": _git_dirty(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count() or 0,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "argv": list(sys.argv if argv is None else argv),
        "loadavg": list(os.getloadavg()),
        "started_ms": int(time.time() * 1000),
    }
    try:
        import confluent_kafka

        env["confluent_kafka"] = confluent_kafka.version()[0]
        env["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    return env


def _git_dirty() -> bool | None:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True, timeout=5, cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def write_environment(results_dir: str, run_id: str, env: Mapping[str, Any]) -> str:
    import cbor2

    directory = os.path.join(results_dir, RUNS_DIR)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{run_id}.cbor")
    with open(path + ".tmp", "wb") as f:
        cbor2.dump(dict(env), f)
    os.replace(path + ".tmp", path)
    return path


def read_environment(results_dir: str, run_id: str) -> dict[str, Any]:
    import cbor2

    with open(os.path.join(results_dir, RUNS_DIR, f"{run_id}.cbor"), "rb") as f:
        return cbor2.load(f)


# --- the runner ------------------------------------------------------------------------


class Runner:
    """One scenario invocation; see the module docstring."""

    def __init__(self, scenario: str, args: argparse.Namespace, params: dict[str, Any],
                 console: Any = None) -> None:
        from rich.console import Console

        from bench.results import new_run_id

        self.scenario = scenario
        self.args = args
        self.mode = getattr(args, "mode", "kraft")
        # The config keys set on the cluster's nodes (--set) are parameters too.
        self.params = {**params, **({"sets": ",".join(sorted(args.set))} if getattr(args, "set", None) else {})}
        # Where the nodes' logs live decides what an fsync costs (a tmpfs: nothing): a parameter too.
        if getattr(args, "dir", None):
            self.params["data_dir_fs"] = filesystem_type(args.dir)
        self.console = console or Console(stderr=bool(getattr(args, "json", False)))
        self.run_id = new_run_id()
        self.env = environment()
        if getattr(args, "suite_id", None):
            self.env["suite_id"] = args.suite_id
        self.rows: list[dict[str, Any]] = []
        self._samples: list[tuple[str, str, list[float], dict[str, Any]]] = []
        self._series: list[tuple[str, str, list[tuple[float, float]], dict[str, Any]]] = []
        self._events: list[tuple[str, float, float]] = []
        self._clusters: list[Any] = []
        self._paused: list[tuple[Any, int]] = []
        self._faults: dict[tuple[int, int], str] = {}
        self._tmp: str | None = None
        self._previous: dict[int, Any] = {}
        self._signal: str | None = None
        self._closing = False

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Runner:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._closing = True
        for s in self._previous:
            signal.signal(s, signal.SIG_IGN)  # stopping: a second Ctrl-C must not cut the cleanup short
        try:
            self.cleanup(failed=exc_type is not None and not issubclass(exc_type, KeyboardInterrupt))
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
        if self._signal is not None and exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            # The signal surfaced as another error (e.g. inside a library); report it as what it was.
            raise BenchInterrupted(self._signal) from exc
        return False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._closing:
            return
        import trio

        self._signal = signal.Signals(signum).name
        if trio.lowlevel.in_trio_run():
            # Not here: re-send it shortly, until it lands outside trio (see the module docstring).
            threading.Timer(_RESEND_S, os.kill, (os.getpid(), signum)).start()
            return
        raise BenchInterrupted(self._signal)

    def cleanup(self, failed: bool = False) -> None:
        """Resume paused nodes, stop every cluster started here, remove the temp dir."""
        for cluster, node_id in self._paused:
            self._cont(cluster, node_id)
        self._paused.clear()
        if self._clusters:
            with self.console.status("stopping the cluster"):
                for cluster in self._clusters:
                    cluster.stop_all(STOP_TIMEOUT_S)
        self._clusters.clear()
        if self._tmp is not None:
            if failed:
                self.console.print(f"the cluster's data dir and node logs are kept in {self._tmp}")
            else:
                shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # --- clusters and faults -----------------------------------------------------------------

    def cluster(self, *, controllers: int, brokers: int, overrides: Mapping[str, str] | None = None,
                broker_overrides: Mapping[str, str] | None = None, metrics: bool = False,
                secure_protocol: str | None = None) -> Any:
        """A started `LocalCluster` in this runner's mode, ready (READY, caught up, unfenced)."""
        from cluster import ClusterError, LocalCluster

        kwargs: dict[str, Any] = {"mode": self.mode} if require_mode(self.mode) else {}
        if secure_protocol is not None:
            # A TLS (SSL or SASL_SSL) listener on every broker beside PLAINTEXT; the nodes'
            # own links stay PLAINTEXT, so that the comparison is of the clients' path alone.
            kwargs.update(secure=True, secure_protocol=secure_protocol, secure_links=False)
        if self._tmp is None:
            # `raftka bench` made --dir, if given, before the run (common.dirs.ensure_dir).
            self._tmp = tempfile.mkdtemp(prefix=f"raftka-bench-{self.scenario}-", dir=getattr(self.args, "dir", None))
        base = Path(self._tmp) / f"cluster-{len(self._clusters)}"
        cluster = LocalCluster(base, controllers=controllers, brokers=brokers, overrides=overrides,
                               broker_overrides=broker_overrides, die_with_parent=True, metrics=metrics, **kwargs)
        self._clusters.append(cluster)
        t0 = time.monotonic()
        cluster.start_all()
        try:
            with self.console.status("starting the cluster") as status:
                cluster.wait_ready(READY_TIMEOUT_S, progress=status.update)
        except ClusterError as exc:
            raise BenchError(f"the bench cluster did not start: {exc}") from None
        self.say(f"cluster up: {controllers} controller(s), {brokers} broker(s), mode {self.mode}, "
                 f"ready in {time.monotonic() - t0:.1f} s")
        self.env.setdefault("clusters", []).append({
            "controllers": controllers, "brokers": brokers, "mode": self.mode,
            "overrides": dict(overrides or {}), "broker_overrides": dict(broker_overrides or {}),
            "configs": {f"{n.role}-{n.node_id}": n.config_path.read_text() for n in cluster.nodes.values()},
        })
        return cluster

    def inject(self, cluster: Any, node_id: int, fault: str) -> float:
        """Send `fault` (kill, stop, term) to a node; the monotonic time just before it."""
        if fault not in FAULTS:
            raise BenchError(f"fault {fault!r}: use one of {', '.join(FAULTS)}")
        node = cluster.node(node_id)
        if not node.is_running():
            raise BenchError(f"{node.role} {node_id} is not running; cannot inject {fault}")
        self._faults[(id(cluster), node_id)] = fault
        wall = time.time()
        t0 = time.monotonic()
        if fault == "kill":
            cluster.kill(node_id, signal.SIGKILL)
        elif fault == "stop":
            self._paused.append((cluster, node_id))
            os.kill(node.pid, signal.SIGSTOP)
        else:
            cluster.kill(node_id, signal.SIGTERM)
        # On the node logs' clock, so a reader can line the logs up with the fault.
        self.say(f"{fault}: {node.role} {node_id} at {time.strftime('%H:%M:%S', time.localtime(wall))}"
                 f",{int(wall * 1000) % 1000:03d}")
        return t0

    def resume(self, cluster: Any, node_id: int) -> None:
        """SIGCONT a node paused by `inject(..., "stop")`."""
        if (cluster, node_id) in self._paused:
            self._paused.remove((cluster, node_id))
            self._cont(cluster, node_id)

    @staticmethod
    def _cont(cluster: Any, node_id: int) -> None:
        node = cluster.node(node_id)
        if node.is_running():
            os.kill(node.pid, signal.SIGCONT)

    def restart(self, cluster: Any, node_id: int, wait: bool = True) -> None:
        """Bring a faulted node back: resume a paused one; start a killed or terminated one
        (once its controlled shutdown is over); then, with `wait`, until the cluster is ready."""
        from cluster import ClusterError

        node = cluster.node(node_id)
        fault = self._faults.pop((id(cluster), node_id), None)
        if fault == "stop":
            self.resume(cluster, node_id)
        elif fault == "term" and node.is_running():
            try:
                node.process.wait(timeout=STOP_TIMEOUT_S * 3)
            except subprocess.TimeoutExpired:
                cluster.kill(node_id, signal.SIGKILL)
        if not node.is_running():
            cluster.start(node_id)
        if wait:
            try:
                cluster.wait_ready(READY_TIMEOUT_S)
            except ClusterError as exc:
                raise BenchError(f"{node.role} {node_id} did not come back: {exc}") from None

    # --- phases and progress ------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def phase(self, name: str, detail: str = "") -> None:
        """Announce a phase (warm-up, measure, ...) on the console, one line each."""
        self.say(f"phase {name}" + (f": {detail}" if detail else ""))

    def progress(self, unit: str = "") -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn(unit), TimeElapsedColumn(), console=self.console, transient=False)

    @contextlib.contextmanager
    def timed(self, description: str, seconds: float) -> Iterator[Callable[[], None]]:
        """A progress bar over `seconds`; the caller calls the yielded `tick()` now and then."""
        with self.progress("s") as progress:
            task = progress.add_task(description, total=max(1, round(seconds)))
            t0 = time.monotonic()

            def tick() -> None:
                progress.update(task, completed=min(seconds, time.monotonic() - t0))

            yield tick
            progress.update(task, completed=max(1, round(seconds)))

    def trio_run(self, async_fn: Callable[..., Any], *args: Any) -> Any:
        """`trio.run(async_fn, *args)`, cancelled by SIGINT/SIGTERM (then BenchInterrupted)."""
        import trio

        got: list[str] = []

        async def main() -> Any:
            async with trio.open_nursery() as nursery:
                result: list[Any] = []

                async def work() -> None:
                    result.append(await async_fn(*args))
                    nursery.cancel_scope.cancel()

                async def watch() -> None:
                    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for signum in signals:
                            got.append(signal.Signals(signum).name)
                            nursery.cancel_scope.cancel()
                            return

                nursery.start_soon(watch)
                nursery.start_soon(work)
            return result[0] if result else None

        out = trio.run(main)
        if got:
            self._signal = got[0]
            raise BenchInterrupted(got[0])
        return out

    # --- results -----------------------------------------------------------------------

    def row(self, metric: str, value: float, unit: str, **extra_params: Any) -> None:
        self.rows.append({"scenario": self.scenario, "mode": self.mode, "params": {**self.params, **extra_params},
                          "metric": metric, "value": float(value), "unit": unit})

    def samples(self, metric: str, unit: str, values: list[float], **extra_params: Any) -> None:
        if values:
            self._samples.append((metric, unit, [float(v) for v in values], extra_params))

    def series(self, metric: str, unit: str, points: list[tuple[float, float]], **extra_params: Any) -> None:
        """Per-interval values inside the run: `(t_s, value)` on the run's event clock."""
        if points:
            self._series.append((metric, unit, [(float(t), float(v)) for t, v in points], extra_params))

    def event(self, what: str, start_s: float, end_s: float) -> None:
        """Something that happened inside the run (a fault from injection to heal), on the series' clock."""
        self._events.append((what, float(start_s), float(end_s)))

    def finish(self) -> str | None:
        """Write the rows, samples and environment; print JSON rows with --json; the rows' file."""
        from bench.results import write_events, write_histogram, write_rows, write_samples, write_series

        if not self.rows:
            self.say("no measurement to write")
            return None
        results = self.args.results
        path = write_rows(results, self.rows, run_id=self.run_id)
        for metric, unit, values, extra in self._samples:
            write_samples(results, self.run_id, scenario=self.scenario, mode=self.mode,
                          params={**self.params, **extra}, metric=metric, unit=unit, values=values)
            write_histogram(results, self.run_id, scenario=self.scenario, mode=self.mode,
                            params={**self.params, **extra}, metric=metric, unit=unit, values=values)
        for metric, unit, points, extra in self._series:
            write_series(results, self.run_id, scenario=self.scenario, mode=self.mode,
                         params={**self.params, **extra}, metric=metric, unit=unit, points=points)
        write_events(results, self.run_id, scenario=self.scenario, mode=self.mode, params=self.params,
                     events=self._events)
        write_environment(results, self.run_id, {
            **self.env, "run_id": self.run_id, "scenario": self.scenario, "mode": self.mode,
            "params": self.params, "ended_ms": int(time.time() * 1000)})
        self.say(f"run {self.run_id}: {len(self.rows)} rows appended to {path}")
        if getattr(self.args, "json", False):
            for r in self.rows:
                print(json.dumps({"run_id": self.run_id, **{k: v for k, v in r.items() if k != "params"},
                                  **r["params"]}))
            sys.stdout.flush()
        return path

    def table(self, title: str, lines: list[tuple[str, ...]], columns: tuple[str, ...] = ("", "value", "note")) -> None:
        from rich.table import Table

        table = Table(title=title)
        for i, column in enumerate(columns):
            table.add_column(column, justify="right" if i == 1 else "left")
        for line in lines:
            table.add_row(*line)
        self.console.print(table)
