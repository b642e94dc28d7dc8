"""The report's figures, drawn with matplotlib into PNG files.

Each figure is drawn from the collected `Summary` (no Spark here) with the
object-oriented API (`Figure`, Agg canvas): no pyplot global state, no
display needed. Every figure compares something: a figure whose lines
would each be one point, or whose bars would be one bar, is not drawn
(the tables carry the number). Labels name only what differs between the
things compared (`varying`); what all of them share (`constant`) goes in
the title and the caption, in full. Which figures exist depends on what
was measured:

- `compare`: per scenario, the median of every metric per parameter set,
  grouped by the parameters that differ between the scenario's runs, one
  bar colour per mode/backend (kraft, zk, kraft with pysyncobj), whiskers
  from p25 to p75 across runs;
- `throughput_vs_record_size`, `failover_vs_partitions`: a line per mode
  and remaining varying parameters, where 2 or more values were measured;
- `latency_cdf`: raw-sample CDFs of each mode's last run;
- `merged_latency`: latency percentiles (p50 to p99.99 and max) of each
  key's histograms merged across runs, on HdrHistogram's percentile axis;
- `series`: values over time inside each mode's last run, with the run's
  fault windows shaded;
- `history`: a metric by commit, change points marked;
- `systems`: imported OMB runs beside raftka's.

Files are named `<scenario>-<kind>-<8 hex of what is drawn>.png`: short,
stable for the same content. Figures are capped (panels, bars, lines,
figures) so a huge results dir still gives a readable report.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure

from bench.report.summary import CDF_GRID, MERGED_PERCENTILES, Summary
from bench.report.units import HIGHER

MAX_PANELS = 12
MAX_BARS = 24
MAX_LINES = 10
MAX_CDF_FIGURES = 24
MAX_SERIES_FIGURES = 24
MAX_HISTORY_FIGURES = 24
DPI = 90
MODE_COLORS = {"kraft": "tab:blue", "zk": "tab:orange", "kraft (pysyncobj)": "tab:green", "n/a": "tab:gray"}
OTHER_COLORS = ["tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:red"]
#: Params that say which backend ran (they are the sides of a comparison, not its conditions).
SIDE_PARAMS = ("engine",)


@dataclass
class Plot:
    file: str  # name of the PNG, relative to the report's dir
    title: str
    kind: str
    scenario: str
    #: The full parameters: what all compared things share, and which parameters differ.
    caption: str = ""
    #: What was drawn, for tools and tests: labels, points per line, events.
    data: dict[str, Any] = field(default_factory=dict)


def params_label(params: dict[str, Any], skip: Iterable[str] = ()) -> str:
    items = [f"{k}={v}" for k, v in sorted(params.items()) if k not in set(skip)]
    return ", ".join(items) or "-"


def side_of(item: dict[str, Any]) -> str:
    """The mode, and the metadata engine when it is not the mode's own."""
    engine = item["params"].get("engine")
    if engine and engine not in ("raftka", "zookeeper"):
        return f"{item['mode']} ({engine})"
    return item["mode"]


def split_params(items: list[dict[str, Any]], skip: Iterable[str] = ()) -> tuple[list[str], dict[str, Any]]:
    """(the params whose values differ between items, the params all share)."""
    skip = set(skip) | set(SIDE_PARAMS)
    keys = sorted({k for it in items for k in it["params"]} - skip)
    vary, constants = [], {}
    for k in keys:
        values = {json.dumps(it["params"].get(k), sort_keys=True) for it in items}
        if len(values) > 1:
            vary.append(k)
        else:
            constants[k] = items[0]["params"].get(k)
    return vary, constants


def vary_label(params: dict[str, Any], vary: list[str], sep: str = "\n") -> str:
    return sep.join(f"{k}={params.get(k, '–')}" for k in vary) or "all"


