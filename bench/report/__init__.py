"""The bench summary: `raftka report` turns the result rows of every run
into report.md, report.html (with matplotlib plots) and summary.json.

Theory of operation
-------------------
The heavy part is a Spark job (`summary.py`), so the same code runs on the
laptop (`local[*]`) and on a cluster (`spark://...`) over years of runs:

1. Read the rows (`<results>/*.parquet`, schema in `bench.results`) and
   reduce each run to one value per key `(scenario, mode, metric, params,
   unit)`: the median of that run's rows for the key.
2. Across runs, per key: n runs, median, p25, p75, IQR, min, max. Quartiles
   interpolate linearly between order statistics (Spark's exact
   `percentile`, the "inclusive" method of Python's `statistics.quantiles`).
3. Mode ratios: kraft median / zk median for every (scenario, metric,
   params, unit) measured in both modes.
4. Last run vs baseline, per key: the baseline is `--baseline RUN_ID`, or
   else the run before the last. The change is flagged a regression when it
   goes the wrong way (see `units.direction`) by more than the noise band
   `max(noise_floor, noise_iqr_factor * IQR / |median|)`, measured over the
   runs before the last, so a regression cannot widen its own band.
5. Raw latency samples (`<results>/_samples/`): per run p50/p95/p99/p99.9
   (Spark's `percentile_approx`, nearest rank, rank error at most n/10**4),
   and CDF points of each mode's last run for the plots.

6. Series inside runs: only each key's last run per mode is drawn, so the
   runs and keys come from the Parquet footers (`series_index_from_footers`)
   and Spark reads and bins only those runs' folders.

Under a local master the small tables (rows, samples, histograms, events)
are read by pyarrow and handed to Spark in memory (histogram keys as
integers); on a cluster the executors read them. Either way every
aggregation above is Spark's.

Only the collected summary (small: one row per key) reaches the driver's
Python; `plots.py` and `render.py` draw and write it. This package is the
only code in raftka that imports pyspark; import its modules lazily.
"""

from common.errors import RaftkaError


class ReportError(RaftkaError):
    """The report cannot be built from what is in the results dir."""
