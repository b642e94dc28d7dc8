"""A run's report: report.json (everything), report.md (for a person), report.png (the plot).

The plot draws, over the run's time, the acknowledged sends per second, each
send's latency (acknowledged in blue, indeterminate in orange, at the moment
it completed), and the acknowledged records no consumer has polled yet, with
every fault window shaded in its nemesis' colour, as Jepsen draws them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict
from typing import Any

from chaos.checker import ALLOWED, ANOMALIES, Result
from chaos.history import Event
from chaos.schedule import Fault

COLOURS = {"kill": "#e15759", "pause": "#f1ce63", "partition": "#76b7b2", "disk": "#b07aa1", "eio": "#ff9da7",
           "clock": "#9c755f"}


def fault_windows(events: list[Event]) -> list[dict[str, Any]]:
    """(start, stop, kind, description, nodes) of each applied fault, from the history."""
    open_: dict[int, Event] = {}
    windows = []
    for e in events:
        if e.process != "nemesis":
            continue
        if e.extra.get("phase") == "start":
            open_[e.extra["fault"]] = e
        elif e.extra.get("phase") == "stop" and e.extra.get("fault") in open_:
            s = open_.pop(e.extra["fault"])
            windows.append({"start": s.mono, "stop": e.mono, "kind": s.f, "what": s.value,
                            "nodes": s.extra.get("nodes")})
    for s in open_.values():
        windows.append({"start": s.mono, "stop": None, "kind": s.f, "what": s.value, "nodes": s.extra.get("nodes")})
    return windows


def write_report(options: Any, schedule: list[Fault], events: list[Event], result: Result,
                 safety: dict[str, Any], timeline: dict[str, float], harness_errors: list[str],
                 command: str) -> dict[str, Any]:
    out = options.out
    t0 = timeline.get("start", events[0].mono if events else 0.0)
    windows = fault_windows(events)
    by_kind: dict[str, int] = defaultdict(int)
    for w in windows:
        by_kind[w["kind"]] += 1
    valid = result.valid and bool(safety.get("valid")) and not harness_errors
    errors: dict[str, int] = defaultdict(int)
    for e in events:
        if e.f == "send" and e.type in ("fail", "info"):
            errors[f"{e.type} {e.extra.get('error', '?')}"] += 1
    report = {
        "valid": valid,
        "command": command,
        "options": {k: (str(v) if k == "out" else v) for k, v in dataclasses.asdict(options).items()},
        "schedule": [f.to_dict() for f in schedule],
        "faults": [{**w, "start": round(w["start"] - t0, 3),
                    "stop": None if w["stop"] is None else round(w["stop"] - t0, 3)} for w in windows],
        "faults_by_kind": dict(by_kind),
        "timeline": {k: round(v - t0, 3) for k, v in timeline.items()},
        "checker": result.to_dict(),
        "metadata": safety,
        "harness_errors": harness_errors,
        "send_errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
        "client_log": client_log_summary(out / "clients.log"),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(_markdown(report, result))
    try:
        _plot(events, windows, result, t0, out / "report.png")
        report["plot"] = "report.png"
    except Exception as exc:  # no plot is not a reason to lose the report
        report["plot_error"] = repr(exc)
    return report


#: librdkafka log lines worth counting: what the clients went through.
CLIENT_LOG_EVENTS = {
    "a topic's partition count dropped to 0 (a broker answered Metadata without its partitions)":
        re.compile(r"partition count changed from [1-9]\d* to 0"),
    "idempotent producer epoch bumps (after which it sends some records again)": re.compile(r"bumped epoch to"),
    "produce requests answered OUT_OF_ORDER_SEQUENCE_NUMBER (logged with RAFTKA_CHAOS_CLIENT_DEBUG=eos,msg)":
        re.compile(r"out of order sequence number"),
}


def client_log_summary(path: Any) -> dict[str, int]:
    counts = {k: 0 for k in CLIENT_LOG_EVENTS}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                for what, pattern in CLIENT_LOG_EVENTS.items():
                    if pattern.search(line):
                        counts[what] += 1
    except OSError:
        pass
    return counts


def _markdown(report: dict[str, Any], result: Result) -> str:
    s = result.stats
    verdict = "no anomaly found" if report["valid"] else "**ANOMALIES FOUND**"
    lines = [f"# raftka chaos run: {verdict}", "", f"    {report['command']}", "",
             "| | |", "|---|---|",
             f"| sends attempted | {s['sends_attempted']} |",
             f"| sends acknowledged | {s['sends_acknowledged']} |",
             f"| sends indeterminate / failed | {s['sends_indeterminate']} / {s['sends_failed']} |",
             f"| records polled | {s['polled']} |",
             *([f"| transactions committed / aborted / unknown | {s['transactions']['committed']} / "
                f"{s['transactions']['aborted']} / {s['transactions']['unknown']} |"] if "transactions" in s else []),
             f"| records in the final read | {s['final_read']} |",
             f"| faults injected | {len(report['faults'])} "
             f"({', '.join(f'{k} {v}' for k, v in sorted(report['faults_by_kind'].items())) or 'none'}) |",
             f"| acknowledged, never polled | {result.unseen[-1][2] if result.unseen else 0} |", ""]
    lines += ["## Checker", "", "| check | findings |", "|---|---|"]
    counts = result.counts()
    lines += [f"| {k} | {counts[k]} |" for k in ANOMALIES]
    lines += [f"| {k} (allowed) | {counts[k]} |" for k in ALLOWED] + [""]
    for f in (result.anomalies + result.allowed)[:30]:
        lines.append(f"- **{f.kind}**: {f.message}")
        for e in f.evidence:
            lines.append(f"    - `{e.to_json()}`")
    meta = report["metadata"]
    lines += ["", "## Metadata quorum", ""]
    if "skipped" in meta:
        lines.append(f"Skipped: {meta['skipped']}.")
    else:
        lines.append(f"- epochs seen: {meta.get('epochs')}; more than one leader in an epoch: "
                     f"{meta.get('multiple_leaders') or 'never'}")
        if "note" in meta:
            lines.append(f"- {meta['note']}")
        else:
            lines.append(f"- metadata log lengths: {meta.get('metadata_log_lengths')}; prefix violations: "
                         f"{meta.get('prefix_violations') or 'none'}")
        if meta.get("unreadable"):
            lines.append(f"- unreadable: {meta['unreadable']}")
    if report["send_errors"]:
        lines += ["", "## Sends not acknowledged, by outcome and error", "", "| outcome error | sends |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in report["send_errors"].items()]
    lines += ["", "## What the clients' log shows", "", "| event | lines |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in report["client_log"].items()]
    lines += ["", "## Faults", "", "| start s | stop s | fault |", "|---|---|---|"]
    lines += [f"| {w['start']} | {w['stop']} | {w['what']} |" for w in report["faults"]]
    if report["harness_errors"]:
        lines += ["", "## Harness errors", ""] + [f"- {e}" for e in report["harness_errors"]]
    lines += ["", "![throughput, latency and unseen records over time](report.png)", ""]
    return "\n".join(lines)


def _plot(events: list[Event], windows: list[dict[str, Any]], result: Result, t0: float, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    invoked = {e.value: e.mono for e in events if e.f == "send" and e.type == "invoke"}
    done = [(e.mono - t0, e.mono - invoked[e.value], e.type) for e in events
            if e.f == "send" and e.type in ("ok", "info") and e.value in invoked]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    ax_tp, ax_lat, ax_unseen = axes
    per_second: dict[int, int] = defaultdict(int)
    for t, _, kind in done:
        if kind == "ok":
            per_second[int(t)] += 1
    if per_second:
        xs = list(range(min(per_second), max(per_second) + 1))
        ax_tp.plot(xs, [per_second.get(x, 0) for x in xs], color="#4e79a7")
    ax_tp.set_ylabel("acks / s")
    for kind, colour in (("ok", "#4e79a7"), ("info", "#f28e2b")):
        pts = [(t, lat * 1000) for t, lat, k in done if k == kind]
        if pts:
            ax_lat.scatter([p[0] for p in pts], [p[1] for p in pts], s=2, color=colour,
                           label="acknowledged" if kind == "ok" else "indeterminate")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("send latency ms")
    ax_lat.legend(loc="upper right", fontsize=8)
    if result.unseen:
        ax_unseen.plot([u[0] - t0 for u in result.unseen], [u[2] for u in result.unseen], color="#59a14f")
    ax_unseen.set_ylabel("acked, unseen")
    ax_unseen.set_xlabel("seconds since the workload started")
    seen_kinds = set()
    for w in windows:
        stop = w["stop"] if w["stop"] is not None else (events[-1].mono if events else w["start"])
        for ax in axes:
            ax.axvspan(w["start"] - t0, stop - t0, color=COLOURS.get(w["kind"], "#bab0ac"), alpha=0.3,
                       label=w["kind"] if ax is ax_tp and w["kind"] not in seen_kinds else None)
        seen_kinds.add(w["kind"])
    if seen_kinds:
        ax_tp.legend(loc="upper right", fontsize=8)
    fig.suptitle("raftka chaos: throughput, latency and unseen records; faults shaded")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
