"""A power cut at every point of a compaction pass, swap included.

The pass runs on the simulated disk behind a wrapper that cuts the power
before its N-th write, rename, remove or fsync; for every N the disk
crashes (losing what was not synced, optionally tearing the last writes),
the log is reopened, and then:

- it holds a subset of the records it held before the pass, at their
  offsets, and every record the uncrashed pass keeps: a crash can leave
  a pass half done, never lose a record the pass would keep;
- a consumer replaying it from the start gets the same table as before;
- no `.cleaned`, `.swap` or `.deleted` file is left;
- cleaning again converges on exactly what the uncrashed pass produced.
"""

import pytest

from cleaner_testing import BASE_TS, log_records, replay
from storage.batch import build_batch
from storage.cleaner import CompactedLog, LogCleaner
from storage.cleaner_config import CleanerConfig, CompactionConfig
from storage.config import LogConfig
from storage.log import Log
from storage.sim_fs import SimFileSystem

DIR = "/data/t-0"
CONFIG = LogConfig(segment_bytes=420, index_interval_bytes=120)
COMPACTION = CompactionConfig(delete_retention_ms=0, min_cleanable_dirty_ratio=0.0)
NOW = BASE_TS + 10_000


class PowerCut(BaseException):
    """Raised in place of the N-th mutating file operation."""


class CuttingFile:
    def __init__(self, fs, f):
        self._fs, self._f = fs, f

    path = property(lambda self: self._f.path)
    size = property(lambda self: self._f.size)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def _mutate(self, name, *args):
        self._fs.tick()
        return getattr(self._f, name)(*args)

    def append(self, data):
        return self._mutate("append", data)

    def appendv(self, parts):
        return self._mutate("appendv", parts)

    def pwrite(self, data, position):
        return self._mutate("pwrite", data, position)

    def truncate(self, size):
        return self._mutate("truncate", size)

    def fsync(self):
        return self._mutate("fsync")


class CuttingFs:
    """`storage.fs.FileSystem` over a SimFileSystem, cut at op `cut_at`."""

    def __init__(self, sim):
        self.sim = sim
        self.ops = 0
        self.cut_at = None

    def tick(self):
        self.ops += 1
        if self.cut_at is not None and self.ops >= self.cut_at:
            raise PowerCut

    def open(self, path):
        if not self.sim.exists(path):
            self.tick()
        return CuttingFile(self, self.sim.open(path))

    def _mutate(self, name, *args):
        self.tick()
        return getattr(self.sim, name)(*args)

    def rename(self, src, dst):
        return self._mutate("rename", src, dst)

    def remove(self, path):
        return self._mutate("remove", path)

    def fsync_dir(self, path):
        return self._mutate("fsync_dir", path)

    def makedirs(self, path):
        return self._mutate("makedirs", path)

    def exists(self, path):
        return self.sim.exists(path)

    def listdir(self, path):
        return self.sim.listdir(path)

    def read_file(self, path):
        return self.sim.read_file(path)


def build(sim_seed=3):
    """A flushed log of keyed records over several segments, closed."""
    sim = SimFileSystem(seed=sim_seed)
    sim.makedirs("/data")
    log = Log.open(DIR, CONFIG, now_ms=BASE_TS, fs=sim)
    for i in range(40):
        key = b"key-%d" % (i * 7 % 6)
        value = None if i % 9 == 4 else b"value-%03d" % i
        extra = [(b"key-%d" % (i % 3), b"x" * (i % 5), (), BASE_TS + i)] if i % 4 == 0 else []
        log.append(build_batch([(key, value, (), BASE_TS + i)] + extra, compression=i % 3), BASE_TS + i)
    log.close()
    return sim


def clean_fully(log, config=CleanerConfig(file_delete_delay_ms=0)):
    cleaner = LogCleaner(config)
    for _ in range(1_000):
        step = cleaner.maybe_clean([CompactedLog(log, COMPACTION)], NOW, 150)
        if not step.busy and not step.bytes:
            break
    cleaner.close()


