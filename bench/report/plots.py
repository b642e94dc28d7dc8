"""The report's figures, drawn with matplotlib into PNG files.

Each figure is drawn from the collected `Summary` (no Spark here) with the
object-oriented API (`Figure`, Agg canvas): no pyplot global state, no
display needed. Which figures exist depends on what was measured:

- a bar chart per scenario: the median of every metric per mode and
  params, whiskers from p25 to p75 across runs;
- throughput against record size, for rates whose params have `record_size`;
- latency CDFs of each mode's last run, from the raw samples;
- failover time against partitions, for `failover` metrics whose params
  have `partitions`.

Figures are capped (panels, bars, lines, CDFs) so a huge results dir still
gives a readable report; the tables carry everything.
"""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from matplotlib.figure import Figure

from bench.report.summary import CDF_GRID, Summary
from bench.report.units import HIGHER

MAX_PANELS = 12
MAX_BARS = 10
MAX_LINES = 10
MAX_CDF_FIGURES = 24
DPI = 90
MODE_COLORS = {"kraft": "tab:blue", "zk": "tab:orange"}


@dataclass(frozen=True)
class Plot:
    file: str  # name of the PNG, relative to the report's dir
    title: str
    kind: str  # "bars", "throughput_vs_record_size", "latency_cdf", "failover_vs_partitions"
    scenario: str


def params_label(params: dict[str, Any], skip: Iterable[str] = ()) -> str:
    items = [f"{k}={v}" for k, v in sorted(params.items()) if k not in set(skip)]
    return ", ".join(items) or "-"


def draw_all(summary: Summary, out_dir: str) -> list[Plot]:
    names: set[str] = set()
    plots: list[Plot] = []
    plots += _scenario_bars(summary.stats, out_dir, names)
    plots += _throughput_vs_record_size(summary.stats, out_dir, names)
    plots += _latency_cdfs(summary.cdfs, out_dir, names)
    plots += _failover_vs_partitions(summary.stats, out_dir, names)
    return plots


