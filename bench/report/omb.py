"""Other systems beside raftka: OpenMessaging Benchmark (OMB) result files in and out.

OMB (github.com/openmessaging/benchmark) is how Kafka, Redpanda, Pulsar
and others are compared. Its driver writes one JSON file per workload run,
its `TestResult`: the workload's shape (`messageSize`, `topics`,
`partitions`, `producersPerTopic`, `consumersPerTopic`), per-interval
lists (`publishRate`, `consumeRate`, `publishLatency99pct`, ...: one value
per stats period, 10 s by default) and aggregated latencies over the whole
run in milliseconds (`aggregatedPublishLatency50pct` ... `Max`,
`aggregatedEndToEndLatency...`).

`import_omb` turns such a file into rows of scenario `omb` with
`params.system` (the file's `driver`, or the name given), per-interval
series and nothing else; `systems_table` puts each imported run beside
raftka's `produce` runs of the same record size; `export_omb` writes
raftka's produce runs as TestResult files, for OMB's own charts
(`bin/create_charts.py`). What maps and what does not is in `MAPPED` and
`NOT_MAPPED`, which the report prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from typing import Any

from bench.histogram import nearest_rank

SCENARIO = "omb"
#: OMB's default stats period (its `--stats-period`... is fixed in the driver: 10 s).
INTERVAL_S = 10.0

#: OMB aggregated field -> (raftka metric, unit).
_AGGREGATED = {
    "aggregatedPublishLatency50pct": ("produce_latency_p50", "ms"),
    "aggregatedPublishLatency99pct": ("produce_latency_p99", "ms"),
    "aggregatedPublishLatency999pct": ("produce_latency_p99_9", "ms"),
    "aggregatedPublishLatency9999pct": ("produce_latency_p99_99", "ms"),
    "aggregatedPublishLatencyMax": ("produce_latency_max", "ms"),
    "aggregatedEndToEndLatency50pct": ("end_to_end_latency_p50", "ms"),
    "aggregatedEndToEndLatency99pct": ("end_to_end_latency_p99", "ms"),
    "aggregatedEndToEndLatency999pct": ("end_to_end_latency_p99_9", "ms"),
    "aggregatedEndToEndLatency9999pct": ("end_to_end_latency_p99_99", "ms"),
    "aggregatedEndToEndLatencyMax": ("end_to_end_latency_max", "ms"),
}
#: OMB per-interval list -> (raftka metric, unit).
_SERIES = {
    "publishRate": ("produce_records_per_s", "records/s"),
    "consumeRate": ("consume_records_per_s", "records/s"),
    "publishLatency99pct": ("produce_latency_p99", "ms"),
}

MAPPED = (
    "messageSize → record_size; topics, partitions, producersPerTopic, consumersPerTopic → params; "
    "mean of publishRate / consumeRate → produce_records_per_s / consume_records_per_s; "
    "publishRate, consumeRate, publishLatency99pct → per-interval series (10 s apart); "
    "aggregatedPublishLatency{50,99,999,9999}pct and Max → produce_latency_p50 … _max; "
    "aggregatedEndToEndLatency{50,99,999,9999}pct and Max → end_to_end_latency_p50 … _max"
)
NOT_MAPPED = (
    "publishErrorRate, backlog, publishDelayLatency* (OMB's send-schedule lag), the 75/95/99.999 percentiles, "
    "the full aggregated*LatencyQuantiles maps (no histogram can be rebuilt from them, so imported runs "
    "do not enter the merged histograms), and the producer rate the workload asked for (only what was "
    "achieved is in the file). raftka's `produce` bench sends as fast as it can; an OMB run usually sends "
    "at a fixed rate, so compare latencies at like rates"
)

#: What is put side by side: (raftka metric, what it is, unit).
COMPARED = (
    ("produce_records_per_s", "records/s produced", "records/s"),
    ("produce_latency_p50", "produce latency p50", "ms"),
    ("produce_latency_p99", "produce latency p99", "ms"),
    ("produce_latency_p99_9", "produce latency p99.9", "ms"),
    ("produce_latency_p99_99", "produce latency p99.99", "ms"),
    ("produce_latency_max", "produce latency max", "ms"),
    ("consume_records_per_s", "records/s consumed", "records/s"),
    ("end_to_end_latency_p50", "end-to-end latency p50", "ms"),
    ("end_to_end_latency_p99", "end-to-end latency p99", "ms"),
    ("end_to_end_latency_p99_9", "end-to-end latency p99.9", "ms"),
    ("end_to_end_latency_p99_99", "end-to-end latency p99.99", "ms"),
    ("end_to_end_latency_max", "end-to-end latency max", "ms"),
)


class OmbFormatError(ValueError):
    """A file is not an OMB TestResult."""


def read_test_result(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise OmbFormatError(f"{path}: cannot read it as JSON ({e}); pass an OMB result file (its driver writes "
                             "<workload>-<driver>-<date>.json)") from None
    missing = [k for k in ("messageSize", "publishRate", "aggregatedPublishLatency99pct") if k not in data]
    if not isinstance(data, dict) or missing:
        raise OmbFormatError(f"{path}: not an OpenMessaging Benchmark TestResult (no {', '.join(missing)}); "
                             "pass the JSON file OMB's benchmark command wrote")
    return data


def import_omb(results_dir: str, paths: list[str], system: str | None = None) -> list[str]:
    """Append each OMB result file to the dataset as one run; their run ids."""
    from bench.results import new_run_id, write_rows, write_series

    run_ids = []
    for path in paths:
        data = read_test_result(path)
        name = system or str(data.get("driver") or "omb").strip() or "omb"
        params = {
            "system": name, "workload": str(data.get("workload") or os.path.basename(path)),
            "record_size": int(data["messageSize"]), "topics": int(data.get("topics") or 0),
            "partitions": int(data.get("partitions") or 0),
            "producers_per_topic": int(data.get("producersPerTopic") or 0),
            "consumers_per_topic": int(data.get("consumersPerTopic") or 0),
        }
        # Imported runs have no raftka commit: they stay out of the history across commits.
        base = {"scenario": SCENARIO, "mode": "n/a", "params": params, "git_sha": f"omb:{name}"}
        rows = []
        for field, (metric, unit) in (("publishRate", _SERIES["publishRate"]),
                                      ("consumeRate", _SERIES["consumeRate"])):
            values = [float(v) for v in data.get(field) or ()]
            if values:
                rows.append({**base, "metric": metric, "value": statistics.fmean(values), "unit": unit})
        for field, (metric, unit) in _AGGREGATED.items():
            # End-to-end fields are zeros in runs without consumers: kept only when measured.
            if data.get(field) is not None and (field.startswith("aggregatedPublish") or data.get("endToEndLatency50pct")):
                rows.append({**base, "metric": metric, "value": float(data[field]), "unit": unit})
        run_id = new_run_id()
        write_rows(results_dir, rows, run_id=run_id)
        for field, (metric, unit) in _SERIES.items():
            values = data.get(field) or ()
            write_series(results_dir, run_id, scenario=SCENARIO, mode="n/a", params=params, metric=metric, unit=unit,
                         points=[((i + 1) * INTERVAL_S, float(v)) for i, v in enumerate(values)])
        run_ids.append(run_id)
    return run_ids


def systems_table(stats: list[dict[str, Any]], merged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each imported system's medians beside raftka's `produce` medians of
    the same record size (the raftka params with the most runs, preferring
    the same partition count); raftka's p99.9 and beyond come from its
    merged histograms."""
    others = [s for s in stats if s["scenario"] == SCENARIO]
    ours = [s for s in stats if s["scenario"] == "produce" and s["mode"] == "kraft"]
    # Both latencies of raftka's `bench omb` runs: the producer's and the end-to-end one.
    tails = {(m["metric"], m["params"].get("record_size"), json.dumps(m["params"], sort_keys=True)): m
             for m in merged if m["scenario"] == "produce" and m["metric"] in ("produce_latency", "end_to_end_latency")
             and m["mode"] == "kraft"}
    groups: dict[str, dict[str, Any]] = {}
    for s in others:
        key = json.dumps(s["params"], sort_keys=True)
        groups.setdefault(key, {"params": s["params"], "values": {}})["values"][s["metric"]] = s["median"]
    out = []
    for group in groups.values():
        p = group["params"]
        candidates = [s for s in ours if s["params"].get("record_size") == p.get("record_size")
                      and s["metric"] == "produce_records_per_s"]
        # An OMB run of the same workload first (it measured what OMB measures, consumers included).
        candidates.sort(key=lambda s: (s["params"].get("workload") == p.get("workload"),
                                       s["params"].get("partitions") == p.get("partitions"), s["n_runs"]),
                        reverse=True)
        mine: dict[str, float] = {}
        mine_params = None
        if candidates:
            mine_params = candidates[0]["params"]
            for s in ours:
                if s["params"] == mine_params:
                    mine[s["metric"]] = s["median"]
            for metric in ("produce_latency", "end_to_end_latency"):
                tail = tails.get((metric, p.get("record_size"), json.dumps(mine_params, sort_keys=True)))
                if tail is not None:
                    for name in ("p99_9", "p99_99", "max"):
                        mine.setdefault(f"{metric}_{name}", tail[name])
        out.append({
            "system": p.get("system"), "workload": p.get("workload"), "params": p, "raftka_params": mine_params,
            "metrics": [{"metric": metric, "what": what, "unit": unit, "raftka": mine.get(metric),
                         "other": group["values"].get(metric)} for metric, what, unit in COMPARED],
        })
    return sorted(out, key=lambda x: (str(x["system"]), str(x["workload"])))