def reference():
    sim = build()
    log = Log.open(DIR, CONFIG, now_ms=NOW, fs=sim)
    before = log_records(log)
    clean_fully(log)
    after = log_records(log)
    log.close()
    return before, after


def ops_of_a_pass():
    fs = CuttingFs(build())
    log = Log.open(DIR, CONFIG, now_ms=NOW, fs=fs)
    start = fs.ops
    clean_fully(log)
    return fs.ops - start


BEFORE, AFTER = reference()
TOTAL_OPS = ops_of_a_pass()


def test_the_reference_pass_compacts():
    assert len(AFTER) < len(BEFORE) / 2
    assert replay(AFTER) == replay(BEFORE)
    assert TOTAL_OPS > 20


@pytest.mark.parametrize("tear", [False, True])
def test_power_cut_at_every_step_of_a_pass(tear):
    for cut in range(1, TOTAL_OPS + 1):
        sim = build(sim_seed=cut)
        fs = CuttingFs(sim)
        log = Log.open(DIR, CONFIG, now_ms=NOW, fs=fs)
        fs.cut_at = fs.ops + cut
        try:
            clean_fully(log)
            raise AssertionError(f"no power cut at op {cut} of {TOTAL_OPS}")
        except PowerCut:
            pass
        sim.crash(tear=tear)

        recovered = Log.open(DIR, CONFIG, now_ms=NOW, fs=sim)
        records = log_records(recovered)
        where = f"power cut at op {cut} of {TOTAL_OPS}"
        assert set(records) <= set(BEFORE), where
        assert set(AFTER) <= set(records), where
        assert [r[0] for r in records] == sorted({r[0] for r in records}), where
        assert replay(records) == replay(BEFORE), where
        assert recovered.log_end_offset == BEFORE[-1][0] + 1, where
        leftovers = [n for n in sim.listdir(DIR) if n.endswith((".cleaned", ".swap", ".deleted"))]
        assert leftovers == [], where

        clean_fully(recovered)
        assert log_records(recovered) == AFTER, where
        recovered.close()


def append_unflushed(log):
    """Batches past the recovery point, over several segments: the pass
    must flush what it compacts against before it swaps."""
    for i in range(40, 70):
        key = b"key-%d" % (i % 6)
        log.append(build_batch([(key, None if i % 11 == 0 else b"late-%03d" % i, (), BASE_TS + i)]), BASE_TS + i)


@pytest.mark.parametrize("tear", [False, True])
def test_power_cut_during_a_pass_over_unflushed_batches(tear):
    sim = build()
    log = Log.open(DIR, CONFIG, now_ms=NOW, fs=sim)
    append_unflushed(log)
    before = log_records(log)
    sim = build()
    counting = CuttingFs(sim)
    log = Log.open(DIR, CONFIG, now_ms=NOW, fs=counting)
    append_unflushed(log)
    ops = counting.ops
    clean_fully(log)
    total = counting.ops - ops
    ends = set()
    for cut in range(1, total + 1, 3):
        sim = build(sim_seed=cut)
        fs = CuttingFs(sim)
        log = Log.open(DIR, CONFIG, now_ms=NOW, fs=fs)
        append_unflushed(log)
        fs.cut_at = fs.ops + cut
        with pytest.raises(PowerCut):
            clean_fully(log)
        sim.crash(tear=tear)

        recovered = Log.open(DIR, CONFIG, now_ms=NOW, fs=sim)
        records = log_records(recovered)
        end = recovered.log_end_offset
        where = f"power cut at op {cut} of {total}, log end offset {end}"
        assert set(records) <= set(before), where
        # Whatever tail the crash took, what is left reads as the
        # uncompacted prefix up to the same offset: nothing was removed
        # for a newer record that did not survive.
        assert replay(records) == replay([r for r in before if r[0] < end]), where
        assert end >= BEFORE[-1][0] + 1, where  # the flushed part stays
        ends.add((end, len(records) < len([r for r in before if r[0] < end])))
        recovered.close()
    # Both fates were met: tails lost to the crash, and compaction that
    # reached the disk.
    assert min(e for e, _ in ends) < before[-1][0] + 1
    assert any(compacted for _, compacted in ends)
