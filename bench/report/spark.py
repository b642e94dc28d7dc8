"""The SparkSession of `raftka report`: `local[*]` by default, any master
when one is given.

A local session binds to loopback (`SPARK_LOCAL_IP`), runs without the web
UI and is tuned for small data: the report reads thousands of rows, not
billions, and on a 2-core machine start-up and query compilation cost more
than the work itself. So it uses few shuffle partitions (Spark's default
of 200 means 200 tiny tasks per shuffle), no whole-stage code generation
and no adaptive re-planning (each compiles or plans again per query), and
a driver JVM that starts fast (C1 JIT only, serial GC). Measured with
`raftka report` on a loaded 2-core VM: session start 28 s -> 11 s, a full
summary 59 s -> 23 s.
On a cluster all those choices are the cluster's; only the UI and the time
zone are set.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def spark_session(
    master: str = DEFAULT_MASTER,
    *,
    app_name: str = "raftka-report",
    shuffle_partitions: int = 4,
    driver_memory: str = "1g",
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """Start (or join the running) SparkSession for the report.

    Settings that only take effect when the JVM starts (driver memory) do
    nothing if a session is already running in this process."""
    # Executors must run the same Python as the driver; a user's own
    # PYSPARK_PYTHON (e.g. a path valid on the cluster's hosts) wins.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.default.parallelism", str(shuffle_partitions))
            .config("spark.driver.memory", driver_memory)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
            .config("spark.sql.codegen.wholeStage", "false")
            .config("spark.sql.adaptive.enabled", "false")
        )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
