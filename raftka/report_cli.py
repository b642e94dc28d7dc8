"""`raftka report`: the Spark summary of every bench run.

    raftka report [--results DIR] [--out DIR] [--master local[*]|spark://...]
                  [--baseline RUN_ID] [--noise-floor 0.05]
                  [--import-omb FILE... [--system NAME]] [--export-omb DIR]

Reads the result rows (and raw samples) the benches wrote to `--results`,
and writes report.html, report.md, summary.json and PNG plots to `--out`
(default `<results>/_report`: the `_` keeps it out of the dataset). With a
cluster master, the results dir must be a path every executor can read.
pyspark is imported only when the command runs, so the rest of the CLI
starts fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.cli import DEFAULT_RESULTS_DIR

DEFAULT_OUT_SUBDIR = "_report"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="summarize every bench run (Spark) into report.html and report.md",
        description="Summarize every bench run in a results dir with Spark: per-scenario medians, "
        "percentiles and IQR across runs, kraft/zk ratios, the last run against a baseline with "
        "regressions flagged beyond the measured noise, and matplotlib plots.",
    )
    parser.add_argument(
        "--results", default=DEFAULT_RESULTS_DIR, metavar="DIR",
        help=f"the Parquet dataset the benches wrote (default {DEFAULT_RESULTS_DIR})",
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR",
        help=f"where report.html, report.md, summary.json and the plots go (default DIR/{DEFAULT_OUT_SUBDIR})",
    )
    parser.add_argument(
        "--master", default="local[*]", metavar="URL",
        help="Spark master: local[*] (default), local[N], spark://host:port, ...",
    )
    parser.add_argument(
        "--baseline", default=None, metavar="RUN_ID",
        help="compare the last run with this run (default: the previous run of each measurement)",
    )
    parser.add_argument(
        "--noise-floor", type=float, default=0.05, metavar="FRACTION",
        help="smallest change ever flagged as a regression, as a fraction (default 0.05 = 5%%)",
    )
    parser.add_argument(
        "--noise-iqr-factor", type=float, default=1.0, metavar="K",
        help="noise band = max(floor, K x IQR/median of the earlier runs) (default 1.0)",
    )
    parser.add_argument(
        "--import-omb", nargs="+", default=None, metavar="FILE",
        help="first append these OpenMessaging Benchmark result JSON files to --results (as scenario omb, "
        "params.system = the file's driver), then report them beside raftka's produce runs",
    )
    parser.add_argument(
        "--system", default=None, metavar="NAME",
        help="with --import-omb: the system's name in the report (default: the file's driver field)",
    )
    parser.add_argument(
        "--export-omb", default=None, metavar="DIR",
        help="also write every raftka produce run as an OpenMessaging Benchmark TestResult JSON file into DIR",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession

    from bench.report import ReportError
    from bench.report.build import build_report
    from bench.report.spark import spark_session
    from bench.report.summary import Settings

    if args.noise_floor < 0 or args.noise_iqr_factor < 0:
        raise SystemExit("raftka report: --noise-floor and --noise-iqr-factor must be >= 0")
    out_dir = args.out or os.path.join(args.results, DEFAULT_OUT_SUBDIR)
    if args.import_omb:
        from bench.report.omb import OmbFormatError, import_omb

        try:
            run_ids = import_omb(args.results, args.import_omb, args.system)
        except OmbFormatError as e:
            print(f"raftka report: {e}", file=sys.stderr)
            return 2
        print(f"imported {len(run_ids)} OMB result file(s) into {args.results}: runs {', '.join(run_ids)}")
    settings = Settings(
        baseline_run_id=args.baseline, noise_floor=args.noise_floor, noise_iqr_factor=args.noise_iqr_factor
    )
    # Join a session this process already runs (tests, notebooks) and leave
    # it running; stop only the one started here.
    started_here = SparkSession.getActiveSession() is None
    spark = spark_session(args.master)
    try:
        report = build_report(spark, args.results, out_dir, settings)
    except ReportError as e:
        print(f"raftka report: {e}", file=sys.stderr)
        return 2
    finally:
        if started_here:
            spark.stop()
    regressions = [c for c in report.summary.comparisons if c["regression"]]
    print(f"{len(report.summary.runs)} runs, {len(report.summary.stats)} measurements, "
          f"{len(regressions)} regressions")
    for name in ("report.html", "report.md", "summary.json"):
        print(f"wrote {report.files[name]}")
    if args.export_omb:
        from bench.report.omb import export_omb

        written = export_omb(args.results, args.export_omb)
        print(f"wrote {len(written)} OMB result file(s) to {args.export_omb}")
    return 0
