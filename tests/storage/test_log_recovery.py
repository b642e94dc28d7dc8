"""Recovery on open from deliberately damaged files (real file system)."""

import logging
import os
import struct

import pytest
from crc32c import crc32c
from log_testing import BASE_TS, as_stored, batch

from storage.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, CRC_START_OFFSET, HEADER_SIZE, iter_batch_headers, parse_header
from storage.config import LogConfig
from storage.errors import CorruptRecordError, UnsupportedCompressionError
from storage.log import Log
from storage.sim_fs import SimFileSystem

CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=100)
RAW = [batch(2, value_size=30 + i % 5, ts=BASE_TS + i) for i in range(30)]
STORED = [as_stored(r, 2 * i) for i, r in enumerate(RAW)]


def write_log(path, clean=True):
    log = Log.open(str(path), CONFIG, now_ms=0)
    for raw in RAW:
        log.append(raw, now_ms=0)
    if clean:
        log.close()
    else:
        # A killed process: the data is in the page cache, no checkpoint.
        log.flush()
        for s in log.segments:
            s.close()
    return log


def seg_files(path, suffix=".log"):
    return sorted(p for p in os.listdir(path) if p.endswith(suffix))


def read_all(path):
    log = Log.open(str(path), CONFIG, now_ms=0)
    try:
        return log, log.read_bytes(log.log_start_offset, 10**7)
    finally:
        log.close()


@pytest.fixture
def logdir(tmp_path):
    return tmp_path / "t-0"


def stored_prefix(n_batches):
    return b"".join(STORED[:n_batches])


def test_torn_tail_is_cut_at_the_last_whole_batch(logdir, caplog):
    write_log(logdir)
    last = logdir / seg_files(logdir)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 7)
    with caplog.at_level(logging.WARNING):
        log, data = read_all(logdir)
    assert data == stored_prefix(len(RAW) - 1)
    assert log.log_end_offset == 2 * (len(RAW) - 1)
    assert last.stat().st_size == size - len(STORED[-1])
    assert f"{last}: " in caplog.text and "torn tail" in caplog.text and "position" in caplog.text
    again = Log.open(str(logdir), CONFIG, now_ms=0)
    assert again.append(RAW[-1], now_ms=0) == 2 * (len(RAW) - 1)
    assert again.read_bytes(0, 10**7) == stored_prefix(len(RAW))
    again.close()


def test_flipped_byte_mid_segment_cuts_there_and_deletes_later_segments(logdir, caplog):
    write_log(logdir, clean=False)  # no recovery point: everything is re-read
    names = seg_files(logdir)
    assert len(names) >= 3
    victim = logdir / names[1]
    data = bytearray(victim.read_bytes())
    positions = [p for p, _ in iter_batch_headers(bytes(data))]
    bad_position = positions[2]
    data[bad_position + 70] ^= 0x01  # inside the third batch's records
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        log, read = read_all(logdir)
    first_segment_batches = len(list(iter_batch_headers((logdir / names[0]).read_bytes())))
    survivors = first_segment_batches + 2
    assert read == stored_prefix(survivors)
    assert log.log_end_offset == 2 * survivors
    assert seg_files(logdir) == names[:2]
    assert f"at position {bad_position}" in caplog.text and "CRC" in caplog.text
    assert "deleting the" in caplog.text


