"""`build_report`: the Spark summary, then plots and files, into one dir."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql import SparkSession

from bench.report.plots import Plot, draw_all
from bench.report.render import write_all
from bench.report.summary import Settings, Summary, summarize


@dataclass
class Report:
    summary: Summary
    plots: list[Plot]
    files: dict[str, str]  # "report.md" / "report.html" / "summary.json" -> path


def build_report(spark: SparkSession, results_dir: str, out_dir: str, settings: Settings | None = None) -> Report:
    """Summarize every run in `results_dir` and write report.md,
    report.html, summary.json and the PNG plots into `out_dir`."""
    summary = summarize(spark, results_dir, settings or Settings())
    os.makedirs(out_dir, exist_ok=True)
    plots = draw_all(summary, out_dir)
    files = write_all(summary, plots, results_dir, out_dir)
    return Report(summary=summary, plots=plots, files=files)
