"""The Spark half of the report: result rows in, a small `Summary` out.

See the package docstring for the statistics and their definitions. Every
aggregation here runs in Spark SQL (no Python UDFs), so it scales with the
cluster; only the per-key results are collected to the driver.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bench.histogram import PERCENTILES, percentile_key
from bench.report import ReportError
from bench.report.backends import backend_table
from bench.report.units import HIGHER, LOWER, LOWER_IS_BETTER_UNITS, RATE_SUFFIX
from bench.results import EVENTS_DIR, HISTOGRAMS_DIR, SAMPLES_DIR, SERIES_DIR

ROWS_DDL = (
    "run_id string, scenario string, mode string, params string, metric string, "
    "value double, unit string, timestamp_ms bigint, git_sha string"
)
SAMPLES_DDL = "run_id string, scenario string, mode string, params string, metric string, value double, unit string"
SERIES_DDL = (
    "run_id string, scenario string, mode string, params string, metric string, t_s double, value double, unit string"
)
EVENTS_DDL = "run_id string, scenario string, mode string, params string, event string, start_s double, end_s double"
HISTOGRAM_DDL = (
    "run_id string, scenario string, mode string, params string, metric string, unit string, "
    "bucket double, count bigint, min double, max double"
)
#: Percentiles of the merged histograms, as exact fractions (numerator, denominator)
#: so the nearest rank is integer arithmetic: 99.99 % of n is never off by one.
MERGED_PERCENTILES = (("p50", 50, 100), ("p90", 90, 100), ("p99", 99, 100), ("p99_9", 999, 1000),
                      ("p99_99", 9999, 10000))
#: Points per drawn series: longer series are averaged into this many bins.
SERIES_POINTS = 400

KEY = ["scenario", "mode", "metric", "params", "unit"]
MODE_KEY = ["scenario", "metric", "params", "unit"]
QUARTILES = [0.25, 0.5, 0.75]
# Rank accuracy of percentile_approx: rank error at most n / SAMPLE_ACCURACY.
SAMPLE_ACCURACY = 10_000
# CDF points drawn per curve: every percent, then the tail.
CDF_GRID = [i / 100 for i in range(100)] + [0.995, 0.999, 0.9995, 0.9999, 1.0]


@dataclass
class Settings:
    baseline_run_id: str | None = None
    noise_floor: float = 0.05
    noise_iqr_factor: float = 1.0


@dataclass
class Summary:
    """What the report shows; every list holds plain dicts (params decoded)."""

    settings: Settings
    runs: list[dict[str, Any]]
    stats: list[dict[str, Any]]
    mode_ratios: list[dict[str, Any]]
    comparisons: list[dict[str, Any]]
    latency_samples: list[dict[str, Any]] = field(default_factory=list)
    cdfs: list[dict[str, Any]] = field(default_factory=list)
    #: The metadata backends side by side (`bench.report.backends`).
    backends: list[dict[str, Any]] = field(default_factory=list)
    #: Each key's latency histograms merged across its runs: percentiles up to p99.99 and max.
    merged_histograms: list[dict[str, Any]] = field(default_factory=list)
    #: CDF points of each merged histogram: (key..., "points": [[value, fraction], ...]).
    merged_cdfs: list[dict[str, Any]] = field(default_factory=list)
    #: Per-interval series of each key's last run per mode (binned to SERIES_POINTS), and the runs' events.
    series: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: One value per key and commit (median of that commit's runs), in commit order.
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Change points found in `history` (`bench.report.changepoints`).
    change_points: list[dict[str, Any]] = field(default_factory=list)
    #: Other systems' results (imported OMB runs) beside raftka's (`bench.report.omb`).
    systems: list[dict[str, Any]] = field(default_factory=list)


def summarize(spark: SparkSession, results_dir: str, settings: Settings) -> Summary:
    # Every later query reads the rows (and the per-run values) again: read the files once.
    rows = load_rows(spark, results_dir).cache()
    runs = run_table(rows).cache()
    run_list = sorted(_collect(runs), key=lambda r: (r["started_ms"], r["run_id"]))
    if settings.baseline_run_id is not None and settings.baseline_run_id not in {r["run_id"] for r in run_list}:
        raise ReportError(
            f"--baseline {settings.baseline_run_id} is not a run in {results_dir}; "
            f"pick a run id from the report's runs table, or omit it to compare with the previous run"
        )
    per_run = per_run_values(rows, runs).cache()
    stats = key_stats(per_run)
    summary = Summary(
        settings=settings,
        runs=run_list,
        stats=_collect(stats),
        mode_ratios=_collect(mode_ratios(stats)),
        comparisons=_collect(comparisons(per_run, settings)),
    )
    summary.backends = backend_table(summary.stats)
    samples = load_samples(spark, results_dir)
    if samples is not None:
        summary.latency_samples = _collect(sample_stats(samples))
        summary.cdfs = _collect(last_run_cdfs(samples, runs))
    histograms = load_histograms(spark, results_dir)
    if histograms is not None:
        merged, cdf_points = merge_histograms(*histograms)
        summary.merged_histograms = _collect(merged)
        summary.merged_cdfs = _group_points(_collect(cdf_points), ["fraction"])
    # The one big table (10 million rows at 1,000 runs): Spark reads it, and only where needed.
    series = _load_beside(spark, results_dir, SERIES_DIR, SERIES_DDL, arrow=False)
    if series is not None:
        started = {r["run_id"]: r["started_ms"] for r in run_list}
        summary.series = _group_points(_collect(last_run_series(spark, results_dir, series, started)), [])
    events = _load_beside(spark, results_dir, EVENTS_DIR, EVENTS_DDL)
    if events is not None:
        summary.events = _collect(events)
    summary.history = _collect(commit_history(per_run, rows))
    from bench.report.changepoints import find_change_points
    from bench.report.omb import systems_table

    summary.change_points = find_change_points(summary.history, settings.noise_floor)
    summary.systems = systems_table(summary.stats, summary.merged_histograms)
    return summary


def _load_beside(spark: SparkSession, results_dir: str, folder: str, ddl: str, arrow: bool = True) -> DataFrame | None:
    path = os.path.join(results_dir, folder)
    if "://" not in results_dir and not _has_parquet(path, recursive=True):
        return None
    if arrow and _arrow_reads(spark, results_dir):
        return _from_arrow(spark, path, ddl)
    return spark.read.schema(ddl).option("recursiveFileLookup", "true").parquet(path)


def _arrow_reads(spark: SparkSession, results_dir: str) -> bool:
    """Whether the small tables are read by pyarrow in this process and
    handed to Spark in memory: with a local master and a local dir. Spark
    opens each Parquet file in a task of its own, some 10-50 ms each on the
    2-core VM, and a bench writes a file per run and table: at 1,000 runs
    reading the rows alone took 30-50 s, pyarrow (C++, threaded) reads them
    in about a second. On a cluster the executors read (the driver may not
    even see the files). The aggregation is Spark's either way."""
    return spark.sparkContext.master.startswith("local") and "://" not in results_dir


