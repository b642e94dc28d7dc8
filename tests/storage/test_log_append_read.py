"""Log: appending as leader and follower, reading slices, epochs."""

import os

import pytest
from crc32c import crc32c
from log_testing import BASE_TS, as_stored, batch

from common.errors import ConfigError
from storage.batch import iter_batch_headers, parse_header
from storage.config import LogConfig
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from storage.log import Log
from storage.sim_fs import SimFileSystem


@pytest.fixture
def log(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), LogConfig(segment_bytes=1000, index_interval_bytes=150), now_ms=0)
    yield log
    log.close()


def offsets_of(data):
    return [(h.base_offset, h.last_offset) for _, h in iter_batch_headers(data)]


def test_append_assigns_contiguous_offsets_and_stores_bytes_as_received(log):
    raws = [batch(3), batch(1), batch(5)]
    kinds = [bytes, bytearray, lambda b: memoryview(bytearray(b))]
    bases = [log.append(kind(raw), now_ms=1) for kind, raw in zip(kinds, raws)]
    assert bases == [0, 3, 4]
    assert log.log_end_offset == 9
    assert log.read_bytes(0, 10_000) == b"".join(as_stored(r, b) for r, b in zip(raws, bases))


def test_writable_buffer_is_rewritten_in_place_readonly_one_is_not(log):
    log.append(batch(2), now_ms=0)
    buf = bytearray(batch(1))
    log.append(buf, now_ms=0, leader_epoch=7)
    assert parse_header(buf).base_offset == 2
    assert parse_header(buf).partition_leader_epoch == 7
    raw = batch(1)
    log.append(raw, now_ms=0, leader_epoch=7)
    assert parse_header(raw).base_offset == 0  # bytes are immutable: untouched
    assert parse_header(log.read_bytes(3, 1)).partition_leader_epoch == 7


def test_refused_batches_leave_the_log_unchanged(log):
    log.append(batch(2), now_ms=0)
    before = (log.log_end_offset, log.read_bytes(0, 10_000), log.active_segment.size)
    flipped = bytearray(batch(2))
    flipped[-1] ^= 0xFF
    too_big = batch(1, value_size=2000)
    mismatched = bytearray(batch(3))
    mismatched[57:61] = (2).to_bytes(4, "big")  # records_count 2, last_offset_delta 2
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append(flipped, now_ms=0)
    with pytest.raises(CorruptRecordError, match="one batch"):
        log.append(batch(1) + batch(1), now_ms=0)
    with pytest.raises(CorruptRecordError):
        log.append(batch(1)[:-3], now_ms=0)
    small = Log.open(os.path.join(os.path.dirname(log.dir_path), "s-0"), LogConfig(max_message_bytes=500), now_ms=0)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        small.append(too_big, now_ms=0)
    assert small.log_end_offset == 0
    small.close()
    # The count is covered by the CRC: recompute it so only the count is wrong.
    mismatched[17:21] = crc32c(bytes(mismatched[21:])).to_bytes(4, "big")
    with pytest.raises(InvalidRecordError):
        log.append(mismatched, now_ms=0)
    assert (log.log_end_offset, log.read_bytes(0, 10_000), log.active_segment.size) == before


def test_read_returns_whole_batches_from_the_one_holding_the_offset(log):
    raws = [batch(3, value_size=40) for _ in range(12)]  # ~160 bytes each, several segments
    for raw in raws:
        log.append(raw, now_ms=0)
    size = len(raws[0])
    assert len(log.segments) > 2
    # Offset 4 is inside the batch 3..5.
    assert offsets_of(log.read_bytes(4, 2 * size)) == [(3, 5), (6, 8)]
    # Exactly on a budget boundary, and one byte short of it.
    assert offsets_of(log.read_bytes(0, 3 * size)) == [(0, 2), (3, 5), (6, 8)]
    assert offsets_of(log.read_bytes(0, 3 * size - 1)) == [(0, 2), (3, 5)]
    # Everything, across segments, in order.
    everything = log.read_bytes(0, 10**6)
    assert offsets_of(everything) == [(3 * i, 3 * i + 2) for i in range(12)]
    assert everything == b"".join(as_stored(r, 3 * i) for i, r in enumerate(raws))
    # The first batch comes even when it alone exceeds max_bytes (Kafka's rule).
    assert offsets_of(log.read_bytes(7, 1)) == [(6, 8)]
    assert offsets_of(log.read_bytes(7, 0)) == [(6, 8)]


