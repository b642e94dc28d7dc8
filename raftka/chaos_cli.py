"""`raftka chaos run`: a Jepsen-style run against a local cluster it starts itself.

    raftka chaos run [--mode kraft|zk] [--quorum-engine raftka|pysyncobj] [--controllers 3] [--brokers 3]
                     [--duration 120] [--dynamic-quorum] [--nemesis kill,pause,partition,disk,eio,clock,voters,replace]
                     [--workload queue|txn|group] [--group-protocol classic|consumer|mixed|mixed-static] [--seed N]
                     [--log-dirs N] [--secure] [--out DIR]

Starts a cluster (as `raftka cluster up` does) under DIR/cluster, runs the
workload (queue: confluent-kafka producers, idempotent and not, acks=all;
consumers in a group and with assign(); txn: transactional producers writing
to several partitions per transaction, committing or aborting, and
read_committed consumers; group: the queue's producers and a group of three
consumers, classic or KIP-848 consumer protocol, that must together receive
every acknowledged record) while the nemeses inject faults on
a schedule drawn from the seed, heals everything, waits for the cluster to
recover, reads every partition back and checks the history. Writes
DIR/history.jsonl, report.json, report.md and report.png. Exit status 0
only when no anomaly was found (and the harness itself ran cleanly); 1
otherwise. The same seed gives the same schedule.

`partition` cuts links with nftables between per-node cgroups: it needs
root and the `nft` command (`make sysdeps`). It cuts the nodes' listener
ports, not pysyncobj's own (`--quorum-engine pysyncobj`), so it is refused
with that engine.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from common.errors import RaftkaError


def register(sub: argparse._SubParsersAction) -> None:
    chaos = sub.add_parser("chaos", help="Jepsen-style fault injection with a checked history",
                           description=__doc__.splitlines()[0])
    commands = chaos.add_subparsers(dest="chaos_command", metavar="COMMAND")
    commands.required = True
    run = commands.add_parser("run", help="start a cluster, inject faults under load, check what was kept",
                              description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--mode", choices=("kraft", "zk"), default="kraft")
    run.add_argument("--quorum-engine", choices=("raftka", "pysyncobj"), default="raftka",
                     help="the KRaft controllers' Raft (quorum.engine; default raftka)")
    run.add_argument("--dynamic-quorum", action="store_true",
                     help="a KIP-853 controller quorum: nodes find it through controller.quorum.bootstrap.servers, "
                     "the voters are a VotersRecord in the metadata log")
    run.add_argument("--controllers", type=int, default=3, metavar="N",
                     help="KRaft voters, or ZooKeeper servers with --mode zk (default 3)")
    run.add_argument("--brokers", type=int, default=3, metavar="M")
    run.add_argument("--duration", type=float, default=120.0, metavar="S", help="seconds of faults under load")
    run.add_argument("--nemesis", default="kill,pause,partition",
                     help="comma-separated: kill, pause, partition, disk (full), eio (writes fail), clock, "
                     "voters (a controller leaves a --dynamic-quorum's voter set, and is added back), "
                     "replace (a controller's disk is wiped; it is formatted again and swapped in) "
                     "(default kill,pause,partition); "
                     "'none' for a calm run")
    run.add_argument("--workload", choices=("queue", "txn", "group"), default="queue",
                     help="queue: producers, a group consumer and an assigned one; txn: transactional "
                     "producers, read_committed consumers; group: the queue's producers and a group of 3 "
                     "consumers that must together receive every acknowledged record (default queue)")
    run.add_argument("--group-protocol", choices=("classic", "consumer", "mixed", "mixed-static"), default="classic",
                     help="the workload's group consumers: classic, consumer (KIP-848), or (queue workload only) "
                          "mixed: a classic member next to one restarted every 15 s with the other protocol "
                          "(online upgrade and downgrade under the faults); mixed-static: the same with "
                          "group.instance.id set, so each restart replaces the static member (default classic)")
    run.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: from the clock)")
    run.add_argument("--partitions", type=int, default=3, help="partitions of the workload's topic")
    run.add_argument("--log-dirs", type=int, default=1, metavar="N",
                     help="log dirs per broker; with 2 or more, eio fails one broker's last dir only "
                          "(it goes offline and the broker serves on from the others)")
    run.add_argument("--rate", type=float, default=40.0, help="sends per second per producer")
    run.add_argument("--message-timeout-ms", type=int, default=60000, metavar="MS",
                     help="the producers' message.timeout.ms (default 60000: longer than a fault; a shorter one "
                     "makes librdkafka bump its idempotent epoch and send some records twice)")
    run.add_argument("--secure", action="store_true",
                     help="the clients use each broker's SASL_SSL listener (SCRAM-SHA-512, a throwaway CA), as "
                          "`raftka cluster up --secure`, with sessions of 10 s (connections.max.reauth.ms) so clients "
                          "re-authenticate under the faults; the nodes' own links (Raft, broker to controller, replication) "
                          "are SASL_SSL too")
    run.add_argument("--out", metavar="DIR", help="where the cluster, history and report go "
                     "(default chaos-<seed> in the current directory)")
    run.set_defaults(func=run_main)
    check = commands.add_parser("check", help="check a recorded history.jsonl again (no cluster)",
                                description="Run the checker on a history a `chaos run` recorded; "
                                "exit 0 only when it finds no anomaly.")
    check.add_argument("history", help="a history.jsonl")
    check.set_defaults(func=check_main)


def check_main(args: argparse.Namespace) -> int:
    from chaos.checker import check
    from chaos.history import read_history

    result = check(read_history(args.history))
    for finding in result.anomalies + result.allowed:
        print(f"{finding.kind}: {finding.message}")
    counts = {k: v for k, v in result.counts().items() if v}
    print(f"{result.stats['sends_attempted']} sends, {result.stats['sends_acknowledged']} acknowledged; "
          f"findings {counts or 'none'}; {'valid' if result.valid else 'ANOMALIES'}")
    return 0 if result.valid else 1


def run_main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from chaos.run import RunOptions, run
    from chaos.schedule import ALL_NEMESES as NEMESES

    console = Console(stderr=True, soft_wrap=True)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    nemeses = tuple(n for n in args.nemesis.split(",") if n and n != "none")
    unknown = [n for n in nemeses if n not in NEMESES]
    if unknown:
        console.print(f"[red]unknown nemesis {unknown}: choose from {', '.join(NEMESES)}[/red]")
        return 2
    changing = [n for n in nemeses if n in ("voters", "replace")]
    if changing and not args.dynamic_quorum:
        console.print(f"[red]the {changing[0]} nemesis changes a dynamic quorum's voter set: add "
                      "--dynamic-quorum[/red]")
        return 2
    if args.quorum_engine != "raftka" and (args.mode == "zk" or "partition" in nemeses):
        console.print(f"[red]--quorum-engine {args.quorum_engine} runs with --mode kraft only, and without the "
                      "partition nemesis (it cuts the listener ports, not pysyncobj's own): use e.g. "
                      "--nemesis kill,pause[/red]")
        return 2
    if args.group_protocol.startswith("mixed") and args.workload != "queue":
        console.print(f"[red]--group-protocol {args.group_protocol} migrates the queue workload's group between "
                      "protocols: use it with --workload queue, or give the group workload classic or "
                      "consumer[/red]")
        return 2
    if args.log_dirs < 1 or (args.log_dirs > 1 and args.mode != "kraft"):
        console.print(f"[red]--log-dirs {args.log_dirs}: give 1 or more, and more than 1 only with --mode kraft "
                      "(a ZooKeeper-mode broker of this harness has one log dir)[/red]")
        return 2
    options = RunOptions(out=Path(args.out or f"chaos-{seed}").resolve(), mode=args.mode,
                         quorum_engine=args.quorum_engine, dynamic_quorum=args.dynamic_quorum,
                         controllers=args.controllers, brokers=args.brokers, duration=args.duration,
                         nemeses=nemeses, workload=args.workload, seed=seed, partitions=args.partitions,
                         rate=args.rate, message_timeout_ms=args.message_timeout_ms, log_dirs=args.log_dirs,
                         secure=args.secure, group_protocol=args.group_protocol)
    started = time.monotonic()

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[ops]}"), console=console, transient=True)
    task = progress.add_task("faults under load", total=options.duration, ops="", start=False)

    def say(text: str) -> None:
        progress.console.print(f"[dim]{time.monotonic() - started:6.1f}s[/dim] {text}")

    def tick(elapsed: float, duration: float, counts: dict) -> None:
        if not progress.tasks[task].started:
            progress.start_task(task)
        sends = counts.get(("send", "invoke"), 0)
        acked = counts.get(("send", "ok"), 0)
        polled = counts.get(("poll", "ok"), 0)
        commits = counts.get(("commit", "ok"), 0)
        marks = sum(v for (f, t), v in counts.items() if t == "info" and f in NEMESES)
        faults = (marks + 1) // 2  # a start and a heal each
        progress.update(task, completed=min(elapsed, duration),
                        ops=f"sends {sends}, acked {acked}, " + (f"commits {commits}, " if commits else "")
                        + f"polled {polled}, faults {faults}")

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through run()'s cleanup: nodes stopped, links restored

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with progress:
            outcome = run(options, say=say, tick=tick)
    except RaftkaError as exc:
        console.print(f"[red]chaos run failed: {exc}[/red]")
        return 1
    report = outcome.report
    stats = report["checker"]["stats"]
    counts = {k: v for k, v in report["checker"]["counts"].items() if v}
    console.print(f"sends {stats['sends_attempted']} attempted, {stats['sends_acknowledged']} acknowledged; "
                  f"{len(report['faults'])} faults; findings {counts or 'none'}; "
                  f"metadata {'ok' if report['metadata'].get('valid') else 'VIOLATED'}")
    for error in report["harness_errors"]:
        console.print(f"[yellow]harness: {error}[/yellow]")
    verdict = "[green]no anomaly found[/green]" if outcome.valid else "[red]ANOMALIES FOUND[/red]"
    console.print(f"{verdict}; report in {outcome.out / 'report.md'}")
    print(outcome.out / "report.json")
    return outcome.exit_code