def _from_arrow(spark: SparkSession, source: str | list[str], ddl: str) -> DataFrame:
    import pyarrow as pa
    import pyarrow.dataset as ds

    types = {"string": pa.string(), "double": pa.float64(), "bigint": pa.int64()}
    schema = pa.schema([(name, types[kind]) for name, kind in (part.split() for part in ddl.split(","))])
    # An explicit schema, as Spark is given: extra columns are left out, missing ones are null.
    # The dataset's discovery skips `_`/`.` names inside the folder, as Spark's does.
    table = ds.dataset(source, format="parquet", schema=schema).to_table()
    return _arrow_frame(spark, table, ddl)


def _arrow_frame(spark: SparkSession, table: Any, ddl: str) -> DataFrame:
    """A pyarrow table as a DataFrame of as many partitions as Spark has
    cores: Spark makes one partition per Arrow batch, and a table read from
    1,000 files is 1,000 chunks, so every query ran 1,000 tiny tasks."""
    frame = spark.createDataFrame(table.combine_chunks(), schema=ddl)
    return frame.coalesce(max(1, spark.sparkContext.defaultParallelism))


def load_histograms(spark: SparkSession, results_dir: str) -> tuple[DataFrame, DataFrame | None] | None:
    """The histogram buckets of every run, and None or a table of their keys.

    Read by pyarrow (see `_arrow_reads`), the rows reach Spark with each key
    (scenario, mode, metric, params, unit) and run id as a small integer: at
    1,000 runs the buckets are 1.5 million rows, and their repeated strings
    were most of the 190 MB Spark would have been handed. The keys' table
    (key_id and the key's columns) joins them back after the merge."""
    path = os.path.join(results_dir, HISTOGRAMS_DIR)
    if "://" not in results_dir and not _has_parquet(path, recursive=True):
        return None
    if not _arrow_reads(spark, results_dir):
        return spark.read.schema(HISTOGRAM_DDL).option("recursiveFileLookup", "true").parquet(path), None
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from bench.results import HISTOGRAM_SCHEMA

    table = ds.dataset(path, format="parquet", schema=HISTOGRAM_SCHEMA).to_table()
    if table.num_rows == 0:
        return None
    # A separator no JSON text or name holds joins the key's columns into one string to encode.
    joined = pc.binary_join_element_wise(*[pc.fill_null(table[k], "") for k in KEY], "\x1f")
    keys = pc.dictionary_encode(joined).combine_chunks()
    runs = pc.dictionary_encode(table["run_id"]).combine_chunks()
    slim = pa.table({"key_id": keys.indices, "run_id": runs.indices, "bucket": table["bucket"],
                     "count": table["count"], "min": table["min"], "max": table["max"]})
    key_rows = [(i, *text.split("\x1f")) for i, text in enumerate(keys.dictionary.to_pylist())]
    key_table = spark.createDataFrame(key_rows, "key_id int, " + ", ".join(f"{k} string" for k in KEY))
    return _arrow_frame(spark, slim, "key_id int, run_id int, bucket double, count bigint, min double, "
                                     "max double"), key_table


