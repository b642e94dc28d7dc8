"""`raftka demo` (what `make demo` runs): a local cluster end to end, with unmodified Kafka clients.

1. starts a local cluster of 3 controllers and 3 brokers (separate processes, loopback);
2. creates a topic with 6 partitions;
3. produces, then consumes, 1,000,000 records of 100 bytes with confluent-kafka;
4. prints the throughput of both;
5. stops the cluster cleanly (brokers' controlled shutdown, then controllers);
6. with `--results DIR`, appends its throughput rows (scenario `demo`) to
   that bench results dataset, so `raftka report --results DIR` shows this
   run beside the earlier ones (`make demo` does both).

The topic has replication factor 3 (at most the number of brokers): every
record is copied to two followers by their replica fetchers while the demo
produces; `--replication-factor` changes it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

TOPIC = "demo"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="start a 3+3 cluster, produce and consume 1M records, stop",
                       description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="default 1,000,000")
    p.add_argument("--record-size", type=int, default=100, metavar="BYTES", help="default 100")
    p.add_argument("--partitions", type=int, default=6, help="default 6")
    p.add_argument("--replication-factor", type=int, default=None,
                   help="default 3 (at most --brokers)")
    p.add_argument("--controllers", type=int, default=3, help="default 3")
    p.add_argument("--brokers", type=int, default=3, help="default 3")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="append the throughput rows to this bench results dataset (default: none written)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from bench.kafka_bench import create_topic
    from cluster import LocalCluster

    if args.replication_factor is None:
        args.replication_factor = min(3, args.brokers)
    console = Console()
    problem = _bad_options(args)
    if problem is not None:
        Console(stderr=True).print(f"raftka demo: {problem}", highlight=False)
        return 2
    console.rule("[bold]raftka demo")
    with tempfile.TemporaryDirectory(prefix="raftka-demo-") as tmp:
        cluster = LocalCluster(tmp, controllers=args.controllers, brokers=args.brokers, die_with_parent=True)
        try:
            t0 = time.monotonic()
            cluster.start_all()
            with console.status("starting the cluster") as status:
                cluster.wait_ready(180, progress=status.update)
            console.print(f"[green]✓[/green] cluster {cluster.cluster_id}: {args.controllers} controllers, "
                          f"{args.brokers} brokers, ready in {time.monotonic() - t0:.1f} s "
                          f"(bootstrap {cluster.bootstrap})")
            create_topic(cluster.bootstrap, TOPIC, args.partitions, args.replication_factor)
            console.print(f"[green]✓[/green] topic {TOPIC!r}: {args.partitions} partitions, "
                          f"replication factor {args.replication_factor}")
            produced = produce(console, cluster.bootstrap, args.records, args.record_size)
            consumed = consume(console, cluster.bootstrap, args.records, args.partitions)
        finally:
            with console.status("stopping the cluster"):
                clean = cluster.stop_all()
    table = Table(title=f"{args.records:,} records of {args.record_size} B")
    for column in ("", "records/s", "MB/s", "seconds"):
        table.add_column(column, justify="right")
    for name, (count, seconds) in (("produce (acks=all)", produced), ("consume", consumed)):
        table.add_row(name, f"{count / seconds:,.0f}", f"{count * args.record_size / 1e6 / seconds:,.1f}",
                      f"{seconds:.2f}")
    console.print(table)
    console.print("[green]✓[/green] cluster stopped cleanly" if clean else
                  "[yellow]cluster stopped; some processes had to be killed[/yellow]")
    ok = produced[0] == consumed[0] == args.records
    if not ok:
        console.print(f"[red]produced {produced[0]:,} and consumed {consumed[0]:,} of {args.records:,}[/red]")
    if args.results and ok:
        write_results(console, args, produced, consumed)
    return 0 if ok and clean else 1


def _bad_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, checked before a cluster starts; None if nothing."""
    for name in ("records", "record_size", "partitions", "controllers", "brokers"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})"
    if not 1 <= args.replication_factor <= args.brokers:
        return (f"--replication-factor {args.replication_factor} must be between 1 and --brokers "
                f"({args.brokers})")
    return None


def write_results(console, args: argparse.Namespace, produced: tuple[int, float],
                  consumed: tuple[int, float]) -> None:
    """The demo's throughput as bench rows (scenario `demo`), with its environment sidecar."""
    from bench.results import new_run_id, write_rows
    from bench.runner import environment, write_environment

    params = {"records": args.records, "record_size": args.record_size, "partitions": args.partitions,
              "replication_factor": args.replication_factor, "controllers": args.controllers,
              "brokers": args.brokers, "acks": "all"}
    rows = []
    for side, (count, seconds) in (("produce", produced), ("consume", consumed)):
        rows.append({"metric": f"{side}_records_per_s", "value": count / seconds, "unit": "records/s"})
        rows.append({"metric": f"{side}_mb_per_s", "value": count * args.record_size / 1e6 / seconds, "unit": "MB/s"})
    run_id = new_run_id()
    path = write_rows(args.results, [{"scenario": "demo", "mode": "kraft", "params": params, **r} for r in rows],
                      run_id=run_id)
    write_environment(args.results, run_id, {**environment(), "run_id": run_id, "scenario": "demo",
                                             "mode": "kraft", "params": params})
    console.print(f"[green]✓[/green] run {run_id}: throughput rows appended to {path}")


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console)


def produce(console, bootstrap: str, records: int, record_size: int) -> tuple[int, float]:
    """Produce `records` values (acks=all, librdkafka's default batching); (acknowledged, seconds)."""
    from confluent_kafka import Producer

    acked = [0]
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is None:
            acked[0] += 1
        elif len(errors) < 3:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "on_delivery": on_delivery})
    value = os.urandom(record_size)
    with _progress(console) as progress:
        task = progress.add_task("produce", total=records, rate="")
        t0 = time.monotonic()
        for i in range(records):
            while True:
                try:
                    producer.produce(TOPIC, value)
                    break
                except BufferError:
                    producer.poll(0.001)
            if i % 1000 == 0:
                producer.poll(0)
                if i % 20_000 == 0:
                    elapsed = max(time.monotonic() - t0, 1e-9)
                    progress.update(task, completed=acked[0], rate=f"{acked[0] / elapsed:,.0f} records/s")
        producer.flush(120)
        seconds = time.monotonic() - t0
        progress.update(task, completed=acked[0], rate=f"{acked[0] / seconds:,.0f} records/s")
    if errors:
        console.print(f"[red]delivery errors: {errors}[/red]")
    return acked[0], seconds


def consume(console, bootstrap: str, records: int, partitions: int) -> tuple[int, float]:
    """Read the topic from the beginning with assign(); (records read, seconds)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftka-demo", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    got = 0
    with _progress(console) as progress:
        task = progress.add_task("consume", total=records, rate="")
        t0 = last = time.monotonic()
        while got < records and time.monotonic() - last < 30:
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            for m in messages:
                if m.error() is None:
                    got += 1
            if messages:
                last = time.monotonic()
                progress.update(task, completed=got, rate=f"{got / max(last - t0, 1e-9):,.0f} records/s")
        seconds = last - t0
    consumer.close()
    return got, seconds