def test_read_stops_below_max_offset(log):
    for _ in range(6):
        log.append(batch(2), now_ms=0)  # batches 0-1, 2-3, ..., 10-11
    assert offsets_of(log.read_bytes(0, 10_000, max_offset=6)) == [(0, 1), (2, 3), (4, 5)]
    # A high watermark inside a batch excludes that batch.
    assert offsets_of(log.read_bytes(0, 10_000, max_offset=5)) == [(0, 1), (2, 3)]
    assert log.read(6, 10_000, max_offset=6) == []
    assert log.read(5, 1, max_offset=5) == []


def test_read_out_of_range(log):
    log.append(batch(2), now_ms=0)
    assert log.read(2, 100) == []  # at the log end offset: nothing yet
    with pytest.raises(OffsetOutOfRangeError) as e:
        log.read(3, 100)
    assert (e.value.log_start_offset, e.value.log_end_offset) == (0, 2)
    log.maybe_increment_log_start_offset(1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    # Starting mid-batch at the log start returns the whole batch.
    assert offsets_of(log.read_bytes(1, 100)) == [(0, 1)]
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(3)


def test_slices_go_through_sendfile(log, tmp_path):
    raws = [batch(2, value_size=100) for _ in range(10)]
    for raw in raws:
        log.append(raw, now_ms=0)
    slices = log.read(0, 10**6)
    assert len(slices) > 1  # spans segments
    out_path = tmp_path / "out"
    with open(out_path, "wb") as out:
        for s in slices:
            sent = 0
            while sent < s.size:
                sent += os.sendfile(out.fileno(), s.file.fileno(), s.position + sent, s.size - sent)
    assert out_path.read_bytes() == log.read_bytes(0, 10**6)


def test_follower_append_keeps_offsets(log):
    chunk = batch(2, base_offset=0, epoch=1) + batch(3, base_offset=2, epoch=1) + batch(1, base_offset=5, epoch=2)
    assert log.append_as_follower(chunk) == 0
    assert log.log_end_offset == 6
    assert log.read_bytes(0, 10**6) == chunk
    assert log.epoch_cache.entries == [(1, 0), (2, 5)]
    with pytest.raises(UnexpectedAppendOffsetError, match="truncate"):
        log.append_as_follower(batch(1, base_offset=5, epoch=2))
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(batch(1, base_offset=6)[:-1])
    # Gaps are allowed (a compacted leader log); the LEO jumps.
    log.append_as_follower(batch(1, base_offset=10, epoch=2))
    assert log.log_end_offset == 11
    assert offsets_of(log.read_bytes(6, 10**6)) == [(10, 10)]
    assert offsets_of(log.read_bytes(8, 10**6)) == [(10, 10)]


def test_follower_offsets_out_of_order_inside_one_chunk_are_refused(log):
    chunk = batch(2, base_offset=0) + batch(1, base_offset=1)
    with pytest.raises(UnexpectedAppendOffsetError):
        log.append_as_follower(chunk)
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_leader_epochs_are_tracked_and_answer_offsets_for_leader_epoch(log):
    log.append(batch(2), now_ms=0, leader_epoch=1)
    log.append(batch(2), now_ms=0, leader_epoch=1)
    log.append(batch(1), now_ms=0, leader_epoch=3)
    assert log.epoch_cache.entries == [(1, 0), (3, 4)]
    assert log.latest_epoch == 3
    assert log.end_offset_for_epoch(1) == (1, 4)
    assert log.end_offset_for_epoch(2) == (1, 4)
    assert log.end_offset_for_epoch(3) == (3, 5)
    log.truncate_to(4)
    assert log.epoch_cache.entries == [(1, 0)]
    assert log.end_offset_for_epoch(1) == (1, 4)


def test_open_needs_a_topic_partition_dir_name_or_no_checkpoint_files(tmp_path):
    with pytest.raises(ConfigError, match="<topic>-<partition>"):
        Log.open(str(tmp_path / "notapartition"), now_ms=0)
    log = Log.open(str(tmp_path / "notapartition"), now_ms=0, checkpoint_files=False, recovery_point=0)
    log.append(batch(1), now_ms=0)
    log.close()
    assert not (tmp_path / "recovery-point-offset-checkpoint").exists()


def test_close_and_reopen_keeps_everything_and_writes_kafka_checkpoints(tmp_path):
    config = LogConfig(segment_bytes=600, index_interval_bytes=100)
    log = Log.open(str(tmp_path / "orders-3"), config, now_ms=0)
    for i in range(20):
        log.append(batch(2, ts=BASE_TS + i), now_ms=i, leader_epoch=i // 7)
    log.maybe_increment_log_start_offset(5)
    before = log.read_bytes(5, 10**6)
    log.close()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == "0\n1\norders 3 40\n"
    assert (tmp_path / "log-start-offset-checkpoint").read_text() == "0\n1\norders 3 5\n"
    assert (tmp_path / "orders-3" / "leader-epoch-checkpoint").read_text() == "0\n3\n0 5\n1 14\n2 28\n"
    names = sorted(os.listdir(tmp_path / "orders-3"))
    assert "00000000000000000000.log" in names and "00000000000000000000.timeindex" in names
    again = Log.open(str(tmp_path / "orders-3"), config, now_ms=100)
    assert (again.log_start_offset, again.log_end_offset, again.recovery_point) == (5, 40, 40)
    assert again.read_bytes(5, 10**6) == before
    assert again.epoch_cache.entries == [(0, 5), (1, 14), (2, 28)]
    assert again.append(batch(1), now_ms=200) == 40
    again.close()


def test_index_rebuilt_by_recovery_equals_the_one_built_by_appending():
    fs = SimFileSystem(seed=0)
    config = LogConfig(segment_bytes=2000, index_interval_bytes=120, segment_index_bytes=120)
    log = Log.open("/d/t-0", config, fs=fs, now_ms=0)
    for i in range(40):
        log.append(batch(1 + i % 4, value_size=10 + 7 * (i % 5), ts=BASE_TS + (i * 37) % 11), now_ms=0)
    built = [
        (list(s.offset_index.offsets), list(s.offset_index.positions), list(s.time_index.timestamps),
         list(s.time_index.offsets), s.max_timestamp, s.next_offset)
        for s in log.segments
    ]
    log.flush()
    fs.crash()
    again = Log.open("/d/t-0", config, fs=fs, now_ms=0, recovery_point=0)  # read everything
    rebuilt = [
        (list(s.offset_index.offsets), list(s.offset_index.positions), list(s.time_index.timestamps),
         list(s.time_index.offsets), s.max_timestamp, s.next_offset)
        for s in again.segments
    ]
    # The closed segments' last time entry was added at roll; compare the rest.
    assert [b[:2] + b[4:] for b in built] == [r[:2] + r[4:] for r in rebuilt]
    assert all(r[2] == b[2][: len(r[2])] for b, r in zip(built, rebuilt))


def test_a_follower_copying_batch_by_batch_builds_the_leaders_segments_and_indexes():
    """The follower's one-batch appends (its fast path) roll and index as
    the leader's appends do: by size, by a full index, by record time."""
    config = LogConfig(segment_bytes=2000, index_interval_bytes=120, segment_index_bytes=120, segment_ms=50)
    leader = Log.open("/d/t-0", config, fs=SimFileSystem(seed=0), now_ms=0)
    follower = Log.open("/d/t-0", config, fs=SimFileSystem(seed=1), now_ms=0)
    for i in range(60):
        leader.append(batch(1 + i % 4, value_size=10 + 7 * (i % 5), ts=BASE_TS + i * 3 + (i * 37) % 11),
                      now_ms=0, leader_epoch=1 + i // 25)
    for segment in leader.segments:
        for _, header in segment.scan_headers(0):
            base = header.base_offset
            follower.append_as_follower(leader.read_bytes(base, header.size_in_bytes), now_ms=0)

    def shape(log):
        return [(s.base_offset, s.size, list(s.offset_index.offsets), list(s.offset_index.positions),
                 list(s.time_index.timestamps), list(s.time_index.offsets), s.max_timestamp, s.next_offset)
                for s in log.segments]

    assert len(leader.segments) > 3
    assert shape(follower) == shape(leader)
    assert follower.read_bytes(0, 10**6) == leader.read_bytes(0, 10**6)
    assert follower.epoch_cache.entries == leader.epoch_cache.entries and len(leader.epoch_cache.entries) == 3


def test_a_reader_that_keeps_up_reads_no_batch_header(monkeypatch):
    """A follower's fetch offset is mostly the start of one of the last
    batches appended: the segment knows where those start, so reading from
    there to the end costs no header reads; an older offset between index
    entries is still found by scanning headers."""
    from storage import sim_fs

    preads = []
    real_pread = sim_fs.SimFile.pread
    monkeypatch.setattr(sim_fs.SimFile, "pread", lambda f, size, position: preads.append(position)
                        or real_pread(f, size, position))
    log = Log.open("/d/t-0", LogConfig(index_interval_bytes=1 << 20), fs=SimFileSystem(seed=1), now_ms=0)
    raws = [batch(2) for _ in range(30)]
    for raw in raws:
        log.append(raw, now_ms=1)
    stored = [as_stored(raw, 2 * i) for i, raw in enumerate(raws)]
    slices = log.read(56, 1 << 20)
    assert preads == []
    assert b"".join(s.file.pread(s.size, s.position) for s in slices) == b"".join(stored[28:])
    preads.clear()
    assert log.read_bytes(10, 1 << 20) == b"".join(stored[5:])
    assert preads, "offset 10 is neither indexed nor recent: found by a header scan"
    log.close()
