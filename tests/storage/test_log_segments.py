"""Log: rolling, retention, truncation, time lookup, flush policy."""

import pytest
from log_testing import BASE_TS, batch

from storage.batch import GZIP, build_batch, iter_batch_headers
from storage.config import LogConfig
from storage.log import Log
from storage.sim_fs import SimFileSystem

DAY_MS = 24 * 3600 * 1000


def open_log(config, fs=None, now_ms=0):
    fs = fs or SimFileSystem(seed=0)
    return Log.open("/data/t-0", config, fs=fs, now_ms=now_ms), fs


def bases(log):
    return [s.base_offset for s in log.segments]


def test_roll_on_segment_bytes_and_file_names():
    raw = batch(1, value_size=100)
    log, fs = open_log(LogConfig(segment_bytes=3 * len(raw)))
    for _ in range(7):
        log.append(raw, now_ms=0)
    assert bases(log) == [0, 3, 6]
    assert all(s.size <= 3 * len(raw) for s in log.segments)
    assert "00000000000000000003.log" in fs.listdir("/data/t-0")


def test_roll_on_segment_ms_uses_record_time_when_batches_carry_it():
    log, _ = open_log(LogConfig(segment_ms=1000))
    log.append(batch(1, ts=BASE_TS), now_ms=0)
    log.append(batch(1, ts=BASE_TS + 1000), now_ms=10 * DAY_MS)  # wall clock is irrelevant
    assert bases(log) == [0]
    log.append(batch(1, ts=BASE_TS + 1001), now_ms=0)
    assert bases(log) == [0, 2]


def test_roll_on_segment_ms_uses_the_clock_without_timestamps():
    log, _ = open_log(LogConfig(segment_ms=1000))
    log.append(batch(1, ts=-1), now_ms=5)
    log.append(batch(1, ts=-1), now_ms=1000)
    assert bases(log) == [0]
    log.append(batch(1, ts=-1), now_ms=1001)
    assert bases(log) == [0, 2]


def test_roll_when_the_index_is_full():
    # 16 bytes of index: two offset entries, one time index entry.
    log, _ = open_log(LogConfig(segment_index_bytes=16, index_interval_bytes=0))
    for i in range(6):
        log.append(batch(1, ts=BASE_TS + i), now_ms=0)
    assert bases(log) == [0, 2, 4]
    assert all(len(s.offset_index) <= 2 for s in log.segments)


def test_explicit_roll_and_empty_active_segment():
    log, _ = open_log(LogConfig())
    log.append(batch(2), now_ms=0)
    log.roll(now_ms=0)
    log.roll(now_ms=0)  # an empty active segment is not rolled again
    assert bases(log) == [0, 2]
    assert log.read(2, 100) == []


def test_retention_by_bytes_never_deletes_the_active_segment():
    raw = batch(1, value_size=100)
    config = LogConfig(segment_bytes=2 * len(raw), retention_bytes=3 * len(raw))
    log, fs = open_log(config)
    for _ in range(9):
        log.append(raw, now_ms=0)
    assert bases(log) == [0, 2, 4, 6, 8]
    assert log.delete_old_segments(now_ms=0) == 3
    assert bases(log) == [6, 8]
    assert log.log_start_offset == 6
    assert "00000000000000000000.log" not in fs.listdir("/data/t-0")
    small = LogConfig(segment_bytes=2 * len(raw), retention_bytes=0)
    log2, _ = open_log(small, fs=SimFileSystem(seed=1))
    log2.append(raw, now_ms=0)
    assert log2.delete_old_segments(now_ms=0) == 0  # only the active one


def test_retention_by_time_uses_the_newest_timestamp_of_each_segment():
    raw_size = len(batch(1))
    log, _ = open_log(LogConfig(segment_bytes=2 * raw_size, retention_ms=1000))
    for ts in (0, 5000, 100, 200, 6000):  # segments [0,5000] [100,200] [6000]
        log.append(batch(1, ts=BASE_TS + ts), now_ms=0)
    assert bases(log) == [0, 2, 4]
    # At 6100 the first segment's newest record (5000) is 1100 ms old: gone.
    # The second one (200) is older still, but it is deleted in order too.
    assert log.delete_old_segments(now_ms=BASE_TS + 6100) == 2
    assert log.log_start_offset == 4
    assert log.delete_old_segments(now_ms=BASE_TS + 10**9) == 0  # never the active segment


def test_retention_removes_segments_below_the_log_start_offset_and_old_epochs():
    raw = batch(1, value_size=100)
    log, _ = open_log(LogConfig(segment_bytes=2 * len(raw)))
    for i in range(6):
        log.append(raw, now_ms=0, leader_epoch=i)
    log.maybe_increment_log_start_offset(3)
    assert log.epoch_cache.entries == [(3, 3), (4, 4), (5, 5)]
    assert log.delete_old_segments(now_ms=0) == 1  # [0,1] is wholly below 3; [2,3] is not
    assert bases(log) == [2, 4]
    assert log.log_start_offset == 3