@pytest.mark.parametrize("damage,reason", [
    # The first record's length varint says 63 bytes: past the record's end.
    ((HEADER_SIZE, 0x7E), "record 0 of 2"),
    # Compression codec id 5, which Kafka does not define.
    ((ATTRIBUTES_OFFSET + 1, 0x05), "codec"),
])
def test_a_crc_valid_batch_whose_records_do_not_parse_is_cut_like_a_torn_tail(logdir, caplog, damage, reason):
    """A disk fault (or an older version's append) that left a batch whose
    CRC holds but whose records do not parse: recovery cuts the log there."""
    write_log(logdir, clean=False)
    names = seg_files(logdir)
    victim = logdir / names[1]
    data = bytearray(victim.read_bytes())
    positions = [p for p, _ in iter_batch_headers(bytes(data))]
    bad_position = positions[2]
    at, value = damage
    data[bad_position + at] = value
    end = bad_position + parse_header(data, bad_position).size_in_bytes
    struct.pack_into(">I", data, bad_position + CRC_OFFSET,
                     crc32c(memoryview(data)[bad_position + CRC_START_OFFSET : end]))
    assert parse_header(data, bad_position).crc == crc32c(memoryview(data)[bad_position + CRC_START_OFFSET : end])
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        log, read = read_all(logdir)
    first_segment_batches = len(list(iter_batch_headers((logdir / names[0]).read_bytes())))
    survivors = first_segment_batches + 2
    assert read == stored_prefix(survivors)
    assert log.log_end_offset == 2 * survivors
    assert seg_files(logdir) == names[:2]
    assert f"at position {bad_position}" in caplog.text and reason in caplog.text
    assert "truncating the segment" in caplog.text


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_deleted_index_is_rebuilt(logdir, caplog, suffix):
    write_log(logdir)
    first = logdir / seg_files(logdir, suffix)[0]
    original = first.read_bytes()
    assert original
    first.unlink()
    with caplog.at_level(logging.WARNING):
        log, data = read_all(logdir)
    assert data == stored_prefix(len(RAW))
    assert "rebuilding" in caplog.text and "missing" in caplog.text
    # The rebuilt file is what appending wrote; the time index also gets
    # the entry added when the segment rolled.
    rebuilt = first.read_bytes()
    assert rebuilt.startswith(original[: len(rebuilt)]) or rebuilt == original
    assert len(rebuilt) >= len(original) - 12


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 64, b"\x00\x00\x00\x01\x00\x00\x00\x05" + b"\x00\x00\x00\x01\x00\x00\x00\x06", b"abc"],
)
def test_garbage_index_is_rebuilt_and_reads_are_right(logdir, garbage, caplog):
    write_log(logdir)
    first = logdir / seg_files(logdir, ".index")[0]
    original = first.read_bytes()
    first.write_bytes(garbage)
    with caplog.at_level(logging.WARNING):
        log = Log.open(str(logdir), CONFIG, now_ms=0)
    assert "rebuilding" in caplog.text
    for offset in range(0, 2 * len(RAW), 3):
        got = log.read_bytes(offset, 1)
        assert got == STORED[offset // 2]
    log.close()
    assert first.read_bytes() == original


def test_plausible_but_wrong_index_is_caught_by_its_last_entry(logdir):
    write_log(logdir)
    first = logdir / seg_files(logdir, ".index")[0]
    data = bytearray(first.read_bytes())
    assert len(data) >= 16
    # Shift the last entry's position by a few bytes: still increasing.
    last_position = int.from_bytes(data[-4:], "big")
    data[-4:] = (last_position + 3).to_bytes(4, "big")
    first.write_bytes(bytes(data))
    _, read = read_all(logdir)
    assert read == stored_prefix(len(RAW))


def test_a_segment_of_garbage_never_raises(logdir):
    write_log(logdir, clean=False)
    names = seg_files(logdir)
    (logdir / names[0]).write_bytes(os.urandom(3000))
    log, data = read_all(logdir)
    assert data == b""
    assert log.log_end_offset == 0
    assert seg_files(logdir) == names[:1]


def test_leftover_files_are_removed_and_others_kept(logdir):
    write_log(logdir)
    (logdir / "leader-epoch-checkpoint.tmp").write_text("0\n")
    (logdir / "00000000000000099999.index").write_bytes(b"")
    (logdir / "00000000000000000000.log.deleted").write_bytes(b"x")
    (logdir / "00000000000000000500-0000000003.checkpoint").write_bytes(b"raft snapshot")
    read_all(logdir)
    names = os.listdir(logdir)
    assert "leader-epoch-checkpoint.tmp" not in names
    assert "00000000000000099999.index" not in names
    assert "00000000000000000000.log.deleted" not in names
    assert "00000000000000000500-0000000003.checkpoint" in names


def test_corrupt_checkpoints_are_survived(logdir, caplog):
    log = Log.open(str(logdir), CONFIG, now_ms=0)
    for i, raw in enumerate(RAW):
        log.append(raw, now_ms=0, leader_epoch=i // 10)
    log.close()
    (logdir / "leader-epoch-checkpoint").write_text("garbage")
    (logdir.parent / "recovery-point-offset-checkpoint").write_text("0\n7\n")
    with caplog.at_level(logging.WARNING):
        again = Log.open(str(logdir), CONFIG, now_ms=0)
    assert again.epoch_cache.entries == [(0, 0), (1, 20), (2, 40)]
    assert again.read_bytes(0, 10**7) == b"".join(as_stored(r, 2 * i, i // 10) for i, r in enumerate(RAW))
    assert "rebuilding the leader epoch cache" in caplog.text
    again.close()
    assert (logdir / "leader-epoch-checkpoint").read_text() == "0\n3\n0 0\n1 20\n2 40\n"


def test_lost_tail_of_an_older_segment_drops_the_newer_ones():
    """A crash can keep a newer segment's data while an older segment lost
    its unsynced tail; the log must not keep a hole."""
    fs = SimFileSystem(seed=0)
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    log.append(RAW[0], now_ms=0)
    log.flush()
    log.append(RAW[1], now_ms=0)  # never synced
    log.roll(now_ms=0)
    log.append(RAW[2], now_ms=0)
    log.active_segment.log.fsync()  # the newer segment reached the disk
    fs.fsync_dir("/d/t-0")
    fs.crash()
    again = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    assert again.log_end_offset == 2
    assert again.read_bytes(0, 10**6) == STORED[0]
    assert [s.base_offset for s in again.segments] == [0]


def test_a_new_log_costs_no_fsync_and_its_first_flush_makes_it_durable():
    """Creating a partition fsyncs nothing (thousands are created at once);
    a crash before the first flush loses only the empty log; after the
    flush, its batches survive a crash that drops every unsynced write."""
    fs = SimFileSystem(seed=5)
    fs.makedirs("/data")
    log = Log.open("/data/t-0", CONFIG, now_ms=0, fs=fs)
    assert fs.fsync_count == 0
    fs.crash()
    log = Log.open("/data/t-0", CONFIG, now_ms=0, fs=fs)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    for raw in RAW[:5]:
        log.append(raw, now_ms=0)
    log.flush()
    fs.crash()
    log = Log.open("/data/t-0", CONFIG, now_ms=0, fs=fs)
    assert log.read_bytes(0, 10**7) == stored_prefix(5)


def plant_unparsable(logdir, segment_index=1, batch_index=2, damage=(HEADER_SIZE, 0x7E)):
    """Edit a batch of a closed log so its records do not parse while its CRC
    holds (what an older version could have appended); return its segment
    file, position and base offset."""
    victim = logdir / seg_files(logdir)[segment_index]
    data = bytearray(victim.read_bytes())
    position = [p for p, _ in iter_batch_headers(bytes(data))][batch_index]
    at, value = damage
    data[position + at] = value
    header = parse_header(data, position)
    end = position + header.size_in_bytes
    struct.pack_into(">I", data, position + CRC_OFFSET, crc32c(memoryview(data)[position + CRC_START_OFFSET : end]))
    victim.write_bytes(bytes(data))
    return victim, position, header.base_offset


@pytest.mark.parametrize("damage,reason", [
    ((HEADER_SIZE, 0x7E), "record 0 of 2"),  # the first record's length runs past it
    ((ATTRIBUTES_OFFSET + 1, 0x05), "codec"),  # a codec id Kafka does not define
])
def test_a_trusted_segment_is_checked_when_first_read_and_a_bad_batch_fails_the_read_that_reaches_it(
        logdir, damage, reason):
    """Below the recovery point nothing is re-read on open; the first read
    that reaches a batch whose records do not parse serves the good batches
    before it, and a read that starts at it raises, naming the file, the
    position and the reason. The rest of the log still reads."""
    write_log(logdir)  # clean: the recovery point is the end of the log
    victim, position, bad_offset = plant_unparsable(logdir, damage=damage)
    log = Log.open(str(logdir), CONFIG, now_ms=0)
    try:
        assert log.log_end_offset == 2 * len(RAW)  # open trusted it: nothing cut
        served = log.read_bytes(0, 10**7)
        assert served == stored_prefix(bad_offset // 2)
        for _ in range(2):  # every time, not only the first
            with pytest.raises((CorruptRecordError, UnsupportedCompressionError)) as raised:
                log.read(bad_offset, 10**7)
            message = str(raised.value)
            assert str(victim) in message and f"position {position}" in message and reason in message
        # Past the bad batch, the log reads (and checks) as before.
        after = bad_offset + 2
        assert log.read_bytes(after, 10**7) == b"".join(STORED[after // 2 :])
        # Batch i holds timestamps i and i+1: the bad batch's are below this.
        later = BASE_TS + bad_offset // 2 + 2
        assert log.offset_for_timestamp(later) == (bad_offset + 3, later)
        with pytest.raises((CorruptRecordError, UnsupportedCompressionError)):
            log.offset_for_timestamp(BASE_TS + bad_offset // 2 + 1)  # only in the bad batch
    finally:
        log.close()


def test_a_trusted_segment_is_checked_once():
    """Once checked, a range is not read again for checking: the hot path
    of a steady reader is one truthiness test per slice."""
    fs = SimFileSystem()
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    for raw in RAW:
        log.append(raw, now_ms=0)
    assert all(not s.unchecked for s in log.segments)  # appended here: validated before
    log.close()
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    assert all(s.unchecked == [[0, s.size]] for s in log.segments)
    middle = log.segments[1]
    offsets = [h.base_offset for _, h in middle.scan_headers(0)]
    # A reader in the middle of the segment checks only what it reads.
    log.read(offsets[2], 1)
    start = middle.find_batch(offsets[2])[0]
    end = middle.find_batch(offsets[3])[0]
    assert middle.unchecked == [[0, start], [end, middle.size]]
    assert log.read_bytes(0, 10**7) == stored_prefix(len(RAW))
    assert all(not s.unchecked for s in log.segments)
    # Truncation keeps a loaded segment's unchecked ranges within the file.
    log.close()
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    log.truncate_to(offsets[3])
    assert log.segments[-1].unchecked == [[0, end]]
    log.close()


def test_a_crash_does_not_bring_back_an_epoch_entry_the_load_cut_below_surviving_batches():
    """An epoch entry at the log end offset (the log start moved there) is
    cut on open but stays on file until the next append rewrites the file.
    A crash that keeps that append's unflushed batch must not bring the
    entry back and credit the batch to its epoch."""
    fs = SimFileSystem(seed=0)
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    log.append(RAW[0], now_ms=0, leader_epoch=0)  # offsets 0-1, epoch 0
    log.append(RAW[1], now_ms=0)  # offsets 2-3, no leader epoch
    log.maybe_increment_log_start_offset(4)  # the file now holds (0, 4)
    log.close()
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    assert log.epoch_cache.entries == []
    log.append(RAW[2], now_ms=0)  # offsets 4-5, no leader epoch: never flushed
    log.active_segment.log.fsync()  # but the disk wrote the batch back before the cut
    fs.crash(lose_dir_ops=True)  # the epoch file's rewrite (a rename) is lost
    again = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    assert again.log_end_offset == 6
    assert again.epoch_cache.entries == []
    assert again.end_offset_for_epoch(0) == (-1, -1)
    again.close()


def test_an_epoch_entry_moved_up_to_the_log_start_survives_a_crash_that_keeps_later_batches():
    """The other side of the rule above: an entry the log start moved up
    (durable at once) stays, whatever later batches a crash keeps. Its
    epoch's batches lie below the log start, so recovery could not assign
    it again from the batches: dropping the entries past the recovery point
    at open would lose it."""
    fs = SimFileSystem(seed=0)
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    log.append(RAW[0], now_ms=0, leader_epoch=0)  # offsets 0-1, epoch 0
    log.close()
    log = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    log.maybe_increment_log_start_offset(2)
    assert log.epoch_cache.entries == [(0, 2)]
    log.append(RAW[1], now_ms=0)  # offsets 2-3, no leader epoch: never flushed
    log.active_segment.log.fsync()  # but the disk wrote the batch back before the cut
    fs.crash(lose_dir_ops=True)
    again = Log.open("/d/t-0", CONFIG, fs=fs, now_ms=0)
    assert again.log_end_offset == 4
    assert again.epoch_cache.entries == [(0, 2)]
    assert again.end_offset_for_epoch(0) == (0, 4)
    again.close()
