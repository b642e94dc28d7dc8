"""report.md, report.html and summary.json from a `Summary` and its plots.

The tables are built once, as rows of strings, and written twice: as
GitHub markdown and as HTML. summary.json carries the same numbers
unrounded, for tools and tests.
"""

from __future__ import annotations

import html
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.report.backends import BACKENDS
from bench.report.plots import Plot, params_label, side_of, split_params, vary_label
from bench.report.summary import CDF_GRID, MERGED_PERCENTILES, Summary

MD_FILE = "report.md"
HTML_FILE = "report.html"
JSON_FILE = "summary.json"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)


def write_all(summary: Summary, plots: list[Plot], results_dir: str, out_dir: str) -> dict[str, str]:
    generated_ms = int(time.time() * 1000)
    sections = build_sections(summary, plots, results_dir)
    paths = {name: os.path.join(out_dir, name) for name in (MD_FILE, HTML_FILE, JSON_FILE)}
    with open(paths[MD_FILE], "w") as f:
        f.write(to_markdown(sections))
    with open(paths[HTML_FILE], "w") as f:
        f.write(to_html(sections))
    with open(paths[JSON_FILE], "w") as f:
        json.dump(to_json(summary, plots, results_dir, generated_ms), f, indent=1, sort_keys=True)
    return paths


def fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
            return f"{x:.4g}"
        return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def pct(x: float | None) -> str:
    if x is None:
        return "–"
    return "0.0%" if abs(x) < 0.0005 else f"{x * 100:+.1f}%"


def utc(ms: int | None) -> str:
    return "–" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def build_sections(summary: Summary, plots: list[Plot], results_dir: str) -> list[Section]:
    s = summary.settings
    baseline = f"run `{s.baseline_run_id}`" if s.baseline_run_id else "the previous run of each measurement"
    regressions = [c for c in summary.comparisons if c["regression"]]
    head = Section(
        "raftka bench report",
        text=(
            f"{len(summary.runs)} runs read from `{results_dir}`. Each run counts once per measurement "
            f"(the median of its rows). Last run compared with {baseline}; a change is a regression when it "
            f"goes the wrong way by more than max({s.noise_floor:.0%}, {s.noise_iqr_factor:g} × IQR/median "
            f"of the earlier runs). With fewer than 4 earlier runs the IQR says little about the noise: "
            f"only the floor really applies, so repeat runs before trusting a flag."
        ),
    )
    head.tables.append(
        Table(
            f"Regressions ({len(regressions)})" if regressions else "Regressions: none",
            ["scenario", "metric", "mode", "params", "last", "baseline", "change", "noise band", "earlier runs"],
            [
                [c["scenario"], c["metric"], c["mode"], params_label(c["params"]),
                 f"{fmt(c['last'])} {c['unit']}", f"{fmt(c['baseline'])} {c['unit']}", pct(c["change"]),
                 f"±{c['noise_band']:.1%}", str(c["history_runs"])]
                for c in regressions
            ],
        )
    )
    head.tables.append(
        Table(
            "Runs",
            ["run", "started (UTC)", "git sha", "scenarios", "rows"],
            [[r["run_id"], utc(r["started_ms"]), (r["git_sha"] or "")[:10], ", ".join(r["scenarios"]), str(r["n_rows"])]
             for r in summary.runs],
        )
    )
    head.tables.insert(0, _headline_table(summary))
    sections = [head]
    backends = _backends_section(summary)
    if backends is not None:
        sections.append(backends)
    systems = _systems_section(summary, [p for p in plots if p.kind == "systems"])
    if systems is not None:
        sections.append(systems)
    changes = _changes_section(summary)
    if changes is not None:
        sections.append(changes)
    for scenario in sorted({st["scenario"] for st in summary.stats}):
        sections.append(_scenario_section(summary, [p for p in plots if p.scenario == scenario
                                                    and p.kind != "systems"], scenario))
    return sections


#: At most this many lines in the headline table.
HEADLINES = 20


def _headline_table(summary: Summary) -> Table:
    """The latest run's figures against their baseline, the biggest moves
    (relative to their noise band) first: the one-page summary."""
    rows = [c for c in summary.comparisons if c["direction"] and c["change"] is not None]
    rows.sort(key=lambda c: (-abs(c["change"]) / max(c["noise_band"], 1e-9), c["scenario"], c["metric"]))
    by_scenario: dict[str, list[dict]] = {}
    for st in summary.stats:
        by_scenario.setdefault(st["scenario"], []).append(st)
    varying = {scenario: split_params(items)[0] for scenario, items in by_scenario.items()}
    return Table(
        f"Headline: the latest run against its baseline ({min(len(rows), HEADLINES)} of {len(rows)} "
        "measurements with a known better direction, biggest moves first)",
        ["scenario", "metric", "mode", "varying params", "last", "baseline", "change", "noise band", "verdict"],
        [[c["scenario"], c["metric"], side_of(c), vary_label(c["params"], varying.get(c["scenario"], []), ", "),
          f"{fmt(c['last'])} {c['unit']}", f"{fmt(c['baseline'])} {c['unit']}", pct(c["change"]),
          f"±{c['noise_band']:.1%}", f"**{c['verdict']}**" if c["regression"] else c["verdict"]]
         for c in rows[:HEADLINES]],
    )


