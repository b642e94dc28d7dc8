"""`raftka bench omb --workload FILE`: an OpenMessaging Benchmark workload against raftka.

OMB (github.com/openmessaging/benchmark) describes a run as a workload
YAML file: `name`, `topics`, `partitionsPerTopic`, `messageSize`,
`producersPerTopic`, `producerRate`, `subscriptionsPerTopic`,
`consumerPerSubscription`, `consumerBacklogSizeGB`, `testDurationMinutes`,
`warmupDurationMinutes` and a few payload settings. This bench reads one,
starts a cluster (as `raftka bench produce` does, with the same cluster
options), creates the topic with `partitionsPerTopic` partitions, and runs
`producersPerTopic` producer processes of `messageSize`-byte records:
first for the warm-up (not measured), then for the test duration.
`--duration-s` and `--warmup-s` override the workload's minutes, for
short runs.

It writes the usual result rows (scenario `produce`, with the workload's
name in `params.workload`, so the report sets it beside OMB's own result
files of the same workload) and an OMB result JSON file
(`<results>/_omb/<name>-raftka-<run id>.json`, or `--out-dir`, the format
`raftka report --export-omb` writes): per-second `publishRate` and the
aggregated publish latency quantiles. `raftka report --import-omb` reads
it back.

`producerRate` (or `--producer-rate`) is records/s over all producers,
split evenly; each producer sends record i at i/rate after the start, and
its sampled latencies are timed from when each record was due, so a
producer that falls behind shows it (coordinated omission corrected). At
0 the producers send as fast as they can (OMB instead ramps the rate to the
highest one it can hold).

Not run, and said so when the workload asks for them: consumers
(`subscriptionsPerTopic`, `consumerPerSubscription`: no consume rate or
end-to-end latency is measured), a consumer backlog, and more than one
topic. `payloadFile` is not read: payloads are random bytes of
`messageSize`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.kafka_bench import (
    add_cluster_options,
    bench_cluster,
    emit,
    resolve_brokers,
    row,
)
from common.errors import RaftkaError

TOPIC = "bench-omb"
SCENARIO = "produce"

#: OMB Workload fields -> (type, default; None: required).
FIELDS: dict[str, tuple[type, Any]] = {
    "name": (str, None),
    "topics": (int, None),
    "partitionsPerTopic": (int, None),
    "messageSize": (int, None),
    "producersPerTopic": (int, None),
    "producerRate": (float, 0.0),
    "subscriptionsPerTopic": (int, 0),
    "consumerPerSubscription": (int, 0),
    "consumerBacklogSizeGB": (float, 0.0),
    "testDurationMinutes": (float, None),
    "warmupDurationMinutes": (float, 1.0),
    "payloadFile": (str, ""),
    "keyDistributor": (str, "NO_KEY"),
    "useRandomizedPayloads": (bool, False),
    "randomBytesRatio": (float, 0.0),
    "randomizedPayloadPoolSize": (int, 0),
    "backlogDrainRatio": (float, 1.0),
}
#: Fields of OMB's forks (ramped and paced rates, backlog drains): read, said not to be run.
FORK_FIELDS = ("messageRateReceivedForSubscription", "producerStartRate", "acceptableBacklog",
               "producerIncrementRate", "producerIncrementSeconds", "producerPauseBeforeDrain",
               "producerPauseDuringDrain")
#: Fields that must be at least 1.
POSITIVE = ("topics", "partitionsPerTopic", "messageSize", "producersPerTopic")


def _scalar(path: str, lineno: int, text: str) -> str:
    text = text.strip()
    if text[:1] in ("'", '"'):
        end = text.find(text[0], 1)
        if end < 0:
            raise RaftkaError(f"{path}:{lineno}: unclosed quote in {text!r}")
        return text[1:end]
    # A comment after the value.
    return text.split(" #", 1)[0].strip()


def read_workload(path: str) -> dict[str, Any]:
    """The workload in `path`, checked: each known field converted to its
    type, defaults filled in. OMB workloads are flat `key: value` maps, so
    that is the YAML read here (no nesting, lists or anchors)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise RaftkaError(f"--workload {path}: {exc.strerror}; give an OMB workload YAML file") from None
    raw: dict[str, tuple[int, str]] = {}
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped == "---":
            continue
        key, sep, value = stripped.partition(":")
        if not sep or line[:1].isspace() or not key.strip():
            raise RaftkaError(f"{path}:{lineno}: expected a `field: value` line of an OMB workload, got {line!r}")
        key = key.strip()
        if key in raw:
            raise RaftkaError(f"{path}:{lineno}: {key} is given twice (also on line {raw[key][0]}); keep one")
        if key in FORK_FIELDS:
            raw[key] = (lineno, _scalar(path, lineno, value))
            continue
        if key not in FIELDS:
            raise RaftkaError(f"{path}:{lineno}: unknown workload field {key!r}; OMB workloads have "
                              f"{', '.join(FIELDS)}")
        raw[key] = (lineno, _scalar(path, lineno, value))
    # Kept as text: only named among what is not run.
    out: dict[str, Any] = {"fork_fields": {k: raw[k][1] for k in FORK_FIELDS if k in raw}}
    for field, (kind, default) in FIELDS.items():
        if field not in raw:
            if default is None:
                raise RaftkaError(f"{path}: the workload has no {field!r}; add `{field}: ...` "
                                  "(OMB requires it)")
            out[field] = default
            continue
        lineno, text = raw[field]
        try:
            if kind is bool:
                if text.lower() not in ("true", "false"):
                    raise ValueError
                value: Any = text.lower() == "true"
            elif kind is int:
                value = int(text.replace("_", ""))
            else:
                value = kind(text)
        except ValueError:
            raise RaftkaError(f"{path}:{lineno}: {field} must be {kind.__name__ if kind is not float else 'a number'}"
                              f", not {text!r}") from None
        out[field] = value
    for field in POSITIVE:
        if out[field] < 1:
            raise RaftkaError(f"{path}:{raw[field][0]}: {field} must be at least 1, not {out[field]}")
    if out["producerRate"] < 0:
        raise RaftkaError(f"{path}:{raw['producerRate'][0]}: producerRate must be 0 (as fast as the producers "
                          f"can) or positive, not {out['producerRate']:g}")
    if out["testDurationMinutes"] <= 0:
        raise RaftkaError(f"{path}:{raw['testDurationMinutes'][0]}: testDurationMinutes must be positive")
    if out["topics"] != 1:
        raise RaftkaError(f"{path}:{raw['topics'][0]}: topics is {out['topics']}; raftka bench omb runs one "
                          "topic: set topics: 1")
    return out


