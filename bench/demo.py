"""`raftka demo` (what `make demo` runs): a local cluster end to end, with unmodified Kafka clients.

1. starts a local cluster of 3 controllers and 3 brokers (separate processes, loopback);
2. creates a topic with 6 partitions;
3. produces, then consumes, 1,000,000 records of 100 bytes with confluent-kafka;
4. prints the throughput of both, and beside it the CPU the client (this
   process: Python and librdkafka's threads) and the brokers used in each
   phase, so the reader can see which side was busy;
5. stops the cluster cleanly (brokers' controlled shutdown, then controllers);
6. with `--results DIR`, appends its throughput rows (scenario `demo`) to
   that bench results dataset, so `raftka report --results DIR` shows this
   run beside the earlier ones (`make demo` does both).

The topic has replication factor 3 (at most the number of brokers): every
record is copied to two followers by their replica fetchers while the demo
produces; `--replication-factor` changes it.

The clients are set up as a user who wants throughput would set them up,
and each is connected before its phase is timed. The producer asks for
delivery reports of failed records only (`delivery.report.only.error`): a
Python callback per acknowledged record cost about a quarter of the
producing process's CPU. The consumer takes batches (`Consumer.consume`),
counts them and checks each message for an error, and does nothing else
per message; it refills librdkafka's local queue within 10 ms
(`fetch.queue.backoff.ms`; librdkafka's default of 1 s left the brokers
idle while the consumer drained its queue, and the demo read about 135,000
records/s where it now reads several times that on a 2-core machine).
The table's CPU columns show which side was busy in each phase.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

from bench.proc_stats import CpuMark, cpu_between

TOPIC = "demo"
#: Seconds without a record after which the consumer gives up.
CONSUME_STALL_S = 30.0
#: Messages per `Consumer.consume` call. Python's cost per call is spread
#: over the batch; a much larger batch cost the client more CPU per record,
#: not less (the client CPU `raftka demo` prints for the consume phase, on
#: a 2-core machine: 0.75-0.80 s at 1,000; 0.84-0.98 s at 10,000; 1.5-1.7 s
#: at 100,000).
CONSUME_BATCH = 1000
#: Longest wait of one `Consumer.consume` call for a batch to fill. It is
#: what the last, partial batch waits: 0.5 s added that much to the phase.
CONSUME_WAIT_S = 0.05


class Phase(NamedTuple):
    """What one phase (produce or consume) did and what it cost."""

    records: int
    seconds: float
    #: CPU seconds of this process: the Python loop and librdkafka's threads.
    client_cpu_s: float
    #: CPU seconds of the broker processes together (replication included).
    brokers_cpu_s: float
    #: Share of the whole machine's CPU time that was busy meanwhile, 0..1.
    machine_busy: float


def _phase(records: int, seconds: float, start: CpuMark, end: CpuMark) -> Phase:
    used, busy = cpu_between(start, end)
    return Phase(records, seconds, used.get("bench", 0.0), used.get("brokers", 0.0), busy)


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

    from bench.kafka_bench import create_topic
    from bench.proc_stats import cluster_cpu_mark
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
            mark = functools.partial(cluster_cpu_mark, cluster)
            produced = produce(console, cluster.bootstrap, args.records, args.record_size, mark)
            consumed = consume(console, cluster.bootstrap, args.records, args.partitions, mark)
        finally:
            with console.status("stopping the cluster"):
                clean = cluster.stop_all()
    console.print(summary(args.records, args.record_size, args.brokers, produced, consumed))
    console.print("[green]✓[/green] cluster stopped cleanly" if clean else
                  "[yellow]cluster stopped; some processes had to be killed[/yellow]")
    ok = produced.records == consumed.records == args.records
    if not ok:
        console.print(f"[red]produced {produced.records:,} and consumed {consumed.records:,} of "
                      f"{args.records:,}[/red]")
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


def write_results(console, args: argparse.Namespace, produced: Phase, consumed: Phase) -> None:
    """The demo's throughput as bench rows (scenario `demo`), with its environment sidecar."""
    from bench.results import new_run_id, write_rows
    from bench.runner import environment, write_environment

    params = {"records": args.records, "record_size": args.record_size, "partitions": args.partitions,
              "replication_factor": args.replication_factor, "controllers": args.controllers,
              "brokers": args.brokers, "acks": "all"}
    rows = []
    for side, phase in (("produce", produced), ("consume", consumed)):
        count, seconds = phase.records, phase.seconds
        rows.append({"metric": f"{side}_records_per_s", "value": count / seconds, "unit": "records/s"})
        rows.append({"metric": f"{side}_mb_per_s", "value": count * args.record_size / 1e6 / seconds, "unit": "MB/s"})
    run_id = new_run_id()
    path = write_rows(args.results, [{"scenario": "demo", "mode": "kraft", "params": params, **r} for r in rows],
                      run_id=run_id)
    write_environment(args.results, run_id, {**environment(), "run_id": run_id, "scenario": "demo",
                                             "mode": "kraft", "params": params})
    console.print(f"[green]✓[/green] run {run_id}: throughput rows appended to {path}")