def _percentile_of_buckets(buckets: list[tuple[float, int]], lo: float, hi: float, p: float) -> float:
    total = sum(c for _, c in buckets)
    rank, seen = nearest_rank(p, total), 0
    for value, count in buckets:
        seen += count
        if seen >= rank:
            return min(hi, max(lo, value))
    return hi


def export_omb(results_dir: str, out_dir: str, run_ids: list[str] | None = None) -> list[str]:
    """Write every raftka `produce` run in `results_dir` (or those of
    `run_ids`) as an OMB TestResult JSON file in `out_dir`; the files
    written. A run of `raftka bench omb` keeps its workload's name and
    shape (`params.workload`, `topics`, `producers_per_topic`)."""
    import pyarrow.dataset as ds

    from bench.results import (
        HISTOGRAM_SCHEMA,
        HISTOGRAMS_DIR,
        SERIES_DIR,
        SERIES_SCHEMA,
        read_rows,
    )

    def beside(folder: str, schema: Any) -> list[dict[str, Any]]:
        path = os.path.join(results_dir, folder)
        if not os.path.isdir(path):
            return []
        return ds.dataset(path, format="parquet", schema=schema).to_table().to_pylist()

    rows = [r for r in read_rows(results_dir)
            if r["scenario"] == "produce" and (run_ids is None or r["run_id"] in run_ids)]
    all_hists = [h for h in beside(HISTOGRAMS_DIR, HISTOGRAM_SCHEMA)
                 if h["scenario"] == "produce" and h["metric"] in ("produce_latency", "end_to_end_latency")]
    hists = [h for h in all_hists if h["metric"] == "produce_latency"]
    e2e_hists = [h for h in all_hists if h["metric"] == "end_to_end_latency"]
    all_series = [s for s in beside(SERIES_DIR, SERIES_SCHEMA)
                  if s["scenario"] == "produce" and s["metric"] in ("produce_records_per_s", "consume_records_per_s",
                                                                    "end_to_end_latency_p50", "end_to_end_latency_p99")]
    series = [s for s in all_series if s["metric"] == "produce_records_per_s"]

    def run_series(run_id: str, metric: str) -> list[float]:
        return [s["value"] for s in sorted((s for s in all_series if s["run_id"] == run_id and s["metric"] == metric),
                                           key=lambda s: s["t_s"])]

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for run_id in sorted({r["run_id"] for r in rows}):
        mine = [r for r in rows if r["run_id"] == run_id]
        params = json.loads(mine[0]["params"])
        values = {r["metric"]: r["value"] for r in mine}
        buckets = sorted((h["bucket"], h["count"]) for h in hists if h["run_id"] == run_id)
        rates = [s["value"] for s in sorted((s for s in series if s["run_id"] == run_id), key=lambda s: s["t_s"])]
        tag = hashlib.sha1(mine[0]["params"].encode()).hexdigest()[:8]
        result: dict[str, Any] = {
            "workload": str(params.get("workload") or f"raftka-produce-{tag}"),
            "driver": "raftka" if mine[0]["mode"] == "kraft" else f"raftka-{mine[0]['mode']}",
            "messageSize": int(params.get("record_size") or 0), "topics": int(params.get("topics") or 1),
            "partitions": int(params.get("partitions") or 0),
            "producersPerTopic": int(params.get("producers_per_topic") or params.get("producers") or 0),
            "consumersPerTopic": int(params.get("subscriptions_per_topic") or 0)
            * int(params.get("consumers_per_subscription") or 0),
            # raftka's series are 1 s apart (OMB's are 10 s apart).
            "publishRate": rates or [values.get("produce_records_per_s", 0.0)],
            "consumeRate": run_series(run_id, "consume_records_per_s"),
            "endToEndLatency50pct": run_series(run_id, "end_to_end_latency_p50"),
            "endToEndLatency99pct": run_series(run_id, "end_to_end_latency_p99"),
            "publishErrorRate": [], "backlog": [],
        }
        # A `bench omb` run with subscriptions kept its end-to-end latency histogram too.
        e2e = sorted((h["bucket"], h["count"]) for h in e2e_hists if h["run_id"] == run_id)
        if e2e:
            lo = min(h["min"] for h in e2e_hists if h["run_id"] == run_id)
            hi = max(h["max"] for h in e2e_hists if h["run_id"] == run_id)
            for field, p in (("50", 50), ("75", 75), ("95", 95), ("99", 99), ("999", 99.9), ("9999", 99.99)):
                result[f"aggregatedEndToEndLatency{field}pct"] = _percentile_of_buckets(e2e, lo, hi, p)
            result["aggregatedEndToEndLatencyMax"] = hi
            result["aggregatedEndToEndLatencyAvg"] = sum(v * c for v, c in e2e) / sum(c for _, c in e2e)
        if buckets:
            lo = min(h["min"] for h in hists if h["run_id"] == run_id)
            hi = max(h["max"] for h in hists if h["run_id"] == run_id)
            for field, p in (("50", 50), ("75", 75), ("95", 95), ("99", 99), ("999", 99.9), ("9999", 99.99)):
                result[f"aggregatedPublishLatency{field}pct"] = _percentile_of_buckets(buckets, lo, hi, p)
            result["aggregatedPublishLatencyMax"] = hi
            total = sum(c for _, c in buckets)
            result["aggregatedPublishLatencyAvg"] = sum(v * c for v, c in buckets) / total
            result["aggregatedPublishLatencyQuantiles"] = {
                str(q): _percentile_of_buckets(buckets, lo, hi, q) for q in (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99)}
        else:
            result["aggregatedPublishLatency50pct"] = values.get("produce_latency_p50", 0.0)
            result["aggregatedPublishLatency99pct"] = values.get("produce_latency_p99", 0.0)
        path = os.path.join(out_dir, f"raftka-produce-{run_id}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        written.append(path)
    return written