def test_truncate_to_removes_whole_batches_and_later_segments():
    raw_size = len(batch(2))
    log, fs = open_log(LogConfig(segment_bytes=2 * raw_size))
    for _ in range(6):
        log.append(batch(2), now_ms=0)  # batches 0-1 .. 10-11, two per segment
    assert bases(log) == [0, 4, 8]
    assert log.truncate_to(7)  # inside 6-7: that batch goes too
    assert log.log_end_offset == 6
    assert bases(log) == [0, 4]
    assert [h.base_offset for _, h in iter_batch_headers(log.read_bytes(0, 10**6))] == [0, 2, 4]
    assert not log.truncate_to(6)  # nothing at or past the end
    assert log.append(batch(1), now_ms=0) == 6
    assert log.truncate_to(4)
    assert bases(log) == [0, 4] and log.log_end_offset == 4 and log.active_segment.size == 0
    assert "00000000000000000008.log" not in fs.listdir("/data/t-0")


def test_truncate_fully_and_start_at():
    log, fs = open_log(LogConfig())
    log.append(batch(3), now_ms=0, leader_epoch=2)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1000)
    assert bases(log) == [1000]
    assert log.epoch_cache.entries == []
    assert log.append(batch(1), now_ms=0) == 1000
    fs.crash()  # the restart at 1000 was made durable
    again = Log.open("/data/t-0", LogConfig(), fs=fs, now_ms=0)
    assert again.log_start_offset == 1000 and again.log_end_offset >= 1000


def test_truncate_below_the_first_segment_restarts_the_log():
    raw = batch(1)
    log, _ = open_log(LogConfig(segment_bytes=2 * len(raw)))
    for _ in range(6):
        log.append(raw, now_ms=0)
    log.maybe_increment_log_start_offset(4)
    log.delete_old_segments(now_ms=0)
    assert bases(log)[0] == 4
    log.truncate_to(2)
    assert (log.log_start_offset, log.log_end_offset, bases(log)) == (2, 2, [2])


def test_offset_for_timestamp_at_record_granularity():
    log, _ = open_log(LogConfig(segment_bytes=250, index_interval_bytes=50))
    stamps = [10, 30, 20, 50, 40, 60, 70, 65, 90, 85, 95, 93]
    for i in range(0, len(stamps), 3):
        records = [(b"k", b"v" * 30, (), BASE_TS + ts) for ts in stamps[i : i + 3]]
        log.append(build_batch(records, compression=GZIP), now_ms=0)
    assert len(log.segments) > 1

    def oracle(target):
        hits = [(o, BASE_TS + t) for o, t in enumerate(stamps) if BASE_TS + t >= target and o >= log.log_start_offset]
        return hits[0] if hits else None

    for target in range(BASE_TS, BASE_TS + 100, 5):
        assert log.offset_for_timestamp(target) == oracle(target), target
    log.maybe_increment_log_start_offset(4)
    assert log.offset_for_timestamp(BASE_TS) == (4, BASE_TS + 40)
    assert log.offset_for_timestamp(BASE_TS + 96) is None


def test_default_flush_policy_never_fsyncs_on_append():
    log, fs = open_log(LogConfig())
    before = fs.fsync_count
    for _ in range(50):
        log.append(batch(1), now_ms=0)
    assert fs.fsync_count == before
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 50 and fs.fsync_count > before


def test_flush_messages_and_flush_ms():
    log, _ = open_log(LogConfig(flush_messages=5))
    for _ in range(4):
        log.append(batch(1), now_ms=0)
    assert log.recovery_point == 0
    log.append(batch(1), now_ms=0)
    assert log.recovery_point == 5
    timed, _ = open_log(LogConfig(flush_ms=100), fs=SimFileSystem(seed=2), now_ms=0)
    timed.append(batch(1), now_ms=50)
    assert timed.recovery_point == 0
    assert not timed.maybe_flush(now_ms=99)
    assert timed.maybe_flush(now_ms=100)
    assert timed.recovery_point == 1
    assert not timed.maybe_flush(now_ms=1000)  # nothing new to flush


@pytest.mark.parametrize("upto", [1, 3, 6])
def test_flush_up_to_an_offset_survives_a_crash(upto):
    raw = batch(1)
    log, fs = open_log(LogConfig(segment_bytes=2 * len(raw)))
    for _ in range(6):
        log.append(raw, now_ms=0)
    log.flush(upto)
    assert log.recovery_point == upto
    fs.crash()
    again = Log.open("/data/t-0", LogConfig(segment_bytes=2 * len(raw)), fs=fs, now_ms=0)
    assert again.log_end_offset >= upto
