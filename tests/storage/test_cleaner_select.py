"""Which log the cleaner cleans, how far, in what steps, and what stops it."""

import os

import pytest

from cleaner_testing import BASE_TS, log_records, replay
from storage.batch import build_batch
from storage.cleaner import CLEANER_OFFSET_CHECKPOINT, CompactedLog, LogCleaner
from storage.cleaner_config import CleanerConfig, CompactionConfig
from storage.config import LogConfig
from storage.log import Log
from storage.sim_fs import SimFileSystem

CONFIG = LogConfig(segment_bytes=400)


def new_fs():
    fs = SimFileSystem(seed=1)
    fs.makedirs("/data")
    return fs


def fill(log, n, keys=4, start=0, ts=BASE_TS):
    """`n` single-record batches cycling over `keys` keys."""
    for i in range(start, start + n):
        log.append(build_batch([(b"k%d" % (i % keys), b"value-%04d" % i, (), ts + i)]), ts + i)


def run(cleaner, logs, now, max_bytes=1 << 20, calls=1_000):
    passes = 0
    for _ in range(calls):
        step = cleaner.maybe_clean(logs, now, max_bytes)
        passes += step.passes_completed
        if not step.busy and not step.bytes:
            break
    return passes


def test_dirty_ratio_decides_and_the_filthiest_log_goes_first():
    fs = new_fs()
    a = Log.open("/data/a-0", CONFIG, now_ms=BASE_TS, fs=fs)
    b = Log.open("/data/b-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(a, 40, keys=40)
    fill(b, 40, keys=40)
    cleaner = LogCleaner()
    config = CompactionConfig()
    logs = [CompactedLog(a, config), CompactedLog(b, config)]
    assert run(cleaner, logs, BASE_TS + 100) == 2
    assert cleaner.log_to_clean(logs[0], BASE_TS).cleanable_ratio == 0
    # A little new dirty data in b, a lot in a: a goes first, b stays
    # under the 0.5 ratio.
    fill(a, 60, start=40, keys=40)
    fill(b, 12, start=40, keys=40)
    ratio_a = cleaner.log_to_clean(logs[0], BASE_TS).cleanable_ratio
    ratio_b = cleaner.log_to_clean(logs[1], BASE_TS).cleanable_ratio
    assert ratio_a > 0.5 > ratio_b > 0
    step = cleaner.maybe_clean(logs, BASE_TS + 200, 100)
    assert cleaner.job.log is a and step.busy
    run(cleaner, logs, BASE_TS + 200)
    assert cleaner.first_dirty_offset(a) == a.active_segment.base_offset
    assert cleaner.first_dirty_offset(b) < b.active_segment.base_offset


def test_steps_are_bounded_and_a_pass_spans_many_calls():
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 200)
    before = log_records(log)
    cleaner = LogCleaner()
    c = [CompactedLog(log, CompactionConfig())]
    calls = 0
    largest_batch = max(s.size for s in log.segments)  # one batch here is far smaller
    while True:
        step = cleaner.maybe_clean(c, BASE_TS + 1_000, 200)
        calls += 1
        assert step.bytes <= 200 + 2 * largest_batch
        if not step.busy:
            break
    assert calls > 10
    assert replay(log_records(log)) == replay(before)
    assert len(log_records(log)) < len(before) / 4


def test_high_watermark_and_min_compaction_lag_hold_cleaning_back():
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 60)
    cleaner = LogCleaner()
    hw = 20
    ltc = cleaner.log_to_clean(CompactedLog(log, CompactionConfig(), hw), BASE_TS + 100)
    assert ltc.first_uncleanable == hw
    run(cleaner, [CompactedLog(log, CompactionConfig(), hw)], BASE_TS + 100)
    assert cleaner.first_dirty_offset(log) == hw
    assert [r[0] for r in log_records(log) if r[0] >= hw] == list(range(hw, 60))

    # Records younger than min.compaction.lag.ms stay: the pass stops at
    # the first segment holding one.
    lagged = CompactionConfig(min_compaction_lag_ms=1_000)
    now = BASE_TS + 1_030
    ltc = cleaner.log_to_clean(CompactedLog(log, lagged), now)
    young = next(s for s in log.segments if s.next_offset > hw and s.largest_timestamp() > now - 1_000)
    assert ltc.first_uncleanable == young.base_offset
    run(cleaner, [CompactedLog(log, lagged)], now)
    assert [r[0] for r in log_records(log) if r[0] >= young.base_offset] == list(range(young.base_offset, 60))


def test_max_compaction_lag_forces_a_pass_below_the_ratio():
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 40, keys=40)
    cleaner = LogCleaner()
    run(cleaner, [CompactedLog(log, CompactionConfig())], BASE_TS + 50)
    fill(log, 8, start=40, ts=BASE_TS + 100)
    fill(log, 1, start=48, ts=BASE_TS + 5_000)
    log.roll(BASE_TS + 5_000)
    config = CompactionConfig(max_compaction_lag_ms=2_000)
    ltc = cleaner.log_to_clean(CompactedLog(log, config), BASE_TS + 2_000)
    assert ltc.cleanable_ratio < 0.5 and not ltc.needs_compaction_now
    assert run(cleaner, [CompactedLog(log, config)], BASE_TS + 2_000) == 0
    assert cleaner.log_to_clean(CompactedLog(log, config), BASE_TS + 3_000).needs_compaction_now
    assert run(cleaner, [CompactedLog(log, config)], BASE_TS + 3_000) == 1


