"""`raftka bench omb --workload FILE`: an OpenMessaging Benchmark workload against raftka.

OMB (github.com/openmessaging/benchmark) describes a run as a workload
YAML file: `name`, `topics`, `partitionsPerTopic`, `messageSize`,
`producersPerTopic`, `producerRate`, `subscriptionsPerTopic`,
`consumerPerSubscription`, `consumerBacklogSizeGB`, `testDurationMinutes`,
`warmupDurationMinutes` and a few payload settings. This bench reads one,
starts a cluster (as `raftka bench produce` does, with the same cluster
options), creates `topics` topics (`bench-omb-0`, ...) of
`partitionsPerTopic` partitions each, and runs `producersPerTopic`
producer processes per topic of `messageSize`-byte records: first for the
warm-up (producers only, not measured), then for the test duration with
the consumers reading. Each of the `subscriptionsPerTopic` subscriptions
of a topic is one consumer group of `consumerPerSubscription` consumer
processes, the topic's partitions split among them (assigned, not
rebalanced: no group join inside the measured phase); every subscription
reads every record. `--duration-s` and `--warmup-s` override the
workload's minutes, for short runs.

End-to-end latency is OMB's: the time a consumer received a record minus
the send time the producer put in the record (the first 8 bytes of its
value, so `messageSize` must be at least 8 with subscriptions). At a fixed
`producerRate` the send time is when the record was due, so a producer
that falls behind shows in both latencies (coordinated omission
corrected). After the measured phase the consumers read on until nothing
came for a second, and the run fails if a subscription missed a record
the producers had acknowledged.

It writes the usual result rows (scenario `produce`, with the workload's
name in `params.workload`, so the report sets it beside OMB's own result
files of the same workload): produce and consume rates, produce and
end-to-end latency quantiles (both kept as histograms), and per-second
series; and an OMB result JSON file
(`<results>/_omb/<name>-raftka-<run id>.json`, or `--out-dir`, the format
`raftka report --export-omb` writes) with OMB's TestResult fields:
per-second `publishRate` and `consumeRate`, the per-second
`endToEndLatency{Avg,50pct,...,Max}` lists and the aggregated
`aggregatedPublishLatency*` and `aggregatedEndToEndLatency*` quantiles.
`raftka report --import-omb` reads it back.

`producerRate` (or `--producer-rate`) is records/s over all producers of
all topics, split evenly; each producer sends record i at i/rate after
the start. At 0 the producers send as fast as they can (OMB instead
ramps the rate to the highest one it can hold).

Refused: `consumerBacklogSizeGB` above 0 (no backlog is built or
drained). Read and said not to be run: the fields of OMB's forks (ramped
rates, backlog drains) and `payloadFile` (payloads are random bytes of
`messageSize`, their first 8 bytes the send time).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.kafka_bench import (
    MB,
    add_cluster_options,
    bench_cluster,
    emit,
    resolve_brokers,
    row,
)
from bench.load_generator import STAMP_BYTES
from common.errors import RaftkaError

TOPIC = "bench-omb"
#: After the measured phase, consumers stop once nothing came for this long (or at most DRAIN_S).
IDLE_S = 1.0
DRAIN_S = 30.0
#: OMB's end-to-end percentiles: TestResult field suffix -> percentile.
E2E_PCTS = (("50pct", 50.0), ("75pct", 75.0), ("95pct", 95.0), ("99pct", 99.0), ("999pct", 99.9),
            ("9999pct", 99.99))
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
    if out["consumerBacklogSizeGB"] > 0:
        raise RaftkaError(f"{path}:{raw['consumerBacklogSizeGB'][0]}: consumerBacklogSizeGB is "
                          f"{out['consumerBacklogSizeGB']:g}; raftka bench omb builds no backlog: set "
                          "consumerBacklogSizeGB: 0")
    if out["subscriptionsPerTopic"] < 0 or out["consumerPerSubscription"] < 0:
        raise RaftkaError(f"{path}: subscriptionsPerTopic and consumerPerSubscription must be 0 or more")
    if out["subscriptionsPerTopic"] and not out["consumerPerSubscription"]:
        raise RaftkaError(f"{path}: subscriptionsPerTopic is {out['subscriptionsPerTopic']} but "
                          "consumerPerSubscription is 0; give each subscription at least one consumer "
                          "(or set subscriptionsPerTopic: 0 for producers only)")
    if out["subscriptionsPerTopic"] and out["messageSize"] < STAMP_BYTES:
        raise RaftkaError(f"{path}:{raw['messageSize'][0]}: messageSize {out['messageSize']} is too small for "
                          f"end-to-end latency: the record carries its send time in its first {STAMP_BYTES} "
                          f"bytes; use messageSize: {STAMP_BYTES} or more")
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

    from bench.kafka_bench import create_topic
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
    args.partitions, args.record_size = w["partitionsPerTopic"], w["messageSize"]
    args.producers = w["producersPerTopic"] * w["topics"]
    args.count = None  # the phases run for a duration
    resolve_brokers(args)
    for note in _not_run(w, rate):
        console.print(f"[yellow]not run: {note}[/yellow]")
    subscriptions, per_subscription = w["subscriptionsPerTopic"], w["consumerPerSubscription"]
    params = {
        "workload": w["name"], "record_size": w["messageSize"], "producers": args.producers,
        "partitions": w["partitionsPerTopic"], "topics": w["topics"], "producers_per_topic": w["producersPerTopic"],
        "subscriptions_per_topic": subscriptions, "consumers_per_subscription": per_subscription,
        "producer_rate": rate, "replication_factor": args.replication_factor, "acks": args.acks,
        "duration_s": duration, "brokers": args.brokers, "controllers": args.controllers,
    }
    topics = [f"{TOPIC}-{i}" for i in range(w["topics"])]
    with bench_cluster(args, console, topics[0]) as bc:
        for topic in topics[1:]:
            create_topic(bc.bootstrap, topic, args.partitions, args.replication_factor)
        if warmup > 0:
            _phase(console, args, bc, w, topics, rate, warmup, f"{w['name']} warm-up", consumers=False)
        result = _phase(console, args, bc, w, topics, rate, duration, w["name"], consumers=bool(subscriptions))
    histogram, e2e = result["histogram"], result["e2e_histogram"]
    rows = [row(SCENARIO, params, "produce_records_per_s", result["records_per_s"], "records/s"),
            row(SCENARIO, params, "produce_mb_per_s", result["mb_per_s"], "MB/s"),
            row(SCENARIO, params, "failed_records", result["failed"], "records")]
    if histogram.count:
        rows += [row(SCENARIO, params, f"produce_latency_p{q}", histogram.percentile(q), "ms") for q in (50, 99)]
    args.series = [("produce_records_per_s", "records/s", result["series"]),
                   ("produce_latency_p50", "ms", result["latency_series"][50.0]),
                   ("produce_latency_p99", "ms", result["latency_series"][99.0]),
                   ("broker_cpu_cores", "cores", result["cpu_series"])]
    if subscriptions:
        rows += [row(SCENARIO, params, "consume_records_per_s", result["consume_records_per_s"], "records/s"),
                 row(SCENARIO, params, "unconsumed_records", result["unconsumed"], "records")]
        if e2e.count:
            rows += [row(SCENARIO, params, f"end_to_end_latency_{name}", e2e.percentile(q), "ms")
                     for name, q in (("p50", 50), ("p99", 99), ("p99_9", 99.9), ("max", 100))]
        args.series += [("consume_records_per_s", "records/s", result["consume_series"]),
                        ("end_to_end_latency_p50", "ms", result["e2e_series"][50.0]),
                        ("end_to_end_latency_p99", "ms", result["e2e_series"][99.0])]
    run_id = emit(args, console, rows, {"produce_latency": result["latencies_ms"],
                                        "end_to_end_latency": result["e2e_ms"]}, SCENARIO, params)
    out_dir = args.out_dir or os.path.join(args.results, "_omb")
    for path in export_omb(args.results, out_dir, run_ids=[run_id]):
        target = os.path.join(out_dir, f"{_safe(w['name'])}-raftka-{run_id}.json")
        if subscriptions:
            _add_consumers(path, result, subscriptions * per_subscription)
        os.replace(path, target)
        console.print(f"OMB result written to {target}")
    console.print(f"{w['name']}: {result['records_per_s']:,.0f} records/s"
                  + (f", publish latency p50 {histogram.percentile(50):.1f} ms, p99 {histogram.percentile(99):.1f} ms"
                     if histogram.count else ""))
    if subscriptions:
        console.print(f"{w['name']}: {result['consume_records_per_s']:,.0f} records/s consumed"
                      + (f", end-to-end latency p50 {e2e.percentile(50):.1f} ms, p99 {e2e.percentile(99):.1f} ms"
                         if e2e.count else ""))
    status = 0
    if result["failed"]:
        console.print(f"[red]{result['failed']} records failed: {result['errors']}[/red]")
        status = 1
    if result["unconsumed"]:
        for name, missing in result["missing_by_subscription"].items():
            if missing:
                console.print(f"[red]subscription {name}: {missing} acknowledged records were not read by its "
                              f"consumers within {DRAIN_S:g} s after the measured phase (lost, or the consumers fell "
                              "that far behind: try a lower producerRate or more consumerPerSubscription)[/red]")
        status = 1
    return status


def _phase(console: Any, args: argparse.Namespace, bc: Any, w: dict[str, Any], topics: list[str], rate: float,
           duration: float, title: str, *, consumers: bool) -> dict[str, Any]:
    """One phase: every topic's producers, and (`consumers`) every subscription's consumers, released
    together. The producers' result (as `produce_bench._phase`'s) with the consumers' rates, end-to-end
    latencies and what each subscription missed."""
    from bench.histogram import LatencyHistogram
    from bench.load_generator import (
        aggregate,
        interval_percentiles,
        interval_rates,
        omb_worker,
    )
    from bench.proc_stats import CpuSampler
    from bench.produce_bench import _progress

    producers = len(topics) * w["producersPerTopic"]
    config = {"acks": args.acks, "bootstrap.servers": bc.bootstrap}
    specs: list[dict[str, Any]] = [
        {"topic": topic, "record_size": w["messageSize"], "count": None, "sample_every": args.sample_every,
         "rate": rate / producers, "config": config, "duration_s": duration, "stamp": consumers}
        for topic in topics for _ in range(w["producersPerTopic"])]
    n = w["consumerPerSubscription"]
    if consumers:
        specs += [{"role": "consume", "bootstrap": bc.bootstrap, "config": {}, "topic": topic,
                   "group_id": f"omb-{topic}-sub-{s}", "subscription": f"{topic}/sub-{s}",
                   # Consumer c of n reads partitions c, c+n, ...: every partition has one reader per subscription.
                   "partitions": [p for p in range(w["partitionsPerTopic"]) if p % n == c],
                   "duration_s": duration, "idle_s": IDLE_S, "drain_s": DRAIN_S}
                  for topic in topics for s in range(w["subscriptionsPerTopic"]) for c in range(n)]
    sampler = CpuSampler(bc.cluster)
    trace: list[tuple[float, int]] = []
    verb = "producing and consuming" if consumers else "producing"
    try:
        # Consumers leave their progress counters at 0: the progress trace counts acknowledged records.
        results = _progress(console, f"{verb}: {title}", None, omb_worker, specs, sampler.start, trace)
    finally:
        sampler.stop()
    produced = [r for r in results if r.get("role") != "consume"]
    consumed = [r for r in results if r.get("role") == "consume"]
    result = aggregate(produced)
    result["cpu_series"] = sampler.series("brokers")
    # Whole seconds of the measured phase only: the trace runs on while the consumers drain.
    result["series"] = [(t, v) for t, v in interval_rates(trace) if t <= duration]
    start = trace[0][0] if trace else 0.0
    result["latency_series"] = interval_percentiles(start, result["latency_at"], result["latencies_ms"])
    result["records_per_s"] = result["records"] / result["elapsed_s"]
    result["mb_per_s"] = result["records"] * w["messageSize"] / MB / result["elapsed_s"]
    result["histogram"] = LatencyHistogram()
    result["histogram"].record_many(result["latencies_ms"])
    # Per subscription: the records the producers of its topic had acknowledged, minus those it read.
    acked = {topic: sum(r["records"] for r in produced if r["topic"] == topic) for topic in topics}
    by_subscription: dict[str, int] = {}
    for r in consumed:
        by_subscription[r["subscription"]] = by_subscription.get(r["subscription"], 0) + r["records"]
    result["missing_by_subscription"] = {name: max(0, acked[name.rsplit("/", 1)[0]] - got)
                                         for name, got in sorted(by_subscription.items())}
    result["consumed_by_subscription"] = dict(sorted(by_subscription.items()))
    result["unconsumed"] = sum(result["missing_by_subscription"].values())
    result["errors"] += [e for r in consumed for e in r["errors"]][:5]
    e2e_ms = [x for r in consumed for x in r["latencies_ms"]]
    e2e_at = [x for r in consumed for x in r["latency_at"]]
    result["e2e_ms"] = e2e_ms
    result["e2e_histogram"] = LatencyHistogram()
    result["e2e_histogram"].record_many(e2e_ms)
    # Records received in each whole second of the measured phase, over all subscriptions (what
    # OMB's consumeRate counts); the drain after it is not a measured second.
    whole = int(duration)
    bins = [0] * whole
    for t in e2e_at:
        i = int(t - start)
        if 0 <= i < whole:
            bins[i] += 1
    result["consume_series"] = [(i + 1.0, float(c)) for i, c in enumerate(bins)] if consumed else []
    result["consume_records_per_s"] = sum(bins) / whole if whole and consumed else 0.0
    ps = tuple(q for _, q in E2E_PCTS) + (100.0,)
    result["e2e_series"] = {q: [(t, v) for t, v in points if t <= whole]
                            for q, points in interval_percentiles(start, e2e_at, e2e_ms, ps=ps).items()}
    result["e2e_avg_series"] = [(t, v) for t, v in _interval_means(start, e2e_at, e2e_ms) if t <= whole]
    return result


def _interval_means(start: float, at: list[float], values: list[float]) -> list[tuple[float, float]]:
    sums: dict[int, list[float]] = {}
    for t, v in zip(at, values):
        if t >= start:
            acc = sums.setdefault(int(t - start), [0.0, 0.0])
            acc[0] += v
            acc[1] += 1
    return [(i + 1.0, s / n) for i, (s, n) in sorted(sums.items())]


def _add_consumers(path: str, result: dict[str, Any], consumers_per_topic: int) -> None:
    """Put the consumers' side into the TestResult file `export_omb` wrote: OMB's field names, in ms."""
    import json

    with open(path) as f:
        data = json.load(f)
    data["consumersPerTopic"] = consumers_per_topic
    data["consumeRate"] = [v for _, v in result["consume_series"]]
    series = result["e2e_series"]
    seconds = len(data["consumeRate"])

    def per_second(points: list[tuple[float, float]]) -> list[float]:
        # One value per second, as the rates: a second in which no record arrived (a stalled
        # broker) is 0, as an empty interval is in OMB's files.
        at = {round(t): v for t, v in points}
        return [at.get(i + 1, 0.0) for i in range(seconds)]

    data["endToEndLatencyAvg"] = per_second(result["e2e_avg_series"])
    for suffix, q in E2E_PCTS:
        data[f"endToEndLatency{suffix}"] = per_second(series[q])
    data["endToEndLatencyMax"] = per_second(series[100.0])
    e2e = result["e2e_histogram"]
    if e2e.count:
        data["aggregatedEndToEndLatencyAvg"] = e2e.total / e2e.count
        for suffix, q in E2E_PCTS:
            data[f"aggregatedEndToEndLatency{suffix}"] = e2e.percentile(q)
        data["aggregatedEndToEndLatencyMax"] = e2e.max
        data["aggregatedEndToEndLatencyQuantiles"] = {
            str(q): e2e.percentile(q) for q in (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "workload"


def _not_run(w: dict[str, Any], rate: float) -> list[str]:
    notes = []
    if rate == 0:
        notes.append("producerRate 0: OMB ramps the rate to find the highest the system sustains; "
                     "here the producers send as fast as they can")
    for field, value in w["fork_fields"].items():
        notes.append(f"{field} {value} (a field of OMB's forks)")
    if w["payloadFile"]:
        notes.append(f"payloadFile {w['payloadFile']}: payloads are random bytes of messageSize")
    return notes
