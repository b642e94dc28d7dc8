"""`raftka mirror`: copy topics from one Kafka-protocol cluster to another, as MirrorMaker 2 does.

    raftka mirror --config mm2.properties
    raftka mirror --source H:P --target H:P [--topics REGEX] [--set KEY=VALUE ...]
    raftka mirror status (--config mm2.properties | --source H:P --target H:P [--topics REGEX]) [--json]

The first two run until SIGTERM or Ctrl-C, one thread per enabled flow,
with a progress table on a terminal (one line per flow every few seconds
otherwise) and print `MIRRORING <flow>` once each flow copies. Several
processes with the same config share the partitions (the source consumer
group `mirror-<source>-<target>`). `--set` adds MM2 properties to the
simple form (e.g. `--set emit.checkpoints.interval.seconds=5`). `status`
prints the records and seconds each mirrored topic is behind the source.

Exit status: 0 after a clean stop, 2 for a bad config, 1 if a flow cannot
go on (e.g. exactly-once on a target without transactions).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mirror", help="mirror topics between clusters (like MirrorMaker 2)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["run", "status"], default="run")
    p.add_argument("--config", metavar="FILE", help="MM2-style properties (clusters, A->B.enabled, topics, ...)")
    p.add_argument("--source", metavar="BOOTSTRAP", help="the source cluster (its alias is 'source')")
    p.add_argument("--target", metavar="BOOTSTRAP", help="the target cluster (its alias is 'target')")
    p.add_argument("--topics", default=".*", metavar="REGEX", help="topics to mirror (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an MM2 property")
    p.add_argument("--instance", default=None, metavar="NAME",
                   help="this process's stable name among those sharing a flow: a static group member, so a "
                        "restart takes its partitions back at once (exactly-once: its transactional.id; default 0)")
    p.add_argument("--json", action="store_true", help="status: one JSON object per partition")
    p.set_defaults(func=main)


def _flows(args: argparse.Namespace) -> list:
    from common.config import parse_overrides, read_properties
    from mirror import config

    overrides = parse_overrides(args.set)
    if args.config:
        if args.source or args.target:
            raise _Usage("give either --config or --source/--target, not both")
        return config.parse({**read_properties(args.config), **overrides})
    if not (args.source and args.target):
        raise _Usage("give --config FILE, or --source BOOTSTRAP and --target BOOTSTRAP")
    return config.simple(args.source, args.target, args.topics, **overrides)


class _Usage(Exception):
    pass


def _fail(message: str, code: int) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"raftka mirror: {message}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    return code


def main(args: argparse.Namespace) -> int:
    from common.errors import RaftkaError

    try:
        flows = _flows(args)
    except (_Usage, RaftkaError) as exc:
        return _fail(str(exc), 2)
    try:
        return status(flows, args.json) if args.action == "status" else run(flows, args.instance)
    except RaftkaError as exc:
        return _fail(str(exc), 1)


def status(flows: list, as_json: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    from mirror.status import by_topic, flow_status

    console = Console()
    for flow in flows:
        rows = flow_status(flow)
        if as_json:
            for r in rows:
                print(json.dumps({"flow": flow.name, "topic": r.topic, "target_topic": r.target_topic,
                                  "partition": r.partition, "high_watermark": r.high_watermark,
                                  "committed": r.committed, "records_behind": r.records_behind,
                                  "seconds_behind": round(r.seconds_behind, 3)}))
            continue
        table = Table(title=f"{flow.name} (group {flow.mirror_group})")
        for col in ("source topic", "target topic", "records behind", "seconds behind"):
            table.add_column(col, justify="right" if "behind" in col else "left")
        for topic, (target, records, seconds) in sorted(by_topic(rows).items()):
            table.add_row(topic, target, str(records), f"{seconds:.1f}")
        console.print(table)
    return 0


def run(flows: list, instance: str | None) -> int:
    from mirror.worker import Flow

    stop = threading.Event()
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    def on_signal(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [Flow(f, stop, say, instance) for f in flows]
    failures: list[BaseException] = []

    def body(w: Flow) -> None:
        try:
            w.run()
        except BaseException as exc:  # noqa: BLE001 - reported below, and the other flows stop too
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=body, args=(w,), name=w.cfg.name, daemon=True) for w in workers]
    for t in threads:
        t.start()
    announced: set[str] = set()
    live = _live(workers) if sys.stdout.isatty() else None
    last_line = time.monotonic()
    try:
        while not stop.wait(0.2):
            for w in workers:
                if w.stats.state == "mirroring" and w.cfg.name not in announced:
                    announced.add(w.cfg.name)
                    say(f"MIRRORING {w.cfg.name}")
            if live is not None:
                live.update(_table(workers))
            elif time.monotonic() - last_line >= 5:
                last_line = time.monotonic()
                for w in workers:
                    s = w.stats
                    behind = sum(lag.records for lag in s.lag.values())
                    seconds = max((lag.seconds for lag in s.lag.values()), default=0.0)
                    eos = (f", {s.producer_replacements} producer replacements "
                           f"({s.abandoned_producers} stuck, left behind)") if w.cfg.exactly_once else ""
                    say(f"[{w.cfg.name}] {s.state}: {s.mirrored} records mirrored, {behind} behind "
                        f"({seconds:.1f} s), "
                        f"{s.checkpoints} checkpoints, {s.errors} errors{eos}")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if live is not None:
            live.stop()
    if failures:
        from common.errors import RaftkaError

        exc = failures[0]
        if isinstance(exc, RaftkaError):
            return _fail(str(exc), 1)
        raise exc
    return 0


def _live(workers: list):
    from rich.live import Live

    live = Live(_table(workers), refresh_per_second=2)
    live.start()
    return live


def _table(workers: list):
    from rich.table import Table

    table = Table(title="raftka mirror")
    for col in ("flow", "partition", "mirrored", "records behind", "seconds behind"):
        table.add_column(col, justify="left" if col in ("flow", "partition") else "right")
    for w in workers:
        s = w.stats
        table.add_row(w.cfg.name, s.state, str(s.mirrored), str(sum(x.records for x in s.lag.values())),
                      f"{max((x.seconds for x in s.lag.values()), default=0.0):.1f}")
        for (topic, partition), lag in sorted(s.lag.items()):
            table.add_row("", f"{topic}[{partition}]", str(lag.mirrored), str(lag.records), f"{lag.seconds:.1f}")
        if w.cfg.exactly_once and s.producer_replacements:
            table.add_row("", "producers replaced", str(s.producer_replacements), "",
                          f"{s.abandoned_producers} stuck, left behind")
        if s.last_error:
            table.add_row("", "[red]last error[/red]", "", "", s.last_error[:80])
    return table