def test_checkpoint_file_is_kafkas_format_and_survives_restart():
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 40)
    run(LogCleaner(), [CompactedLog(log, CompactionConfig())], BASE_TS + 100)
    end = log.active_segment.base_offset
    assert fs.read_file(os.path.join("/data", CLEANER_OFFSET_CHECKPOINT)) == f"0\n1\nt 0 {end}\n".encode()
    log.close()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    cleaner = LogCleaner()
    assert cleaner.first_dirty_offset(log) == end
    assert run(cleaner, [CompactedLog(log, CompactionConfig())], BASE_TS + 100) == 0


def test_truncation_below_the_checkpoint_pulls_it_down():
    """A follower that truncates into its clean section and takes new
    batches there must have those cleaned as dirty: their tombstones
    would otherwise lose to values below them."""
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 40)
    cleaner = LogCleaner()
    run(cleaner, [CompactedLog(log, CompactionConfig())], BASE_TS + 100)
    assert cleaner.first_dirty_offset(log) > 20
    log.truncate_to(20)
    assert cleaner.first_dirty_offset(log) == 20
    assert fs.read_file("/data/" + CLEANER_OFFSET_CHECKPOINT).endswith(b"t 0 20\n")


@pytest.mark.parametrize("change", ["truncate", "retention", "dropped"])
def test_a_pass_is_abandoned_when_the_log_changes_under_it(change):
    fs = new_fs()
    log = Log.open("/data/t-0", LogConfig(segment_bytes=400, retention_bytes=2_000), now_ms=BASE_TS, fs=fs)
    fill(log, 60)
    before = log_records(log)
    cleaner = LogCleaner()
    c = [CompactedLog(log, CompactionConfig())]
    while cleaner.job is None or cleaner.job.phase == "map":
        cleaner.maybe_clean(c, BASE_TS + 100, 50)
    assert any(n.endswith(".cleaned") for n in fs.listdir("/data/t-0"))
    if change == "truncate":
        log.truncate_to(30)
    elif change == "retention":
        assert log.delete_old_segments(BASE_TS + 100)
    cleaner.maybe_clean([] if change == "dropped" else c, BASE_TS + 100, 50)
    assert not any(n.endswith(".cleaned") for n in fs.listdir("/data/t-0"))
    records = log_records(log)
    assert set(records) <= set(before)
    # Whatever happened, a consumer still sees the history of what is left.
    assert replay(records) == replay([r for r in before if r[0] >= log.log_start_offset and r[0] < log.log_end_offset])


def test_reads_handed_out_before_a_swap_still_read_the_old_bytes():
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs)
    fill(log, 40)
    slices = log.read(0, 1 << 20)
    expected = [s.file.pread(s.size, s.position) for s in slices]
    cleaner = LogCleaner(CleanerConfig(file_delete_delay_ms=60_000))
    run(cleaner, [CompactedLog(log, CompactionConfig())], BASE_TS + 100)
    assert [s.file.pread(s.size, s.position) for s in slices] == expected
    deleted = [n for n in fs.listdir("/data/t-0") if n.endswith(".deleted")]
    assert deleted
    cleaner.maybe_clean([CompactedLog(log, CompactionConfig())], BASE_TS + 100 + 59_999)
    assert [n for n in fs.listdir("/data/t-0") if n.endswith(".deleted")] == deleted
    cleaner.maybe_clean([CompactedLog(log, CompactionConfig())], BASE_TS + 100 + 60_000)
    assert not [n for n in fs.listdir("/data/t-0") if n.endswith(".deleted")]


def test_producer_state_survives_compaction_and_a_restart_without_snapshots():
    """The newest batch of an idempotent producer stays (emptied) through
    compaction, so its sequence is known after a rebuild from the log."""
    fs = new_fs()
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs, producer_state=True)
    for seq in range(10):
        raw = build_batch([(b"same-key", b"v%d" % seq, (), BASE_TS + seq)], producer_id=8, producer_epoch=0,
                          base_sequence=seq)
        log.append(raw, BASE_TS + seq)
    fill(log, 40, keys=1, start=10)
    # Another writer supersedes every record the producer wrote.
    log.append(build_batch([(b"same-key", b"from-someone-else", (), BASE_TS + 99)]), BASE_TS + 99)
    fill(log, 20, keys=3, start=60)
    run(LogCleaner(), [CompactedLog(log, CompactionConfig())], BASE_TS + 1_000)
    log.close()
    for name in fs.listdir("/data/t-0"):
        if name.endswith(".snapshot"):
            fs.remove("/data/t-0/" + name)
    log = Log.open("/data/t-0", CONFIG, now_ms=BASE_TS, fs=fs, producer_state=True)
    entry = log.producer_state.entry(8)
    assert entry is not None and entry.last_seq == 9 and entry.last_offset == 9
    assert [r for r in log_records(log) if r[1] == b"same-key"] == [
        (50, b"same-key", b"from-someone-else", BASE_TS + 99, ())
    ]
    retry = build_batch([(b"same-key", b"v9", (), BASE_TS + 9)], producer_id=8, producer_epoch=0, base_sequence=9)
    assert log.append(retry, BASE_TS + 2_000) == 9