def _systems_section(summary: Summary, plots: list[Plot]) -> Section | None:
    from bench.report.omb import MAPPED, NOT_MAPPED

    if not summary.systems:
        return None
    section = Section(
        "Other systems beside raftka",
        text=(f"OpenMessaging Benchmark result files imported with `raftka report --import-omb`, each beside "
              f"raftka's `produce` runs of the same record size (medians across runs; raftka's p99.9 and beyond "
              f"from its merged histograms). Mapped: {MAPPED}. Not mapped: {NOT_MAPPED}."),
        plots=plots)
    for entry in summary.systems:
        section.tables.append(Table(
            f"{entry['system']} ({entry['workload']}) beside raftka "
            f"({params_label(entry['raftka_params']) if entry['raftka_params'] else 'no raftka run of that size'})",
            ["measurement", "unit", "raftka", str(entry["system"]), f"{entry['system']}/raftka"],
            [[m["what"], m["unit"], fmt(m["raftka"]), fmt(m["other"]),
              fmt(m["other"] / m["raftka"]) if m["raftka"] and m["other"] is not None else "–"]
             for m in entry["metrics"]]))
    return section


def _changes_section(summary: Summary) -> Section | None:
    from bench.report.changepoints import MIN_SIDE, T_THRESHOLD

    commits = {h["git_sha"] for h in summary.history}
    if len(commits) < 2 * MIN_SIDE:
        return None
    section = Section(
        "Across commits",
        text=(f"{len(commits)} commits benched. Each measurement's history is one value per commit (the median of "
              f"its runs), in the order the commits were first benched. Change points: binary segmentation (the "
              f"search of E-divisive means, as Apache Otava runs it) scored by Welch's t between the two sides, "
              f"kept when t ≥ {T_THRESHOLD:g}, each side has {MIN_SIDE} or more commits, and the medians differ "
              f"by more than the noise band max({summary.settings.noise_floor:.0%}, IQR/median before)."))
    section.tables.append(Table(
        f"Change points ({len(summary.change_points)})" if summary.change_points else "Change points: none",
        ["scenario", "metric", "mode", "params", "last commit before", "first commit after", "before", "after",
         "change", "verdict"],
        [[c["scenario"], c["metric"], c["mode"], params_label(c["params"]), (c["before_sha"] or "?")[:10],
          (c["after_sha"] or "?")[:10], f"{fmt(c['before'])} {c['unit']}", f"{fmt(c['after'])} {c['unit']}",
          pct(c["change"]), f"**{c['verdict']}**" if c["verdict"] == "regression" else c["verdict"]]
         for c in summary.change_points]))
    return section


def _backends_section(summary: Summary) -> Section | None:
    """raftka's Raft, pysyncobj's Raft and ZooKeeper side by side, if more than one was measured."""
    lines = summary.backends
    if len({b for line in lines for b in BACKENDS if line[b] is not None}) < 2:
        return None
    section = Section(
        "Metadata backends side by side",
        text=("Medians across runs of the metadata benches, by the backend they ran on (`--quorum-engine "
              "raftka|pysyncobj` in KRaft mode, `--mode zk`), matched on every other parameter; the ratios "
              "divide by raftka's Raft. `better` says which way is better for the unit."))
    section.tables.append(Table(
        "Backends (medians)",
        ["measurement", "scenario", "params", "unit", "raftka Raft", "pysyncobj", "ZooKeeper",
         "pysyncobj/raftka", "ZooKeeper/raftka", "better"],
        [[line["what"], line["scenario"], params_label(line["params"]), line["unit"]]
         + [fmt(line[b]) for b in BACKENDS]
         + [fmt(line["pysyncobj_to_raftka"]), fmt(line["zookeeper_to_raftka"]), line["direction"] or "?"]
         for line in lines]))
    return section