def _scenario_bars(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    plots = []
    for scenario, items in _group(stats, lambda s: s["scenario"]).items():
        panels = _group(items, lambda s: (s["metric"], s["unit"]))
        keys = list(panels)[:MAX_PANELS]
        ncols = min(3, len(keys))
        nrows = math.ceil(len(keys) / ncols)
        fig = Figure(figsize=(4.4 * ncols, 3.4 * nrows), layout="constrained")
        for i, (metric, unit) in enumerate(keys):
            ax = fig.add_subplot(nrows, ncols, i + 1)
            bars = sorted(panels[(metric, unit)], key=lambda s: (params_label(s["params"]), s["mode"]))[:MAX_BARS]
            medians = [s["median"] for s in bars]
            errors = [[s["median"] - s["p25"] for s in bars], [s["p75"] - s["median"] for s in bars]]
            colors = [MODE_COLORS.get(s["mode"], "tab:gray") for s in bars]
            ax.bar(range(len(bars)), medians, yerr=errors, color=colors, capsize=3)
            ax.set_xticks(range(len(bars)))
            ax.set_xticklabels(
                [f"{s['mode']}\n{params_label(s['params'])}"[:40] for s in bars], fontsize=6, rotation=30, ha="right"
            )
            ax.set_title(f"{metric} ({unit})", fontsize=9)
            ax.tick_params(axis="y", labelsize=7)
        fig.suptitle(f"{scenario}: median across runs, whiskers p25-p75", fontsize=10)
        plots.append(_save(fig, out_dir, names, "bars", scenario, scenario, f"{scenario}: all metrics"))
    return plots


def _throughput_vs_record_size(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    chosen = [
        s for s in stats if s["direction"] == HIGHER and _number(s["params"].get("record_size")) is not None
    ]
    plots = []
    for (scenario, unit), items in _group(chosen, lambda s: (s["scenario"], s["unit"])).items():
        fig = Figure(figsize=(7, 4.2), layout="constrained")
        ax = fig.add_subplot()
        lines = _group(items, lambda s: (s["metric"], s["mode"], params_label(s["params"], ["record_size"])))
        xs_all = _draw_lines(ax, lines, "record_size")
        _log_if_wide(ax, xs_all, "x")
        ax.set_xlabel("record size (bytes)")
        ax.set_ylabel(unit)
        ax.set_title(f"{scenario}: throughput against record size (median, p25-p75)", fontsize=10)
        plots.append(_save(fig, out_dir, names, "throughput", scenario, f"{scenario}-{unit}", f"{scenario}: {unit} vs record size"))
    return plots


def _failover_vs_partitions(stats: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    chosen = [s for s in stats if "failover" in s["metric"] and _number(s["params"].get("partitions")) is not None]
    plots = []
    for (scenario, metric, unit), items in _group(chosen, lambda s: (s["scenario"], s["metric"], s["unit"])).items():
        fig = Figure(figsize=(7, 4.2), layout="constrained")
        ax = fig.add_subplot()
        lines = _group(items, lambda s: (s["mode"], params_label(s["params"], ["partitions"])))
        _log_if_wide(ax, _draw_lines(ax, lines, "partitions"), "x")
        ax.set_xlabel("partitions")
        ax.set_ylabel(unit)
        ax.set_title(f"{scenario}: {metric} against partitions (median, p25-p75)", fontsize=10)
        plots.append(_save(fig, out_dir, names, "failover", scenario, f"{scenario}-{metric}", f"{scenario}: {metric} vs partitions"))
    return plots


def _latency_cdfs(cdfs: list[dict], out_dir: str, names: set[str]) -> list[Plot]:
    groups = _group(cdfs, lambda c: (c["scenario"], c["metric"], params_label(c["params"]), c["unit"]))
    plots = []
    for (scenario, metric, label, unit), curves in list(groups.items())[:MAX_CDF_FIGURES]:
        fig = Figure(figsize=(7, 4.2), layout="constrained")
        ax = fig.add_subplot()
        values_all: list[float] = []
        for curve in sorted(curves, key=lambda c: c["mode"])[:MAX_LINES]:
            values = curve["values"]
            values_all += values
            ax.step(
                values, CDF_GRID[: len(values)], where="post",
                color=MODE_COLORS.get(curve["mode"]), label=f"{curve['mode']} (run {curve['run_id']}, n={curve['count']})",
            )
        _log_if_wide(ax, values_all, "x")
        ax.set_ylim(0, 1.01)
        ax.set_xlabel(unit)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{scenario}: {metric} CDF, last run per mode ({label})", fontsize=10)
        plots.append(_save(fig, out_dir, names, "cdf", scenario, f"{scenario}-{metric}-{label}", f"{scenario}: {metric} CDF ({label})"))
    return plots


def _draw_lines(ax, lines: dict[tuple, list[dict]], x_param: str) -> list[float]:
    xs_all: list[float] = []
    for key, points in list(lines.items())[:MAX_LINES]:
        points = sorted(points, key=lambda s: _number(s["params"][x_param]))
        xs = [_number(s["params"][x_param]) for s in points]
        xs_all += xs
        medians = [s["median"] for s in points]
        errors = [[s["median"] - s["p25"] for s in points], [s["p75"] - s["median"] for s in points]]
        mode = next((k for k in key if k in MODE_COLORS), None)
        label = " / ".join(str(k) for k in key if k != "-")
        ax.errorbar(xs, medians, yerr=errors, marker="o", capsize=3, color=MODE_COLORS.get(mode), label=label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return xs_all


def _log_if_wide(ax, values: list[float], axis: str) -> None:
    positive = [v for v in values if v is not None and v > 0]
    if positive and len(positive) == len(values) and max(positive) / min(positive) >= 50:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def _save(fig: Figure, out_dir: str, names: set[str], kind: str, scenario: str, what: str, title: str) -> Plot:
    stem = f"{kind}-" + (re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-").lower() or "all")
    name, n = f"{stem}.png", 1
    while name in names:
        n += 1
        name = f"{stem}-{n}.png"
    names.add(name)
    fig.savefig(os.path.join(out_dir, name), dpi=DPI)
    kinds = {"bars": "bars", "throughput": "throughput_vs_record_size", "cdf": "latency_cdf", "failover": "failover_vs_partitions"}
    return Plot(file=name, title=title, kind=kinds[kind], scenario=scenario)


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