def merge_histograms(hist: DataFrame, key_table: DataFrame | None = None) -> tuple[DataFrame, DataFrame]:
    """`merge_histograms_by`, by KEY; with `key_table`, `hist` carries a
    key_id in place of KEY and the results get KEY back from the table."""
    if key_table is None:
        return merge_histograms_by(hist, KEY)
    merged, cdf = merge_histograms_by(hist, ["key_id"])
    named = F.broadcast(key_table)
    return merged.join(named, "key_id").drop("key_id"), cdf.join(named, "key_id").drop("key_id")


def merge_histograms_by(hist: DataFrame, key: list[str]) -> tuple[DataFrame, DataFrame]:
    """Each key's bucket counts added across its runs (HdrHistogram's merge:
    the buckets line up), then per key the nearest-rank percentiles of the
    sum: the first bucket whose running count reaches the rank, clamped to
    the recorded min and max (as `bench.histogram.LatencyHistogram` answers).
    Also each key's CDF: (bucket value, fraction at or below)."""
    # Not cached: both passes below reduce it at once, and building Spark's columnar cache of
    # 1.5 million bucket rows cost more than reading them twice.
    per_bucket = hist.groupBy(*key, "bucket").agg(F.sum("count").alias("count"))
    totals = hist.groupBy(*key).agg(
        F.countDistinct("run_id").alias("n_runs"), F.min("min").alias("min"), F.max("max").alias("max"))
    upto = Window.partitionBy(*key).orderBy("bucket").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    everything = Window.partitionBy(*key)
    cum = (per_bucket.withColumn("cum", F.sum("count").over(upto))
           .withColumn("total", F.sum("count").over(everything))).cache()
    picks = []
    for name, num, den in MERGED_PERCENTILES:
        rank = F.greatest(F.lit(1), F.expr(f"(total * {num} + {den - 1}) div {den}"))
        picks.append(F.min(F.when(F.col("cum") >= rank, F.col("bucket"))).alias(name))
    raw = cum.groupBy(*key).agg(F.max("total").alias("count"), *picks).join(totals, key)
    clamp = [F.least(F.col("max"), F.greatest(F.col("min"), F.col(name))).alias(name)
             for name, _, _ in MERGED_PERCENTILES]
    merged = raw.select(*key, "n_runs", "count", "min", *clamp, "max")
    cdf = cum.join(totals, key).select(
        *key, F.least(F.col("max"), F.greatest(F.col("min"), F.col("bucket"))).alias("value"),
        (F.col("cum") / F.col("total")).alias("fraction"))
    return merged, cdf