def summary(records: int, record_size: int, brokers: int, produced: Phase, consumed: Phase):
    """The table the demo ends with: per phase, its throughput and the CPU
    seconds each side used meanwhile, with a caption that says how to read them."""
    from rich.table import Table

    table = Table(title=f"{records:,} records of {record_size} B, produced with acks=all",
                  caption=f"CPU s: CPU seconds used during the phase, by this process (the client: Python "
                          f"and librdkafka's threads) and by the {brokers} broker processes together. "
                          f"Machine busy: the share of all {os.cpu_count()} CPUs' time in use, other "
                          f"programs' included.",
                  caption_justify="left")
    for column in ("", "records/s", "MB/s", "seconds", "client\nCPU s", "brokers\nCPU s", "machine\nbusy"):
        table.add_column(column, justify="right")
    for name, phase in (("produce", produced), ("consume", consumed)):
        seconds = max(phase.seconds, 1e-9)
        table.add_row(name, f"{phase.records / seconds:,.0f}",
                      f"{phase.records * record_size / 1e6 / seconds:,.1f}", f"{phase.seconds:.2f}",
                      f"{phase.client_cpu_s:.2f}", f"{phase.brokers_cpu_s:.2f}", f"{phase.machine_busy:.0%}")
    return table


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=console)


def produce(console, bootstrap: str, records: int, record_size: int, mark: Callable[[], CpuMark]) -> Phase:
    """Produce `records` values (acks=all, librdkafka's default batching).
    The phase starts once the producer has connected and ends when every
    record is acknowledged (or failed); `mark()` reads the CPU at both ends."""
    from confluent_kafka import Producer

    failed = [0]
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        # Called for failed records only (delivery.report.only.error): a
        # record neither failed nor left over by flush() was acknowledged.
        failed[0] += 1
        if len(errors) < 3:
            errors.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "on_delivery": on_delivery,
                         "delivery.report.only.error": True})
    producer.list_topics(TOPIC, timeout=30)  # connected, as the benches' load generators are, before measuring
    value = os.urandom(record_size)
    with _progress(console) as progress:
        task = progress.add_task("produce", total=records, rate="")
        start = mark()
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
                    # len(producer): records handed over, neither acknowledged nor failed yet.
                    acked = max(i - len(producer) - failed[0], 0)
                    elapsed = max(time.monotonic() - start.at, 1e-9)
                    progress.update(task, completed=acked, rate=f"{acked / elapsed:,.0f} records/s")
        unsent = producer.flush(120)
        end = mark()
        acked = records - unsent - failed[0]
        seconds = end.at - start.at
        progress.update(task, completed=acked, rate=f"{acked / seconds:,.0f} records/s")
    if errors:
        console.print(f"[red]delivery errors: {errors}[/red]")
    return _phase(acked, seconds, start, end)


def consume(console, bootstrap: str, records: int, partitions: int, mark: Callable[[], CpuMark]) -> Phase:
    """Read the topic from the beginning with assign() until `records` are
    in, every partition has reported its end (records are missing), or
    `CONSUME_STALL_S` passed without a record. The phase starts once the
    consumer has connected; `mark()` reads the CPU at both ends."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "raftka-demo", "enable.auto.commit": False,
        # An event at each partition's end, so that a topic short of records ends the phase at once.
        "enable.partition.eof": True,
        # librdkafka pauses a partition's fetches once its local queue holds
        # queued.min.messages, for fetch.queue.backoff.ms (default 1000 ms):
        # with a full topic to read, the brokers then sit idle while the
        # consumer drains its queue. 10 ms refetches as soon as there is room.
        "fetch.queue.backoff.ms": 10,
        # librdkafka keeps one fetch in flight per broker. A fetch that
        # reaches only partitions already at their end is parked by the broker
        # for this long, and the broker's other partitions wait behind it
        # (at the start, when their offsets are resolved later than the
        # first's; and for the end-of-partition events). 500 ms by default.
        "fetch.wait.max.ms": 100,
    })
    consumer.list_topics(TOPIC, timeout=30)  # connected before measuring; nothing is fetched before assign()
    got = 0
    at_end: set[int] = set()
    errors: list[str] = []
    with _progress(console) as progress:
        task = progress.add_task("consume", total=records, rate="")
        start = mark()
        last = start.at
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
        while got < records and len(at_end) < partitions and time.monotonic() - last < CONSUME_STALL_S:
            messages = consumer.consume(num_messages=CONSUME_BATCH, timeout=CONSUME_WAIT_S)
            if not messages:
                continue
            # The only work per message: whether it is an error (or an end-of-partition event).
            events = [m for m in messages if m.error() is not None]
            got += len(messages) - len(events)
            for event in events:
                if event.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(event.partition())
                elif len(errors) < 3:
                    errors.append(str(event.error()))
            last = time.monotonic()
            progress.update(task, completed=got, rate=f"{got / max(last - start.at, 1e-9):,.0f} records/s")
        end = mark()
    consumer.close()
    if errors:
        console.print(f"[red]consume errors: {errors}[/red]")
    return _phase(got, last - start.at, start, end)
