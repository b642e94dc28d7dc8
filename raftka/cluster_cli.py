"""`raftka cluster up`: a local cluster of separate controller and broker processes.

    raftka cluster up --controllers 3 --brokers 3 [--base-port 9092] [--data-dir D]
                      [--host 127.0.0.1] [--set KEY=VALUE ...] [--mode kraft|zk]
                      [--quorum-engine raftka|pysyncobj] [--secure] [--no-metrics]
                      [--prometheus [--prometheus-port 9090]]

Prints exactly one line on stdout, `READY bootstrap=host:port,...`, once
every broker is unfenced and every controller has caught up; progress and
each node's log path go to stderr. Ctrl-C or SIGTERM stop the cluster
cleanly: brokers first (controlled shutdown), then controllers; a process
that has not exited after --stop-timeout seconds is killed. Without
--data-dir the cluster lives in a temporary dir that is removed at the end;
with it, the data stays and the next `cluster up` on the same dir resumes
the same cluster. Brokers listen on P, P+1, ... and controllers on P+100,
P+101, ... for --base-port P (0: free ports). Every node serves its
Prometheus metrics (metrics.port) on P+400, P+401, ... (controllers
first), listed on stderr; --no-metrics turns them off. --prometheus also
runs a Prometheus server (the Debian `prometheus` package) scraping every
node, its data under the cluster's dir, and prints its URL.

--secure adds a SASL_SSL listener to every broker (P+500, P+501, ...): a
throwaway CA, a node certificate and an admin SCRAM user (random password)
are made under D/secure on first start; the client settings are printed on
stderr and written to D/secure/client-librdkafka.properties (librdkafka's
keys) and D/secure/client.properties (Java's). The nodes' own links are
SASL_SSL too: that listener is the inter-broker one and the controllers'
listener is SASL_SSL (the nodes log in as the admin with PLAIN); the
brokers' PLAINTEXT listeners stay for local tools. With --mode zk the
broker's only listener is SASL_SSL (clients log in with PLAIN: SCRAM
credentials need the KRaft metadata log), and it secures the controller's
requests to the brokers as well.

--mode zk runs the brokers in ZooKeeper mode: --controllers is then the
size of a ZooKeeper ensemble (1 or 3, from the Debian `zookeeper` package,
client ports P+100, ...), started first from a generated zoo.cfg; the
controller is the broker ZooKeeper elects. --set zookeeper.session.timeout.ms=...
and the other keys apply to the brokers as in Kafka.

--quorum-engine pysyncobj runs the controllers' metadata quorum on
pysyncobj's Raft instead of raftka's own (quorum.engine=pysyncobj; its
transport listens on each controller port + 100, i.e. P+200, ...).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import tempfile
import time

from common.dirs import ensure_dir
from common.config import MAX_PORT, parse_overrides
from common.errors import RaftkaError

DEFAULT_BASE_PORT = 9092


class _StopRequested(BaseException):
    """SIGTERM or SIGINT reached the launcher."""


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="run a local cluster of separate processes",
                             description=__doc__.splitlines()[0])
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND")
    commands.required = True
    up = commands.add_parser("up", help="start controllers and brokers; stop them on Ctrl-C or SIGTERM",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    up.add_argument("--controllers", type=int, default=3, metavar="N",
                    help="quorum voters, or ZooKeeper servers with --mode zk (1, 3 or 5; default 3)")
    up.add_argument("--brokers", type=int, default=3, metavar="M", help="brokers (default 3)")
    up.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT, metavar="P",
                    help=f"first broker port (default {DEFAULT_BASE_PORT}; 0 picks free ports)")
    up.add_argument("--host", default="127.0.0.1", help="address every node listens on (default loopback)")
    up.add_argument("--data-dir", metavar="D", help="keep the cluster's data here (default: a temp dir, removed)")
    up.add_argument("--mode", choices=("kraft", "zk"), default="kraft",
                    help="metadata in a Raft quorum (kraft, the default) or in ZooKeeper (zk)")
    up.add_argument("--quorum-engine", choices=("raftka", "pysyncobj"), default="raftka",
                    help="the controllers' Raft: raftka's own (default) or pysyncobj's (quorum.engine; "
                         "pysyncobj listens on each controller port + 100)")
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config key for every node (Kafka's key names), e.g. --set num.partitions=6")
    up.add_argument("--secure", action="store_true",
                    help="also a SASL_SSL listener on every broker (base port + 500, ...), with a throwaway CA "
                         "and an admin SCRAM user under the data dir, used also for the nodes' own links (a "
                         "SASL_SSL controller listener); prints the client settings on stderr")
    up.add_argument("--no-metrics", dest="metrics", action="store_false",
                    help="serve no Prometheus metrics (default: each node on metrics.port, P+400, P+401, ...)")
    up.add_argument("--prometheus", action="store_true",
                    help="also run a Prometheus server (the Debian `prometheus` package) scraping every node")
    up.add_argument("--prometheus-port", type=int, default=9090, metavar="PORT",
                    help="the Prometheus server's port (default 9090)")
    up.add_argument("--timeout", type=float, default=120.0, metavar="S", help="give up starting after S seconds")
    up.add_argument("--stop-timeout", type=float, default=30.0, metavar="S",
                    help="kill a process that has not stopped S seconds after SIGTERM (default 30)")
    up.set_defaults(func=up_main)


def up_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from cluster import LocalCluster

    console = Console(stderr=True, soft_wrap=True)
    if args.controllers not in (1, 3, 5):
        what = "a ZooKeeper ensemble has 1, 3 or 5 servers" if args.mode == "zk" else "a quorum has 1, 3 or 5 voters"
        console.print(f"raftka cluster up: --controllers {args.controllers}: {what}", style="red")
        return 2
    # Brokers on P, P+1, ...; controllers (or ZooKeeper) on P+100, P+101, ...
    highest = args.base_port + max(args.brokers - 1, 100 + args.controllers - 1,
                                   400 + args.controllers + args.brokers - 1 if args.metrics else 0,
                                   500 + args.brokers - 1 if args.secure else 0)
    if args.base_port < 0 or (args.base_port > 0 and highest > MAX_PORT):
        why = "is not a port" if args.base_port < 0 else f"would have the nodes listen on ports up to {highest}"
        console.print(f"raftka cluster up: --base-port {args.base_port} {why}; pass a port from 1 to "
                      f"{MAX_PORT - highest + args.base_port}, or 0 for free ports", style="red")
        return 2
    if args.data_dir:
        try:
            ensure_dir("--data-dir", args.data_dir)
        except RaftkaError as exc:
            console.print(f"raftka cluster up: {exc}", style="red")
            return 2
    if args.mode == "zk":
        from quorum.zookeeper.ensemble import zookeeper_missing_reason

        reason = zookeeper_missing_reason()
        if reason is not None:
            console.print(f"raftka cluster up: --mode zk needs ZooKeeper: {reason}", style="red")
            return 2

    if args.prometheus:
        from cluster.prometheus import prometheus_missing_reason

        reason = prometheus_missing_reason() or (None if args.metrics else "--no-metrics leaves it nothing to scrape")
        if reason is not None:
            console.print(f"raftka cluster up: --prometheus: {reason}", style="red")
            return 2

    def on_signal(signum: int, frame: object) -> None:
        raise _StopRequested(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    temp_dir = None if args.data_dir else tempfile.mkdtemp(prefix="raftka-cluster-")
    data_dir = args.data_dir or temp_dir
    cluster = None
    prometheus = None
    code = 0
    try:
        try:
            cluster = LocalCluster(data_dir, controllers=args.controllers, brokers=args.brokers,
                                   base_port=args.base_port, host=args.host,
                                   overrides={**({"quorum.engine": args.quorum_engine} if args.quorum_engine != "raftka" else {}),
                                              **parse_overrides(args.set)}, die_with_parent=True, mode=args.mode,
                                   secure=args.secure, metrics=args.metrics)
            metadata = (f"a {args.controllers}-server ZooKeeper ensemble at {cluster.zookeeper.connect_string}"
                        if cluster.zookeeper is not None else f"{args.controllers} controllers")
            console.print(f"cluster {cluster.cluster_id} in {cluster.base_dir} "
                          f"({metadata}, {args.brokers} brokers; logs: <node>.log there)")
            cluster.start_all()
            with console.status("starting") as status:
                cluster.wait_ready(args.timeout, progress=status.update)
            if cluster.security is not None:
                # stdout keeps its one READY line; the settings go to stderr and to files.
                # zk mode: PLAIN, since SCRAM credentials live in the KRaft metadata log.
                mechanism = cluster.secure_client_config().get("sasl.mechanism", "SCRAM-SHA-512")
                cluster.security.write_client_files(cluster.secure_bootstrap, mechanism)
                console.print("clients log in on the SASL_SSL listeners with (librdkafka keys; also in "
                              f"{cluster.security.directory}/client-librdkafka.properties, and for Java clients "
                              "client.properties):", markup=False)
                for line in cluster.security.client_settings(cluster.secure_bootstrap, mechanism):
                    console.print(line, markup=False, highlight=False)
            if args.metrics:
                console.print("metrics (Prometheus text format): " + ", ".join(
                    f"{n.role} {n.node_id} http://{n.host}:{n.metrics_port}/metrics" for n in cluster.nodes.values()))
            if args.prometheus:
                from cluster.prometheus import PrometheusServer

                prometheus = PrometheusServer(cluster.base_dir / "prometheus", cluster, host=args.host,
                                              port=args.prometheus_port)
                prometheus.start()
                console.print(f"Prometheus at {prometheus.url} scraping every node (its log: "
                              f"{prometheus.output_path})")
            print(f"READY bootstrap={cluster.bootstrap}", flush=True)
            console.print("serving; Ctrl-C or SIGTERM stops the cluster")
            _watch(cluster, console)
        except _StopRequested as stop:
            console.print(f"received {stop}: stopping the cluster")
        except RaftkaError as exc:
            console.print(f"raftka cluster up: {exc}", style="red", markup=False, highlight=False)
            code = 1
        finally:
            for s in previous:
                signal.signal(s, signal.SIG_IGN)  # stopping: further signals must not cut it short
            if prometheus is not None:
                prometheus.stop()
            if cluster is not None:
                clean = cluster.stop_all(args.stop_timeout)
                console.print("stopped" if clean else
                              f"stopped (some processes were killed after {args.stop_timeout:.0f} s)")
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


def _watch(cluster, console) -> None:
    """Serve until a signal; report nodes that exit on their own."""
    reported: set[int] = set()
    while True:
        time.sleep(0.5)
        for node in cluster.exited():
            if node.node_id not in reported:
                reported.add(node.node_id)
                assert node.process is not None
                console.print(f"{node.role} {node.node_id} exited with code {node.process.returncode}; "
                              f"see {node.output_path}", style="red")