def last_run_series(spark: SparkSession, results_dir: str, series: DataFrame,
                    started: dict[str, int]) -> DataFrame:
    """The series of each key's last run per mode, averaged into at most
    SERIES_POINTS bins of time (a million-point series draws as 400).

    Two passes, because nearly all series rows belong to runs that are not
    drawn: one aggregation over the whole table finds each run's keys (with
    their span and length), the driver picks each key's last run from the
    run table it already holds, and only those runs' folders are read again
    to bin their points. Joining every row with the runs and caching the
    kept rows instead cost minutes at 10 million rows."""
    # Raw rows, params as written: the second pass joins on them exactly.
    per_run = None if "://" in results_dir else series_index_from_footers(os.path.join(results_dir, SERIES_DIR))
    if per_run is None:
        per_run = series.groupBy(*KEY, "run_id").agg(
            F.max("t_s").alias("span"), F.count(F.lit(1)).alias("n")).collect()
    last: dict[tuple, tuple] = {}
    for row in per_run:
        key = tuple(row[k] for k in KEY)
        # Runs without result rows have no start: they lose to any run with one.
        rank = (started.get(row["run_id"]) or -1, row["run_id"])
        if key not in last or rank > last[key][0]:
            last[key] = (rank, row)
    chosen = [row for _, row in last.values()]
    if not chosen:
        return spark.createDataFrame([], f"{', '.join(k + ' string' for k in KEY)}, run_id string, "
                                         "raw array<struct<bin:double,value:double>>")
    picks = spark.createDataFrame([tuple(row[k] for k in KEY) + (row["run_id"], float(row["span"]), int(row["n"]))
                                   for row in chosen],
                                  f"{', '.join(k + ' string' for k in KEY)}, run_id string, span double, n bigint")
    run_ids = sorted({row["run_id"] for row in chosen})
    folders = [os.path.join(results_dir, SERIES_DIR, r) for r in run_ids]
    if "://" not in results_dir and all(os.path.isdir(f) for f in folders):
        # `write_series` keeps each run in its own folder: read only the drawn runs.
        kept = spark.read.schema(SERIES_DDL).option("recursiveFileLookup", "true").parquet(*folders)
    else:
        kept = series.where(F.col("run_id").isin(run_ids))
    joined = kept.join(F.broadcast(picks), [*KEY, "run_id"])
    binned = joined.withColumn(
        "bin", F.when(F.col("n") <= SERIES_POINTS, F.col("t_s"))
        .otherwise(F.floor(F.col("t_s") / F.col("span") * SERIES_POINTS) * F.col("span") / SERIES_POINTS))
    # Each bin's mean in Spark: the driver gets at most SERIES_POINTS + 1 points per key.
    return binned.groupBy(*KEY, "run_id", "bin").agg(F.avg("value").alias("value")).groupBy(*KEY, "run_id").agg(
        F.sort_array(F.collect_list(F.struct("bin", "value"))).alias("raw"))


