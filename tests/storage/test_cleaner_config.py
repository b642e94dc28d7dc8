"""Compaction settings from Kafka's keys, the I/O pacers, and the purity of
the compaction and producer-state modules."""

import ast
import pathlib

import pytest

from common.errors import ConfigError
from storage.cleaner_config import CleanerConfig, CompactionConfig
from storage.throttler import Throttler, duty_cycle_sleep_ms


def test_compaction_config_from_topic_configs():
    c = CompactionConfig.from_properties(
        {
            "cleanup.policy": "compact,delete",
            "delete.retention.ms": "1000",
            "min.compaction.lag.ms": 5,
            "max.compaction.lag.ms": "60000",
            "min.cleanable.dirty.ratio": "0.25",
            "segment.bytes": "1024",  # not ours: ignored
        }
    )
    assert (c.compact, c.delete, c.delete_retention_ms, c.min_compaction_lag_ms) == (True, True, 1000, 5)
    assert (c.max_compaction_lag_ms, c.min_cleanable_dirty_ratio) == (60000, 0.25)
    assert CompactionConfig.from_properties({"cleanup.policy": "delete"}).compact is False
    defaults = CompactionConfig.from_properties({})
    assert (defaults.delete_retention_ms, defaults.min_cleanable_dirty_ratio) == (86_400_000, 0.5)


@pytest.mark.parametrize(
    "props,names",
    [
        ({"cleanup.policy": "shred"}, "cleanup.policy"),
        ({"delete.retention.ms": "soon"}, "delete.retention.ms"),
        ({"min.compaction.lag.ms": -1}, "min.compaction.lag.ms"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
    ],
)
def test_bad_compaction_config_names_the_key(props, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        CompactionConfig.from_properties(props)


def test_cleaner_config_from_broker_configs():
    c = CleanerConfig.from_properties(
        {"log.cleaner.io.max.bytes.per.second": "1048576", "log.cleaner.dedupe.buffer.size": 1 << 20}
    )
    assert (c.io_max_bytes_per_second, c.dedupe_buffer_size) == (1048576.0, 1 << 20)
    with pytest.raises(ConfigError, match="per.second"):
        CleanerConfig.from_properties({"log.cleaner.io.max.bytes.per.second": "0"})


def test_throttler_holds_the_average_rate():
    t = Throttler(1_000_000, now_ms=0, check_interval_ms=100)
    assert t.record(50_000, 50) == 0  # inside the first period: no verdict yet
    # 150 KB in 100 ms is 1.5 MB/s: sleep until 150 ms have passed.
    assert t.record(100_000, 100) == 50
    # The next period starts after the sleep; 100 KB in 100 ms is on rate.
    assert t.record(100_000, 250) == 0


def test_unlimited_throttler_never_sleeps():
    t = Throttler(float("inf"), now_ms=0)
    assert all(t.record(1 << 30, ms) == 0 for ms in range(0, 3_000, 300))


def test_duty_cycle():
    assert duty_cycle_sleep_ms(10, 1.0) == 0
    assert duty_cycle_sleep_ms(10, 0.5) == 10
    assert duty_cycle_sleep_ms(10, 0.2) == 40


STORAGE = pathlib.Path(__file__).resolve().parents[2] / "storage"
MODULES = [
    "producer_state",
    "producer_snapshot",
    "batch_filter",
    "offset_map",
    "cleaner",
    "cleaner_job",
    "cleaner_config",
    "segment_swap",
    "throttler",
]
# Files go through storage.fs; the pure ones do not even touch that.
PURE = {"producer_state", "batch_filter", "offset_map", "cleaner_config", "throttler"}


@pytest.mark.parametrize("module", MODULES)
def test_module_reads_no_clock_and_opens_no_socket(module):
    tree = ast.parse((STORAGE / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.add(node.module.split(".")[0])
    assert not imported & {"time", "socket", "trio", "random", "datetime"}
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls
    if module in PURE:
        assert not imported & {"os", "storage.fs", "storage.segment", "storage.log"}
