"""One local SparkSession for the whole test session (start-up is the
slow part of a Spark test), stopped at the end."""

import pytest


@pytest.fixture(scope="session")
def spark():
    from bench.report.spark import spark_session

    session = spark_session("local[2]", app_name="raftka-report-tests", shuffle_partitions=2, driver_memory="768m")
    yield session
    session.stop()
