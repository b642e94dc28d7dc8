"""`raftka migrate`: move a local ZooKeeper-mode cluster to a KRaft quorum (KIP-866).

    raftka migrate --data-dir D [--zookeeper H:P] [--finalize] [--timeout S]
    raftka migrate finalize --data-dir D
    raftka migrate rollback --data-dir D

D is a cluster made by `raftka cluster up --mode zk --data-dir D`, stopped
(Ctrl-C keeps its data). `raftka migrate` starts it again in ZooKeeper mode
and, showing each step: starts one KRaft controller per ZooKeeper server in
migration mode (they copy ZooKeeper's metadata into the quorum in one batch
and claim /controller), then restarts the brokers in KRaft mode one at a
time on their own log dirs, waiting for each to be unfenced and back in
every ISR. It then prints `READY bootstrap=...` and keeps serving, while
the controllers dual-write every metadata change to ZooKeeper.

From another terminal, `raftka migrate finalize --data-dir D` ends the
migration (controllers restarted without migration mode; ZooKeeper is no
longer written) and `raftka migrate rollback --data-dir D`, before
finalize, returns to ZooKeeper mode (controllers stopped, brokers restarted
in ZooKeeper mode; ZooKeeper is current thanks to dual write). Both ask the
running `raftka migrate` (SIGUSR1 / SIGUSR2). Ctrl-C stops the cluster;
after a finalized migration `raftka cluster up --data-dir D --controllers N`
resumes it in KRaft mode.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from common.errors import RaftkaError

_STANDARD_KEYS = {"broker.id", "node.id", "zookeeper.connect", "log.dirs", "listeners", "process.roles",
                  "controller.quorum.voters"}


class _Stop(BaseException):
    pass


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="migrate a local ZooKeeper-mode cluster to a KRaft quorum (KIP-866)",
                       description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=("start", "finalize", "rollback"), default="start",
                   help="start (default): migrate and serve; finalize / rollback: ask the running migrate")
    p.add_argument("--data-dir", required=True, metavar="D", help="the cluster's dir (raftka cluster up --data-dir)")
    p.add_argument("--zookeeper", metavar="H:P", help="the cluster's ZooKeeper (checked against D's)")
    p.add_argument("--finalize", action="store_true", help="finalize right after the brokers moved")
    p.add_argument("--timeout", type=float, default=180.0, metavar="S", help="give up a step after S seconds")
    p.set_defaults(func=main)


def _state(data_dir: Path) -> dict:
    path = data_dir / "cluster.json"
    if not path.exists():
        raise RaftkaError(f"{path} does not exist: make the cluster with `raftka cluster up --mode zk --data-dir "
                          f"{data_dir}` first")
    return json.loads(path.read_text())


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    data_dir = Path(args.data_dir).resolve()
    try:
        state = _state(data_dir)
        if args.action != "start":
            pid = state.get("migrate_pid")
            if not _alive(pid):
                raise RaftkaError(f"no `raftka migrate --data-dir {data_dir}` is running; {args.action} acts on the "
                                  "running migration")
            os.kill(pid, signal.SIGUSR1 if args.action == "finalize" else signal.SIGUSR2)
            console.print(f"asked raftka migrate (pid {pid}) to {args.action}; watch its output")
            return 0
        return _start(args, data_dir, state, console)
    except RaftkaError as exc:
        console.print(f"raftka migrate: {exc}", style="red", markup=False, highlight=False)
        return 1


def _cluster_from_state(data_dir: Path, state: dict):
    from cluster import LocalCluster
    from common.config import read_properties

    if state.get("mode") != "zk":
        raise RaftkaError(f"{data_dir} holds a {state.get('mode')}-mode cluster; raftka migrate moves a "
                          "ZooKeeper-mode one (raftka cluster up --mode zk)")
    if _alive(state.get("launcher_pid")) and state.get("launcher_pid") != os.getpid():
        raise RaftkaError(f"the cluster in {data_dir} is running (launcher pid {state['launcher_pid']}): stop it "
                          "with Ctrl-C (its data stays), then run raftka migrate, which restarts it")
    brokers = [n for n in state["nodes"] if n["role"] == "broker"]
    ensemble = len(state["zookeeper_connect"].split(","))
    ports = [int(n["address"].rsplit(":", 1)[1]) for n in brokers]
    base_port = ports[0] if ports == list(range(ports[0], ports[0] + len(ports))) else 0
    props = read_properties(brokers[0]["config"])
    overrides = {k: v for k, v in props.items() if k not in _STANDARD_KEYS}
    host = brokers[0]["address"].rsplit(":", 1)[0]
    return LocalCluster(data_dir, controllers=ensemble, brokers=len(brokers), base_port=base_port, host=host,
                        overrides=overrides, die_with_parent=True, mode="zk")


def _start(args: argparse.Namespace, data_dir: Path, state: dict, console) -> int:
    from cluster.migration import LocalMigration

    requests: list[str] = []

    def on_stop(signum: int, frame: object) -> None:
        raise _Stop(signal.Signals(signum).name)

    def on_request(signum: int, frame: object) -> None:
        requests.append("finalize" if signum == signal.SIGUSR1 else "rollback")

    handlers = {signal.SIGTERM: on_stop, signal.SIGINT: on_stop, signal.SIGUSR1: on_request,
                signal.SIGUSR2: on_request}
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    cluster = None
    code = 0
    try:
        cluster = _cluster_from_state(data_dir, state)
        if args.zookeeper and args.zookeeper != cluster.zookeeper.connect_string:
            raise RaftkaError(f"--zookeeper {args.zookeeper}: the cluster in {data_dir} uses "
                              f"{cluster.zookeeper.connect_string}")
        with console.status("starting the ZooKeeper-mode cluster") as status:
            cluster.start_all()
            cluster.wait_ready(args.timeout, progress=status.update)
            console.print(f"ZooKeeper-mode cluster {cluster.cluster_id} up: {cluster.bootstrap}")
            migration = LocalMigration(cluster, say=status.update)
            _record_pid(data_dir)
            status.update("starting the KRaft controllers in migration mode")
            migration.start_controllers(args.timeout)
            migration.wait_copied(args.timeout)
            console.print("[1/3] ZooKeeper metadata copied into the quorum; dual write on")
            for i, b in enumerate(migration.broker_ids, 1):
                migration.move_broker(b, args.timeout)
                console.print(f"[2/3] broker {b} in KRaft mode, in sync ({i}/{len(migration.broker_ids)})")
            migration.move_brokers(args.timeout)
            cluster.wait_ready(args.timeout, progress=status.update)
            if args.finalize:
                requests.append("finalize")
        _record_pid(data_dir)
        print(f"READY bootstrap={cluster.bootstrap}", flush=True)
        console.print("migrated, dual-writing to ZooKeeper until `raftka migrate finalize` (or `rollback`); "
                      "Ctrl-C stops the cluster")
        finalized = False
        while True:
            while requests:
                action = requests.pop(0)
                with console.status(action) as status:
                    migration.say = status.update
                    if action == "finalize" and not finalized:
                        migration.finalize(args.timeout)
                        finalized = True
                        console.print("[3/3] finalized: KRaft mode; ZooKeeper is no longer written")
                    elif action == "rollback":
                        migration.rollback(args.timeout)
                        console.print("rolled back: ZooKeeper mode again")
                _record_pid(data_dir)
            time.sleep(0.3)
    except _Stop as stop:
        console.print(f"received {stop}: stopping the cluster")
    except RaftkaError as exc:
        console.print(f"raftka migrate: {exc}", style="red", markup=False, highlight=False)
        code = 1
    finally:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop_all()
        for s, h in previous.items():
            signal.signal(s, h)
    return code


def _record_pid(data_dir: Path) -> None:
    """Note this process in cluster.json, so `raftka migrate finalize|rollback` can find it."""
    path = data_dir / "cluster.json"
    state = json.loads(path.read_text())
    state["migrate_pid"] = os.getpid()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)