def register(scenarios: argparse._SubParsersAction) -> None:
    p = scenarios.add_parser("omb", help="run an OpenMessaging Benchmark workload YAML against a raftka cluster",
                             description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, metavar="FILE", help="OMB workload YAML file")
    p.add_argument("--duration-s", type=float, default=None, metavar="S",
                   help="seconds of measured producing (default: the workload's testDurationMinutes)")
    p.add_argument("--warmup-s", type=float, default=None, metavar="S",
                   help="seconds of unmeasured producing first (default: the workload's warmupDurationMinutes)")
    p.add_argument("--producer-rate", type=float, default=None, metavar="N",
                   help="records/s over all producers, 0 for as fast as they can (default: the workload's "
                        "producerRate)")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where the OMB result JSON goes (default: <results>/_omb: a folder whose name starts "
                        "with _ stays out of the Parquet dataset)")
    p.add_argument("--sample-every", type=int, default=100, metavar="N",
                   help="time the delivery of every N-th record (default 100)")
    p.add_argument("--acks", default="1", choices=("0", "1", "all"), help="default 1 (OMB's Kafka driver: all)")
    add_cluster_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from bench.produce_bench import _measure
    from bench.report.omb import export_omb
    from bench.runner import require_mode

    console = Console(stderr=args.json)
    w = read_workload(args.workload)
    duration = args.duration_s if args.duration_s is not None else w["testDurationMinutes"] * 60
    warmup = args.warmup_s if args.warmup_s is not None else w["warmupDurationMinutes"] * 60
    if duration <= 0 or warmup < 0:
        raise RaftkaError(f"--duration-s ({duration}) must be positive and --warmup-s ({warmup}) not negative")
    rate = args.producer_rate if args.producer_rate is not None else w["producerRate"]
    if rate < 0:
        raise RaftkaError(f"--producer-rate ({rate}) must be 0 (as fast as they can) or positive")
    require_mode(args.mode)
    args.partitions, args.record_size, args.producers = w["partitionsPerTopic"], w["messageSize"], w["producersPerTopic"]
    args.count = None  # _measure's phases run for a duration
    resolve_brokers(args)
    for note in _not_run(w, rate):
        console.print(f"[yellow]not run: {note}[/yellow]")
    params = {
        "workload": w["name"], "record_size": w["messageSize"], "producers": w["producersPerTopic"],
        "partitions": w["partitionsPerTopic"], "topics": w["topics"], "producers_per_topic": w["producersPerTopic"],
        "producer_rate": rate, "replication_factor": args.replication_factor, "acks": args.acks,
        "duration_s": duration, "brokers": args.brokers, "controllers": args.controllers,
    }
    spec = {"topic": TOPIC, "record_size": w["messageSize"], "count": None, "sample_every": args.sample_every,
            "rate": rate / w["producersPerTopic"], "config": {"acks": args.acks}}
    with bench_cluster(args, console, TOPIC) as bc:
        if warmup > 0:
            _measure(console, args, bc, {**spec, "duration_s": warmup}, f"{w['name']} warm-up")
        result = _measure(console, args, bc, {**spec, "duration_s": duration}, w["name"])
    histogram = result["histogram"]
    rows = [row(SCENARIO, params, "produce_records_per_s", result["records_per_s"], "records/s"),
            row(SCENARIO, params, "produce_mb_per_s", result["mb_per_s"], "MB/s"),
            row(SCENARIO, params, "failed_records", result["failed"], "records")]
    if histogram.count:
        rows += [row(SCENARIO, params, f"produce_latency_p{q}", histogram.percentile(q), "ms") for q in (50, 99)]
    args.series = [("produce_records_per_s", "records/s", result["series"]),
                   ("produce_latency_p50", "ms", result["latency_series"][50.0]),
                   ("produce_latency_p99", "ms", result["latency_series"][99.0]),
                   ("broker_cpu_cores", "cores", result["cpu_series"])]
    run_id = emit(args, console, rows, {"produce_latency": result["latencies_ms"]}, SCENARIO, params)
    out_dir = args.out_dir or os.path.join(args.results, "_omb")
    for path in export_omb(args.results, out_dir, run_ids=[run_id]):
        target = os.path.join(out_dir, f"{_safe(w['name'])}-raftka-{run_id}.json")
        os.replace(path, target)
        console.print(f"OMB result written to {target}")
    console.print(f"{w['name']}: {result['records_per_s']:,.0f} records/s"
                  + (f", publish latency p50 {histogram.percentile(50):.1f} ms, p99 {histogram.percentile(99):.1f} ms"
                     if histogram.count else ""))
    if result["failed"]:
        console.print(f"[red]{result['failed']} records failed: {result['errors']}[/red]")
        return 1
    return 0


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "workload"


def _not_run(w: dict[str, Any], rate: float) -> list[str]:
    notes = []
    if rate == 0:
        notes.append("producerRate 0: OMB ramps the rate to find the highest the system sustains; "
                     "here the producers send as fast as they can")
    if w["subscriptionsPerTopic"] or w["consumerPerSubscription"]:
        notes.append("subscriptions and consumers: no consume rate or end-to-end latency is measured")
    if w["consumerBacklogSizeGB"] > 0:
        notes.append("consumerBacklogSizeGB: no backlog is built or drained")
    for field, value in w["fork_fields"].items():
        notes.append(f"{field} {value} (a field of OMB's forks)")
    if w["payloadFile"]:
        notes.append(f"payloadFile {w['payloadFile']}: payloads are random bytes of messageSize")
    return notes