def series_index_from_footers(series_dir: str) -> list[dict[str, Any]] | None:
    """Each run's series keys with their span (largest t_s) and length,
    read from the Parquet footers alone (row-group statistics), without
    reading a row: `write_series` writes one key per file, so in each row
    group every key column's min equals its max. None when some row group
    does not say (another writer, statistics left out): then Spark
    aggregates the rows instead. At 1,000 runs this is a second, where
    Spark's pass over 10 million rows was most of the report's time."""
    import pyarrow.parquet as pq

    index: dict[tuple, dict[str, Any]] = {}
    for folder, _, names in os.walk(series_dir):
        for name in names:
            if not name.endswith(".parquet"):
                continue
            meta = pq.ParquetFile(os.path.join(folder, name)).metadata
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                if group.num_rows == 0:
                    continue
                stats = {group.column(c).path_in_schema: group.column(c).statistics
                         for c in range(group.num_columns)}
                values = {}
                for column in (*KEY, "run_id", "t_s"):
                    st = stats.get(column)
                    if st is None or not st.has_min_max or st.null_count:
                        return None
                    if column != "t_s" and st.min != st.max:
                        return None
                    values[column] = st.max
                key = tuple(values[k] for k in (*KEY, "run_id"))
                entry = index.setdefault(key, {**{k: values[k] for k in (*KEY, "run_id")}, "span": values["t_s"],
                                               "n": 0})
                entry["span"] = max(entry["span"], values["t_s"])
                entry["n"] += group.num_rows
    return list(index.values())


def commit_history(per_run: DataFrame, rows: DataFrame) -> DataFrame:
    """One value per (key, commit): the median of the commit's run values;
    commits ordered by their first run."""
    shas = rows.groupBy("run_id").agg(F.min("git_sha").alias("git_sha"))
    with_sha = per_run.join(shas, "run_id")
    return with_sha.groupBy(*KEY, "git_sha").agg(
        F.percentile("value", 0.5).alias("value"),
        F.min("started_ms").alias("first_ms"),
        F.count(F.lit(1)).alias("runs")).withColumn("direction", direction_column(F.col("unit")))


def _group_points(items: list[dict[str, Any]], extra: list[str]) -> list[dict[str, Any]]:
    """Rows of points into one dict per key with its points, in order."""
    out: dict[tuple, dict[str, Any]] = {}
    for item in items:
        key = (item["scenario"], item["mode"], item["metric"], json.dumps(item["params"], sort_keys=True),
               item["unit"], item.get("run_id"))
        entry = out.setdefault(key, {k: item[k] for k in ("scenario", "mode", "metric", "params", "unit")}
                               | ({"run_id": item["run_id"]} if "run_id" in item else {}) | {"points": []})
        if "raw" in item:
            bins: dict[float, list[float]] = {}
            for p in item["raw"]:
                bins.setdefault(p["bin"], []).append(p["value"])
            entry["points"] = [[t, sum(v) / len(v)] for t, v in sorted(bins.items())]
        else:
            entry["points"].append([item["value"], item["fraction"]])
    for entry in out.values():
        entry["points"].sort()
    return list(out.values())


def load_rows(spark: SparkSession, results_dir: str) -> DataFrame:
    if "://" not in results_dir and not _has_parquet(results_dir):
        raise ReportError(
            f"no result rows in {results_dir!r}: run a bench first (`raftka bench SCENARIO --results "
            f"{results_dir}`) or pass --results with the dir the bench wrote to"
        )
    # Only the top level: `_samples/` and other `_` folders are not rows.
    if _arrow_reads(spark, results_dir):
        names = sorted(os.path.join(results_dir, n) for n in os.listdir(results_dir) if n.endswith(".parquet"))
        return _from_arrow(spark, names, ROWS_DDL)
    return spark.read.schema(ROWS_DDL).parquet(os.path.join(results_dir, "*.parquet"))