def _wrap(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def draw_all(summary: Summary, out_dir: str) -> list[Plot]:
    names: set[str] = set()
    plots: list[Plot] = []
    plots += _comparisons(summary.stats, out_dir, names)
    plots += _throughput_vs_record_size(summary.stats, out_dir, names)
    plots += _latency_cdfs(summary.cdfs, out_dir, names)
    plots += _merged_latency(summary.merged_cdfs, summary.merged_histograms, out_dir, names)
    plots += _failover_vs_partitions(summary.stats, out_dir, names)
    plots += _series(summary.series, summary.events, out_dir, names)
    plots += _history(summary.history, summary.change_points, out_dir, names)
    plots += _systems(summary.systems, out_dir, names)
    return plots


def _comparisons(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    plots = []
    for scenario, items in _group(stats, lambda s: s["scenario"]).items():
        vary, constants = split_params(items)
        categories = sorted({vary_label(s["params"], vary) for s in items})[:MAX_BARS]
        sides = sorted({side_of(s) for s in items})
        if len(categories) * len(sides) < 2:
            continue  # one parameter set in one mode: nothing to compare, the table has the numbers
        panels = _group(items, lambda s: (s["metric"], s["unit"]))
        keys = list(panels)[:MAX_PANELS]
        ncols = min(3, len(keys))
        nrows = math.ceil(len(keys) / ncols)
        fig = Figure(figsize=(max(4.4, 0.5 * len(categories) * len(sides) + 1.5) * ncols, 3.8 * nrows),
                     layout="constrained")
        width = 0.8 / len(sides)
        for i, (metric, unit) in enumerate(keys):
            ax = fig.add_subplot(nrows, ncols, i + 1)
            for j, side in enumerate(sides):
                bars = [s for s in panels[(metric, unit)] if side_of(s) == side]
                xs = [categories.index(vary_label(s["params"], vary)) + (j - (len(sides) - 1) / 2) * width
                      for s in bars if vary_label(s["params"], vary) in categories]
                bars = [s for s in bars if vary_label(s["params"], vary) in categories]
                ax.bar(xs, [s["median"] for s in bars], width=width,
                       yerr=[[s["median"] - s["p25"] for s in bars], [s["p75"] - s["median"] for s in bars]],
                       color=_side_color(side, sides), capsize=2, label=side)
            ax.set_xticks(range(len(categories)))
            ax.set_xticklabels(categories, fontsize=7)
            ax.set_title(f"{metric} ({unit})", fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
            if len(sides) > 1 and i == 0:
                ax.legend(fontsize=7)
        shared = params_label(constants)
        fig.suptitle(_wrap(f"{scenario}: median across runs (whiskers p25–p75) by {', '.join(vary) or 'mode'}; "
                           f"all with {shared}"), fontsize=9)
        caption = f"varying: {', '.join(vary) or 'mode only'}; constant: {shared}"
        data = {"vary": vary, "constants": constants, "x_labels": categories, "sides": sides,
                "panels": [f"{m} ({u})" for m, u in keys]}
        plots.append(_save(fig, out_dir, names, "compare", scenario, data,
                           f"{scenario}: every metric by {', '.join(vary) or 'mode'}", caption))
    return plots


def _lines_figure(items: list[dict], x_param: str, scenario: str, title: str, xlabel: str, ylabel: str,
                  kind: str, out_dir: str, names: set[str]) -> Plot | None:
    vary, constants = split_params(items, skip=[x_param])
    lines = _group(items, lambda s: (s["metric"], side_of(s), vary_label(s["params"], vary, ", ")))
    lines = {k: v for k, v in lines.items() if len({_number(s["params"][x_param]) for s in v}) >= 2}
    if not lines:
        return None  # every line would be one point
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    drawn = []
    xs_all: list[float] = []
    for (metric, side, label), points in list(lines.items())[:MAX_LINES]:
        points = sorted(points, key=lambda s: _number(s["params"][x_param]))
        xs = [_number(s["params"][x_param]) for s in points]
        xs_all += xs
        text = " / ".join(x for x in (metric if len({k[0] for k in lines}) > 1 else "", side,
                                      label if vary else "") if x)
        ax.errorbar(xs, [s["median"] for s in points],
                    yerr=[[s["median"] - s["p25"] for s in points], [s["p75"] - s["median"] for s in points]],
                    marker="o", capsize=3, color=MODE_COLORS.get(side), label=text)
        drawn.append({"label": text, "points": len(xs)})
    _log_if_wide(ax, xs_all, "x")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    shared = params_label(constants)
    ax.set_title(_wrap(f"{title} (median, p25–p75); all with {shared}", 90), fontsize=8)
    data = {"x": x_param, "vary": vary, "constants": constants, "lines": drawn}
    return _save(fig, out_dir, names, kind, scenario, data, title,
                 f"x: {x_param}; varying: {', '.join(vary) or '–'}; constant: {shared}")


def _throughput_vs_record_size(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    chosen = [s for s in stats if s["direction"] == HIGHER and _number(s["params"].get("record_size")) is not None]
    plots = []
    for (scenario, unit), items in _group(chosen, lambda s: (s["scenario"], s["unit"])).items():
        plot = _lines_figure(items, "record_size", scenario, f"{scenario}: {unit} against record size",
                             "record size (bytes)", unit, "throughput_vs_record_size", out_dir, names)
        if plot is not None:
            plots.append(plot)
    return plots


def _failover_vs_partitions(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    chosen = [s for s in stats if "failover" in s["metric"] and _number(s["params"].get("partitions")) is not None]
    plots = []
    for (scenario, metric, unit), items in _group(chosen, lambda s: (s["scenario"], s["metric"], s["unit"])).items():
        plot = _lines_figure(items, "partitions", scenario, f"{scenario}: {metric} against partitions",
                             "partitions", unit, "failover_vs_partitions", out_dir, names)
        if plot is not None:
            plots.append(plot)
    return plots


def _latency_cdfs(cdfs: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    # A CDF of one sample is one step: not drawn (the table has the value).
    groups = _group([c for c in cdfs if c["count"] >= 2], lambda c: (c["scenario"], c["metric"], c["unit"]))
    plots = []
    for (scenario, metric, unit), curves in list(groups.items())[:MAX_CDF_FIGURES]:
        vary, constants = split_params(curves)
        fig = Figure(figsize=(7.5, 4.6), layout="constrained")
        ax = fig.add_subplot()
        values_all: list[float] = []
        labels = []
        for curve in sorted(curves, key=lambda c: (c["mode"], vary_label(c["params"], vary)))[:MAX_LINES]:
            values = curve["values"]
            values_all += values
            label = f"{side_of(curve)}" + (f", {vary_label(curve['params'], vary, ', ')}" if vary else "")
            labels.append(label)
            ax.step(values, CDF_GRID[: len(values)], where="post", color=MODE_COLORS.get(side_of(curve)),
                    label=f"{label} (n={curve['count']:,})")
        _log_if_wide(ax, values_all, "x")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        shared = params_label(constants)
        ax.set_title(_wrap(f"{scenario}: {metric} CDF, last run per mode; all with {shared}", 90), fontsize=8)
        plots.append(_save(fig, out_dir, names, "latency_cdf", scenario,
                           {"metric": metric, "vary": vary, "constants": constants, "labels": labels},
                           f"{scenario}: {metric} CDF (last run)", f"varying: {', '.join(vary) or 'mode'}; "
                           f"constant: {shared}"))
    return plots


_PERCENTILE_TICKS = [(0.5, "50%"), (0.9, "90%"), (0.99, "99%"), (0.999, "99.9%"), (0.9999, "99.99%"),
                     (0.99999, "99.999%")]


def _merged_latency(curves: list[dict], merged: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    """Latency by percentile of the histograms merged across runs: x is
    1/(1-percentile) on a log axis (HdrHistogram's percentile plot), so
    the tail from p99 to p99.99 gets as much room as p50 to p99."""
    runs = {(m["scenario"], m["mode"], m["metric"], json.dumps(m["params"], sort_keys=True), m["unit"]): m
            for m in merged if m["count"] >= 2}
    curves = [c for c in curves if (c["scenario"], c["mode"], c["metric"], json.dumps(c["params"], sort_keys=True),
                                    c["unit"]) in runs]
    plots = []
    for (scenario, metric, unit), group in list(_group(curves, lambda c: (c["scenario"], c["metric"], c["unit"]))
                                                .items())[:MAX_CDF_FIGURES]:
        vary, constants = split_params(group)
        fig = Figure(figsize=(7.5, 4.6), layout="constrained")
        ax = fig.add_subplot()
        labels = []
        top = 1.0
        for curve in sorted(group, key=lambda c: (c["mode"], vary_label(c["params"], vary)))[:MAX_LINES]:
            m = runs[(curve["scenario"], curve["mode"], curve["metric"], json.dumps(curve["params"], sort_keys=True),
                      curve["unit"])]
            pts = [(min(1 / max(1 - f, 1e-6), 1e6), v) for v, f in curve["points"]]
            top = max(top, max(x for x, _ in pts))
            label = side_of(curve) + (f", {vary_label(curve['params'], vary, ', ')}" if vary else "")
            labels.append(label)
            ax.step([1.0] + [x for x, _ in pts], [pts[0][1]] + [v for _, v in pts], where="pre",
                    color=MODE_COLORS.get(side_of(curve)),
                    label=f"{label} ({m['n_runs']} runs, n={m['count']:,}, max {m['max']:.4g})")
        ax.set_xscale("log")
        ticks = [(1 / (1 - q), t) for q, t in _PERCENTILE_TICKS if 1 / (1 - q) <= top * 1.01]
        ax.set_xticks([x for x, _ in ticks])
        ax.set_xticklabels([t for _, t in ticks], fontsize=7)
        ax.set_xlabel("percentile")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        shared = params_label(constants)
        ax.set_title(_wrap(f"{scenario}: {metric}, histograms merged across runs; all with {shared}", 90), fontsize=8)
        plots.append(_save(fig, out_dir, names, "merged_latency", scenario,
                           {"metric": metric, "vary": vary, "constants": constants, "labels": labels},
                           f"{scenario}: {metric} by percentile, all runs merged",
                           f"varying: {', '.join(vary) or 'mode'}; constant: {shared}; percentiles "
                           f"{', '.join(n for n, _, _ in MERGED_PERCENTILES)} and max in the table"))
    return plots


def _series(series: list[dict], events: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    groups = _group([s for s in series if len(s["points"]) >= 2], lambda s: (s["scenario"], s["metric"], s["unit"]))
    plots = []
    for (scenario, metric, unit), lines in list(groups.items())[:MAX_SERIES_FIGURES]:
        vary, constants = split_params(lines)
        fig = Figure(figsize=(8, 4.2), layout="constrained")
        ax = fig.add_subplot()
        drawn = []
        run_ids = set()
        for i, line in enumerate(sorted(lines, key=lambda s: (s["mode"], vary_label(s["params"], vary)))[:MAX_LINES]):
            label = side_of(line) + (f", {vary_label(line['params'], vary, ', ')}" if vary else "")
            ax.plot([t for t, _ in line["points"]], [v for _, v in line["points"]], marker=".", markersize=3,
                    color=_side_color(side_of(line), [], i), label=label)
            drawn.append({"label": label, "run_id": line["run_id"], "points": len(line["points"])})
            run_ids.add(line["run_id"])
        shaded = []
        for ev in [e for e in events if e["run_id"] in run_ids and e["scenario"] == scenario]:
            end = ev["end_s"] if ev["end_s"] > ev["start_s"] else ev["start_s"] + 0.01
            ax.axvspan(ev["start_s"], end, color="tab:red", alpha=0.15)
            ax.annotate(ev["event"], (ev["start_s"], 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                        va="top", color="tab:red")
            shaded.append({"event": ev["event"], "start_s": ev["start_s"], "end_s": ev["end_s"], "run_id": ev["run_id"]})
        ax.set_xlabel("seconds into the measured phase" + ("; shaded: fault windows" if shaded else ""))
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        shared = params_label(constants)
        ax.set_title(_wrap(f"{scenario}: {metric} over time, last run per mode; all with {shared}", 95), fontsize=8)
        plots.append(_save(fig, out_dir, names, "series", scenario,
                           {"metric": metric, "vary": vary, "constants": constants, "lines": drawn, "events": shaded},
                           f"{scenario}: {metric} over time", f"varying: {', '.join(vary) or 'mode'}; "
                           f"constant: {shared}"))
    return plots


def _history(history: list[dict], change_points: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    keyed = _group(history, lambda h: (h["scenario"], h["metric"], h["unit"], json.dumps(h["params"], sort_keys=True)))
    keyed = {k: v for k, v in keyed.items() if len({h["git_sha"] for h in v}) >= 3}
    with_changes = {(c["scenario"], c["metric"], c["unit"], json.dumps(c["params"], sort_keys=True))
                    for c in change_points}
    # Metrics that changed first: those are the history a reader came for.
    order = sorted(keyed, key=lambda k: (k not in with_changes, k))[:MAX_HISTORY_FIGURES]
    plots = []
    for key in order:
        scenario, metric, unit, params_text = key
        items = keyed[key]
        commits = [sha for _, sha in sorted({(h["first_ms"], h["git_sha"]) for h in items})]
        fig = Figure(figsize=(8, 4.2), layout="constrained")
        ax = fig.add_subplot()
        for i, (side, points) in enumerate(_group(items, side_of).items()):
            points = sorted(points, key=lambda h: commits.index(h["git_sha"]))
            ax.plot([commits.index(h["git_sha"]) for h in points], [h["value"] for h in points], marker="o",
                    markersize=3, color=_side_color(side, [], i), label=side)
        marks = []
        for c in change_points:
            if (c["scenario"], c["metric"], c["unit"], json.dumps(c["params"], sort_keys=True)) == key:
                x = commits.index(c["after_sha"]) - 0.5
                ax.axvline(x, color="tab:red", linestyle="--")
                ax.annotate(f"{c['change']:+.0%}", (x, 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                            va="top", color="tab:red")
                marks.append({"before_sha": c["before_sha"], "after_sha": c["after_sha"]})
        step = max(1, len(commits) // 20)
        ax.set_xticks(range(0, len(commits), step))
        ax.set_xticklabels([(commits[i] or "?")[:7] for i in range(0, len(commits), step)], rotation=45,
                           ha="right", fontsize=6)
        ax.set_xlabel("commit (in the order first benched)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        params = json.loads(params_text)
        ax.set_title(_wrap(f"{scenario}: {metric} by commit (median of each commit's runs), change points dashed; "
                           f"{params_label(params)}", 95), fontsize=8)
        plots.append(_save(fig, out_dir, names, "history", scenario,
                           {"metric": metric, "params": params, "commits": len(commits), "change_points": marks},
                           f"{scenario}: {metric} across commits", f"params: {params_label(params)}"))
    return plots


def _systems(systems: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    plots = []
    for entry in systems:
        metrics = {m["metric"]: m for m in entry["metrics"]}
        # Producer and end-to-end latency by percentile, each side's two lines in its colour
        # (end-to-end dashed); a latency neither side measured draws nothing.
        kinds = (("produce_latency", "produce", "-"), ("end_to_end_latency", "end-to-end", "--"))
        pcts = ("p50", "p99", "p99_9", "p99_99", "max")
        fig = Figure(figsize=(9, 4), layout="constrained")
        ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        rate = metrics["produce_records_per_s"]
        who = ["raftka", str(entry["system"])]
        ax1.bar(who, [rate["raftka"] or 0, rate["other"] or 0], color=["tab:blue", "tab:purple"])
        ax1.set_title("records/s produced (median across runs)", fontsize=8)
        ax1.tick_params(labelsize=7)
        xs = list(range(len(pcts)))
        for side, color in (("raftka", "tab:blue"), ("other", "tab:purple")):
            for prefix, kind, style in kinds:
                pts = [(x, metrics[f"{prefix}_{n}"][side]) for x, n in zip(xs, pcts)
                       if metrics.get(f"{prefix}_{n}", {}).get(side) is not None]
                if pts:
                    ax2.plot([x for x, _ in pts], [v for _, v in pts], marker="o", color=color, linestyle=style,
                             label=f"{'raftka' if side == 'raftka' else entry['system']} {kind}")
        ax2.set_xticks(xs)
        ax2.set_xticklabels([n.replace("_", ".") for n in pcts], fontsize=7)
        ax2.set_yscale("log")
        ax2.set_ylabel("ms")
        ax2.set_title("produce (solid) and end-to-end (dashed) latency by percentile", fontsize=8)
        ax2.grid(alpha=0.3)
        if ax2.lines:
            ax2.legend(fontsize=7)
        p = entry["params"]
        fig.suptitle(_wrap(f"{entry['system']} (OMB workload {entry['workload']}) beside raftka: "
                           f"{p.get('record_size')} B records, {p.get('partitions')} partitions", 100), fontsize=9)
        caption = (f"{entry['system']}: {params_label(p)}; raftka: "
                   f"{params_label(entry['raftka_params']) if entry['raftka_params'] else 'no produce run of that record size'}")
        plots.append(_save(fig, out_dir, names, "systems", "omb",
                           {"system": entry["system"], "params": p, "raftka_params": entry["raftka_params"]},
                           f"{entry['system']} beside raftka ({entry['workload']})", caption))
    return plots


def _side_color(side: str, sides: list[str], i: int | None = None) -> str:
    if side in MODE_COLORS:
        return MODE_COLORS[side]
    n = sides.index(side) if side in sides else (i or 0)
    return OTHER_COLORS[n % len(OTHER_COLORS)]


def _log_if_wide(ax, values: list[float], axis: str) -> None:
    positive = [v for v in values if v is not None and v > 0]
    if positive and len(positive) == len(values) and max(positive) / min(positive) >= 50:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def _save(fig: Figure, out_dir: str, names: set[str], kind: str, scenario: str, data: dict[str, Any], title: str,
          caption: str) -> Plot:
    """Write the figure as `<scenario>-<kind>-<8 hex>.png` (the hash of what is drawn)."""
    digest = hashlib.sha1(json.dumps([kind, scenario, data], sort_keys=True, default=str).encode()).hexdigest()
    stem = f"{re.sub(r'[^A-Za-z0-9]+', '-', scenario).strip('-').lower() or 'all'}-{kind.split('_')[0]}"
    n = 8
    while (name := f"{stem}-{digest[:n]}.png") in names:
        n += 2
    names.add(name)
    fig.savefig(os.path.join(out_dir, name), dpi=DPI)
    return Plot(file=name, title=title, kind=kind, scenario=scenario, caption=caption, data=data)


def _group(items: Iterable[dict], key) -> dict[Any, list[dict]]:
    groups: dict[Any, list[dict]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
