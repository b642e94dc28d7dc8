"""A test fixture: one broker with an in-process controller, run as a separate process.

    python tests/broker/local_node.py --data-dir D [--port 0] [--node-id 1] [--topic NAME:PARTITIONS ...]
                     [--config server.properties] [--set key=value ...]

The metadata (broker registration, topics, configs) is kept by
`LocalController` in `D/local-metadata.cbor` and replayed on start, so a
restarted broker finds its topics again. Prints `READY port=<port>` once it
serves and its topics exist; SIGTERM or Ctrl-C stop it cleanly. Users run
`raftka dev` (or `raftka broker`), which runs the broker with the Raft quorum;
this fixture lets restart tests kill and restart a broker without one.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys

import trio
from kio.schema.create_topics.v7 import request as ct_req

from broker.shell.broker import Broker
from broker.config import BrokerConfig
from local_controller import LocalController
from common.config import read_properties
from common.logs import setup_logging

METADATA_FILE = "local-metadata.cbor"

_log = logging.getLogger("broker.main")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="local_node.py", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="log.dirs: where partitions (and the metadata) live")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9092, help="0 picks a free port (see the READY line)")
    parser.add_argument("--node-id", type=int, default=1)
    parser.add_argument("--cluster-id", default="raftka-local")
    parser.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create this topic if it does not exist")
    parser.add_argument("--config", help="a properties file with Kafka's key names")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config key")
    return parser.parse_args(argv)


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    props = read_properties(args.config) if args.config else {}
    # One broker: `__consumer_offsets` can have one replica only (Kafka's
    # single-node example config says the same).
    props.setdefault("offsets.topic.replication.factor", "1")
    for item in args.set:
        key, _, value = item.partition("=")
        props[key.strip()] = value.strip()
    props["node.id"] = str(args.node_id)
    props["log.dirs"] = args.data_dir
    props["listeners"] = f"PLAINTEXT://{args.host}:{args.port}"
    return BrokerConfig.from_properties(props, cluster_id=args.cluster_id)


async def run(args: argparse.Namespace) -> None:
    config = broker_config(args)
    os.makedirs(args.data_dir, exist_ok=True)
    controller = LocalController(cluster_id=args.cluster_id,
                                 records_path=os.path.join(args.data_dir, METADATA_FILE))
    broker = Broker(config, controller)
    controller.subscribe(broker.on_metadata_update)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signals, nursery.cancel_scope, controller, config.node_id)
        server = await nursery.start(broker.run)
        broker.on_metadata_update(controller.image)
        await controller.register_broker(config.node_id, config.host, server.port)
        for spec in args.topic:
            name, _, partitions = spec.partition(":")
            if controller.image.topic(name) is None:
                await broker.controller.send(ct_req.CreateTopicsRequest(
                    topics=(ct_req.CreatableTopic(name=name, num_partitions=int(partitions or 1),
                                                  replication_factor=1, assignments=(), configs=()),),
                    timeout=datetime.timedelta(seconds=30), validate_only=False))
        print(f"READY port={server.port}", flush=True)


async def _stop_on_signals(cancel_scope: trio.CancelScope, controller: LocalController, node_id: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            _log.info("received %s: shutting down", signal.Signals(signum).name)
            await controller.controlled_shutdown(node_id)
            cancel_scope.cancel()
            return


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.node_id)
    trio.run(run, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