def load_samples(spark: SparkSession, results_dir: str) -> DataFrame | None:
    samples_dir = os.path.join(results_dir, SAMPLES_DIR)
    if "://" not in results_dir and not _has_parquet(samples_dir, recursive=True):
        return None
    if _arrow_reads(spark, results_dir):
        return _from_arrow(spark, samples_dir, SAMPLES_DDL)
    return spark.read.schema(SAMPLES_DDL).option("recursiveFileLookup", "true").parquet(samples_dir)


def run_table(rows: DataFrame) -> DataFrame:
    """One row per run: when it started (its first row), its commit, its scenarios."""
    return rows.groupBy("run_id").agg(
        F.min("timestamp_ms").alias("started_ms"),
        F.min("git_sha").alias("git_sha"),
        F.sort_array(F.collect_set("scenario")).alias("scenarios"),
        F.count(F.lit(1)).alias("n_rows"),
    )


def per_run_values(rows: DataFrame, runs: DataFrame) -> DataFrame:
    """One value per (key, run): the median of the run's rows for the key."""
    values = rows.groupBy(*KEY, "run_id").agg(F.percentile("value", 0.5).alias("value"))
    return values.join(runs.select("run_id", "started_ms"), "run_id")


def key_stats(per_run: DataFrame) -> DataFrame:
    q = F.percentile("value", QUARTILES)
    stats = per_run.groupBy(*KEY).agg(
        F.count(F.lit(1)).alias("n_runs"),
        q.alias("q"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
    )
    return stats.select(
        *KEY,
        "n_runs",
        F.col("q")[1].alias("median"),
        F.col("q")[0].alias("p25"),
        F.col("q")[2].alias("p75"),
        (F.col("q")[2] - F.col("q")[0]).alias("iqr"),
        "min",
        "max",
        direction_column(F.col("unit")).alias("direction"),
    )


def mode_ratios(stats: DataFrame) -> DataFrame:
    """kraft median / zk median where a key was measured in both modes."""

    def side(mode: str) -> DataFrame:
        return stats.where(F.col("mode") == mode).select(
            *MODE_KEY, F.col("median").alias(f"{mode}_median"), F.col("n_runs").alias(f"{mode}_runs")
        )

    both = side("kraft").join(side("zk"), MODE_KEY)
    return both.select(
        *MODE_KEY,
        "kraft_median",
        "zk_median",
        "kraft_runs",
        "zk_runs",
        F.when(F.col("zk_median") != 0, F.col("kraft_median") / F.col("zk_median")).alias("ratio"),
        direction_column(F.col("unit")).alias("direction"),
    )


def comparisons(per_run: DataFrame, settings: Settings) -> DataFrame:
    """The last run of each key against its baseline, with a verdict."""
    newest_first = Window.partitionBy(*KEY).orderBy(F.desc("started_ms"), F.desc("run_id"))
    ranked = per_run.withColumn("recency", F.row_number().over(newest_first))
    last = ranked.where(F.col("recency") == 1).select(
        *KEY, F.col("run_id").alias("last_run_id"), F.col("value").alias("last")
    )
    if settings.baseline_run_id is None:
        base = ranked.where(F.col("recency") == 2)
    else:
        base = ranked.where(F.col("run_id") == settings.baseline_run_id)
    base = base.select(*KEY, F.col("run_id").alias("baseline_run_id"), F.col("value").alias("baseline"))
    hq = F.percentile("value", QUARTILES)
    history = (
        ranked.where(F.col("recency") > 1)
        .groupBy(*KEY)
        .agg(hq.alias("hq"), F.count(F.lit(1)).alias("history_runs"))
        .select(
            *KEY,
            "history_runs",
            F.when(F.col("hq")[1] != 0, (F.col("hq")[2] - F.col("hq")[0]) / F.abs(F.col("hq")[1])).alias("noise"),
        )
    )
    joined = last.join(base, KEY).join(history, KEY, "left")
    change = F.when(F.col("baseline") != 0, F.col("last") / F.col("baseline") - 1)
    # greatest() skips nulls: no measurable noise leaves the floor.
    band = F.greatest(F.lit(settings.noise_floor), F.lit(settings.noise_iqr_factor) * F.col("noise"))
    direction = direction_column(F.col("unit"))
    worse = F.when(direction == HIGHER, -F.col("change")).when(direction == LOWER, F.col("change"))
    verdict = (
        F.when(F.col("change").isNull(), "n/a")
        .when(F.col("direction").isNull(), F.when(F.abs("change") > F.col("noise_band"), "changed").otherwise("within noise"))
        .when(worse > F.col("noise_band"), "regression")
        .when(worse < -F.col("noise_band"), "improvement")
        .otherwise("within noise")
    )
    return (
        joined.withColumn("change", change)
        .withColumn("noise_band", band)
        .withColumn("direction", direction)
        .withColumn("verdict", verdict)
        .select(
            *KEY,
            "last_run_id",
            "baseline_run_id",
            "last",
            "baseline",
            F.when(F.col("baseline") != 0, F.col("last") / F.col("baseline")).alias("ratio"),
            "change",
            F.coalesce(F.col("history_runs"), F.lit(0)).alias("history_runs"),
            "noise",
            "noise_band",
            "direction",
            "verdict",
            (F.col("verdict") == "regression").alias("regression"),
        )
    )


def sample_stats(samples: DataFrame) -> DataFrame:
    fractions = [p / 100 for p in PERCENTILES]
    stats = samples.groupBy("run_id", *KEY).agg(
        F.count(F.lit(1)).alias("count"),
        F.percentile_approx("value", fractions, SAMPLE_ACCURACY).alias("q"),
        F.max("value").alias("max"),
    )
    quantiles = [F.col("q")[i].alias(percentile_key(p)) for i, p in enumerate(PERCENTILES)]
    return stats.select("run_id", *KEY, "count", *quantiles, "max")


def last_run_cdfs(samples: DataFrame, runs: DataFrame) -> DataFrame:
    """CDF points (value at each fraction of CDF_GRID) of each key's last run."""
    with_start = samples.join(runs.select("run_id", "started_ms"), "run_id", "left")
    last_start = with_start.groupBy(*KEY).agg(F.max(F.struct("started_ms", "run_id")).alias("last"))
    last = with_start.join(last_start, KEY).where(F.col("run_id") == F.col("last.run_id"))
    return last.groupBy(*KEY, "run_id").agg(
        F.count(F.lit(1)).alias("count"),
        F.percentile_approx("value", CDF_GRID, SAMPLE_ACCURACY).alias("values"),
    )


def direction_column(unit: Column) -> Column:
    """`units.direction` as a Spark expression (same constants)."""
    return F.when(unit.endswith(RATE_SUFFIX), HIGHER).when(unit.isin(*LOWER_IS_BETTER_UNITS), LOWER)


def _collect(df: DataFrame) -> list[dict[str, Any]]:
    """The rows as dicts, params decoded, in reading order: by scenario,
    metric, params (numbers by value: record_size 100 before 1000), mode."""
    out = []
    for row in df.collect():
        item = row.asDict(recursive=True)
        if "params" in item:
            item["params"] = json.loads(item["params"]) if item["params"] else {}
        out.append(item)
    return sorted(out, key=_reading_order)


def _reading_order(item: dict[str, Any]) -> tuple:
    def natural(value: Any) -> tuple:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, float(value), "")
        return (1, 0.0, str(value))

    params = tuple((k, natural(v)) for k, v in sorted(item.get("params", {}).items()))
    return tuple(str(item.get(f, "")) for f in ("scenario", "metric")) + (params,) + tuple(
        str(item.get(f, "")) for f in ("mode", "unit", "run_id")
    )


def _has_parquet(path: str, recursive: bool = False) -> bool:
    if not os.path.isdir(path):
        return False
    if not recursive:
        return any(name.endswith(".parquet") for name in os.listdir(path))
    return any(name.endswith(".parquet") for _, _, names in os.walk(path) for name in names)