def _scenario_section(summary: Summary, plots: list[Plot], scenario: str) -> Section:
    section = Section(f"Scenario `{scenario}`", plots=plots)
    section.tables.append(
        Table(
            "Across runs",
            ["metric", "mode", "params", "unit", "runs", "median", "p25", "p75", "IQR", "min", "max", "better"],
            [[st["metric"], st["mode"], params_label(st["params"]), st["unit"], str(st["n_runs"])]
             + [fmt(st[k]) for k in ("median", "p25", "p75", "iqr", "min", "max")] + [st["direction"] or "?"]
             for st in summary.stats if st["scenario"] == scenario],
        )
    )
    ratios = [r for r in summary.mode_ratios if r["scenario"] == scenario]
    if ratios:
        section.tables.append(
            Table(
                "KRaft against ZooKeeper (medians)",
                ["metric", "params", "unit", "kraft", "zk", "kraft/zk", "better"],
                [[r["metric"], params_label(r["params"]), r["unit"], fmt(r["kraft_median"]), fmt(r["zk_median"]),
                  fmt(r["ratio"]), r["direction"] or "?"] for r in ratios],
            )
        )
    comparisons = [c for c in summary.comparisons if c["scenario"] == scenario]
    if comparisons:
        section.tables.append(
            Table(
                "Last run against baseline",
                ["metric", "mode", "params", "unit", "last run", "baseline run", "last", "baseline", "change",
                 "noise band", "earlier runs", "verdict"],
                [[c["metric"], c["mode"], params_label(c["params"]), c["unit"], c["last_run_id"], c["baseline_run_id"],
                  fmt(c["last"]), fmt(c["baseline"]), pct(c["change"]), f"±{c['noise_band']:.1%}",
                  str(c["history_runs"]), f"**{c['verdict']}**" if c["regression"] else c["verdict"]]
                 for c in comparisons],
            )
        )
    samples = [x for x in summary.latency_samples if x["scenario"] == scenario]
    if samples:
        section.tables.append(
            Table(
                "Raw latency samples per run (nearest rank)",
                ["run", "metric", "mode", "params", "unit", "n", "p50", "p95", "p99", "p99.9", "max"],
                [[x["run_id"], x["metric"], x["mode"], params_label(x["params"]), x["unit"], str(x["count"])]
                 + [fmt(x[k]) for k in ("p50", "p95", "p99", "p99_9", "max")] for x in samples],
            )
        )
    merged = [m for m in summary.merged_histograms if m["scenario"] == scenario]
    if merged:
        names = [n for n, _, _ in MERGED_PERCENTILES]
        section.tables.append(
            Table(
                "Latency histograms merged across runs (nearest rank, 3 significant digits)",
                ["metric", "mode", "params", "unit", "runs", "n", *[n.replace("_", ".") for n in names], "max"],
                [[m["metric"], m["mode"], params_label(m["params"]), m["unit"], str(m["n_runs"]), f"{m['count']:,}"]
                 + [fmt(m[n]) for n in names] + [fmt(m["max"])] for m in merged],
            )
        )
    return section


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(sections: list[Section]) -> str:
    out: list[str] = []
    for i, section in enumerate(sections):
        out += [("# " if i == 0 else "## ") + section.title, ""]
        if section.text:
            out += [section.text, ""]
        for table in section.tables:
            out += [f"### {table.title}", ""]
            if not table.rows:
                continue
            out.append("| " + " | ".join(table.headers) + " |")
            out.append("|" + "|".join("---" for _ in table.headers) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
            out.append("")
        for plot in section.plots:
            out += [f"![{plot.title}]({plot.file})", "", f"*{plot.title}*: {plot.caption}", ""]
    return "\n".join(out)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f0f0f0; } td:nth-child(-n+4) { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
strong { color: #b00; }
"""


def to_html(sections: list[Section]) -> str:
    e = html.escape
    out = ["<!doctype html>", "<html><head><meta charset='utf-8'>",
           f"<title>{e(sections[0].title)}</title><style>{_CSS}</style></head><body>"]
    for i, section in enumerate(sections):
        tag = "h1" if i == 0 else "h2"
        out.append(f"<{tag}>{_inline(section.title)}</{tag}>")
        if section.text:
            out.append(f"<p>{_inline(section.text)}</p>")
        for table in section.tables:
            out.append(f"<h3>{e(table.title)}</h3>")
            if not table.rows:
                continue
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in table.headers) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in table.rows]
            out.append("</table>")
        for plot in section.plots:
            out.append(f"<figure><img src='{e(plot.file)}' alt='{e(plot.title)}'><figcaption>{e(plot.title)}: "
                       f"{e(plot.caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _inline(text: str) -> str:
    """The little markdown the tables use (`code`, **bold**) as HTML."""
    parts = html.escape(text).split("`")
    text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
    parts = text.split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def to_json(summary: Summary, plots: list[Plot], results_dir: str, generated_ms: int) -> dict[str, Any]:
    return {
        "generated_ms": generated_ms,
        "results_dir": results_dir,
        "settings": asdict(summary.settings),
        "runs": summary.runs,
        "stats": summary.stats,
        "mode_ratios": summary.mode_ratios,
        "comparisons": summary.comparisons,
        "backends": summary.backends,
        "latency_samples": summary.latency_samples,
        "cdf_grid": CDF_GRID,
        "cdfs": summary.cdfs,
        "merged_histograms": summary.merged_histograms,
        "merged_cdfs": summary.merged_cdfs,
        "series": summary.series,
        "events": summary.events,
        "history": summary.history,
        "change_points": summary.change_points,
        "systems": summary.systems,
        "plots": [asdict(p) for p in plots],
    }
