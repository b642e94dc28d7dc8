"""`raftka dev`: one combined broker+controller node in the foreground, for development.

    raftka dev [--data-dir D] [--port 9092] [--controller-port P] [--secure] [--set KEY=VALUE ...]

Formats the data dir on first start (a new cluster id) and reuses it after,
so topics survive a restart. The Kafka port accepts connections once the
node serves, when it prints `READY bootstrap=127.0.0.1:<port>` on stdout;
point any Kafka client at it (one started earlier retries until then).
Ctrl-C or SIGTERM stop it cleanly. The controller listens on --controller-port
(default: the broker port + 1, as Kafka's 9092/9093; a free port with --port 0).

With --secure the Kafka port is a SASL_SSL listener: on first start a
throwaway CA, a certificate for the node and an admin SCRAM user (random
password) are made under D/secure, and kept for later starts. The node
prints the client settings as `key=value` lines in librdkafka's keys before
READY, and writes them for Java-style clients to D/secure/client.properties.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import trio

from raftka.cli_errors import run_reporting
from common.config import MAX_PORT, NodeConfig
from common.errors import RaftkaError
from common.gc_policy import tune_for_server
from common.logs import setup_logging
from common.meta_properties import format_log_dir, random_cluster_id, read_meta

NODE_ID = 1


def default_data_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "raftka-dev")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("dev", help="run one combined broker+controller node in the foreground",
                            description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=default_data_dir(), metavar="D",
                        help=f"where the node keeps its data (default {default_data_dir()})")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    parser.add_argument("--port", type=int, default=9092, help="the Kafka listener (default 9092; 0: a free port)")
    parser.add_argument("--controller-port", type=int, default=None, metavar="P",
                        help="the controller listener (default: --port + 1)")
    parser.add_argument("--secure", action="store_true",
                        help="SASL_SSL with SCRAM on the Kafka port; prints the client settings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other config key, with Kafka's names (e.g. num.partitions=3)")
    parser.set_defaults(func=main)


def dev_properties(args: argparse.Namespace) -> dict[str, str]:
    from common.wire.ports import free_ports
    from common.config import parse_overrides

    if not 0 <= args.port <= MAX_PORT:
        raise RaftkaError(f"--port {args.port} is out of range: use 0-{MAX_PORT} (0 picks a free port)")
    if args.controller_port is not None and not 1 <= args.controller_port <= MAX_PORT:
        raise RaftkaError(f"--controller-port {args.controller_port} is out of range: use 1-{MAX_PORT}, "
                          "or leave it out (--port + 1)")
    if args.controller_port is None and args.port == MAX_PORT:
        raise RaftkaError(f"--port {MAX_PORT} leaves no port for the controller (--port + 1): pass --controller-port")
    controller_port = args.controller_port
    if controller_port is None:
        controller_port = free_ports(1, args.host)[0] if args.port == 0 else args.port + 1
    data_dir = Path(args.data_dir).resolve()
    props = {
        "node.id": str(NODE_ID),
        "process.roles": "broker,controller",
        "controller.quorum.voters": f"{NODE_ID}@{args.host}:{controller_port}",
        "listeners": f"PLAINTEXT://{args.host}:{args.port}",
        "log.dirs": str(data_dir / "data"),
        # One broker: `__consumer_offsets` can have one replica only (Kafka's
        # single-node example config says the same).
        "offsets.topic.replication.factor": "1",
        # And `__transaction_state` the same (Kafka's single-node example:
        # transaction.state.log.replication.factor=1, min.isr=1).
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
    }
    if getattr(args, "secure", False):
        from common.security.dev import DevSecurity

        props["listeners"] = f"SASL_SSL://{args.host}:{args.port}"
        props.update(DevSecurity.ensure(data_dir / "secure", (args.host,)).listener_properties("SASL_SSL"))
    props.update(parse_overrides(args.set))
    return props


def main(args: argparse.Namespace) -> int:
    from broker.shell.process import run_broker

    def start() -> None:
        props = dev_properties(args)
        config = NodeConfig.from_properties(props)
        secure = None
        if args.secure:
            from common.security.dev import DevSecurity

            secure = DevSecurity.ensure(Path(args.data_dir).resolve() / "secure", (args.host,))
        for log_dir in config.log_dirs:
            meta = read_meta(log_dir)
            cluster_id = meta.get("cluster.id") if meta else None
            format_log_dir(log_dir, cluster_id or random_cluster_id(), config.node_id)
            if secure is not None and meta is None:
                # The admin's SCRAM credentials, stored by the controller at first start.
                from quorum.node.bootstrap import parse_add_scram, write_bootstrap

                write_bootstrap(log_dir, [parse_add_scram(value) for value in secure.scram_bootstrap()])
        setup_logging(config.node_id, props=config.raw)
        tune_for_server()

        def ready(ready) -> None:
            bootstrap = f"{ready.host}:{ready.port}"
            if secure is not None:
                secure.write_client_files(bootstrap)
                for line in secure.client_settings(bootstrap):
                    print(line, flush=True)
            print(f"READY bootstrap={bootstrap}", flush=True)

        trio.run(lambda: run_broker(config, on_ready=ready))

    return run_reporting("raftka dev", start)
