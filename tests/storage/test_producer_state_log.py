"""Producer state inside the Log: checks on append, snapshots, rebuild,
truncation, restart and crash, on the simulated disk."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.batch import build_batch, iter_batch_headers
from storage.config import LogConfig
from storage.log import Log
from storage.producer_snapshot import (
    SNAPSHOT_SUFFIX,
    CorruptSnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from storage.producer_state import ProduceCheck, ProducerState, ProducerStateError
from storage.sim_fs import SimFileSystem

DIR = "/data/t-0"
TS = 1_700_000_000_000


def idem_batch(pid, epoch, seq, count=1, ts=TS):
    return build_batch(
        [(b"k%d" % i, b"v" * 20, (), ts + i) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def open_log(fs, segment_bytes=400, **kwargs):
    return Log.open(DIR, LogConfig(segment_bytes=segment_bytes), now_ms=0, fs=fs, producer_state=True, **kwargs)


def new_fs():
    fs = SimFileSystem(seed=7)
    fs.makedirs("/data")
    return fs


def rebuilt_from_log(log) -> ProducerState:
    """The oracle: a fresh state fed every batch header the log holds."""
    state = ProducerState()
    data = log.read_bytes(log.log_start_offset, 1 << 30) if log.log_end_offset > log.log_start_offset else b""
    for _pos, header in iter_batch_headers(data):
        state.update(header)
    return state


def snapshot_files(fs):
    return sorted(n for n in fs.listdir(DIR) if n.endswith(SNAPSHOT_SUFFIX))


# --- append ---


def test_retried_batch_gets_its_original_offset_and_is_not_written_again():
    fs = new_fs()
    log = open_log(fs)
    assert log.append(idem_batch(9, 0, 0, 3), 1) == 0
    assert log.append(idem_batch(9, 0, 3, 2), 1) == 3
    data = log.read_bytes(0, 1 << 20)
    assert log.append(idem_batch(9, 0, 0, 3), 1) == 0
    assert log.append(idem_batch(9, 0, 3, 2), 1) == 3
    assert log.log_end_offset == 5
    assert log.read_bytes(0, 1 << 20) == data


@pytest.mark.parametrize(
    "batch,code",
    [(idem_batch(9, 0, 7), 45), (idem_batch(9, 1, 3), 45), (idem_batch(9, 0, 3), None)],
    ids=["gap", "new epoch not at 0", "in order"],
)
def test_refused_batch_leaves_the_log_unchanged(batch, code):
    fs = new_fs()
    log = open_log(fs)
    log.append(idem_batch(9, 0, 0, 3), 1)
    if code is None:
        assert log.append(batch, 1) == 3
        return
    with pytest.raises(ProducerStateError) as err:
        log.append(batch, 1)
    assert err.value.error_code == code
    assert log.log_end_offset == 3


def test_fenced_epoch_is_invalid_producer_epoch():
    fs = new_fs()
    log = open_log(fs)
    log.append(idem_batch(9, 4, 0), 1)
    with pytest.raises(ProducerStateError) as err:
        log.append(idem_batch(9, 3, 1), 1)
    assert err.value.error_code == ProduceCheck.INVALID_PRODUCER_EPOCH == 47


def test_follower_state_recognises_a_retry_after_leader_change():
    leader_fs, follower_fs = new_fs(), new_fs()
    leader, follower = open_log(leader_fs), open_log(follower_fs)
    for seq in range(0, 12, 2):
        leader.append(idem_batch(4, 0, seq, 2), 1)
    follower.append_as_follower(leader.read_bytes(0, 1 << 20))
    assert follower.producer_state == leader.producer_state
    # The follower becomes leader; the producer retries its last batch.
    assert follower.append(idem_batch(4, 0, 10, 2), 2) == 10
    assert follower.append(idem_batch(4, 0, 12, 1), 2) == 12


def test_log_without_producer_state_checks_nothing():
    fs = new_fs()
    log = Log.open(DIR, LogConfig(), now_ms=0, fs=fs)
    assert log.producer_state is None
    assert log.append(idem_batch(9, 0, 0), 1) == 0
    assert log.append(idem_batch(9, 0, 0), 1) == 1


# --- snapshots and rebuild ---

# One step of a producer: (pid, action, count)
_step = st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from(["next", "next", "next", "retry", "bump", "gap"]),
                  st.integers(1, 3))


def drive(log, steps, model: ProducerState):
    """Apply producer steps to `log` and to `model` (a plain ProducerState
    fed the same headers); their answers must agree."""
    next_seq, epochs = {}, {}
    for i, (pid, action, count) in enumerate(steps):
        epoch = epochs.get(pid, 0)
        seq = next_seq.get(pid, 0)
        if action == "bump":
            epoch, seq = epoch + 1, 0
        elif action == "retry" and seq >= count:
            seq -= count
        elif action == "gap":
            seq += 1
        raw = idem_batch(pid, epoch, seq, count, ts=TS + i)
        header = next(iter_batch_headers(raw))[1]
        expected = model.check_and_update(header, log.log_end_offset)
        try:
            base = log.append(raw, i)
        except ProducerStateError as e:
            assert e.error_code == expected.error
            continue
        if expected.error is ProduceCheck.DUPLICATE_SEQUENCE_NUMBER:
            assert base == expected.first_offset
            continue
        assert expected.error is ProduceCheck.OK
        epochs[pid] = epoch
        next_seq[pid] = seq + count


@given(st.lists(_step, min_size=1, max_size=40), st.integers(150, 600))
def test_state_survives_restart_with_and_without_snapshots(steps, segment_bytes):
    fs = new_fs()
    log = open_log(fs, segment_bytes)
    model = ProducerState()
    drive(log, steps, model)
    assert log.producer_state == model
    before = log.producer_state.snapshot_entries()
    log.close()
    assert snapshot_files(fs)  # at least the one close() writes

    reopened = open_log(fs, segment_bytes)
    assert reopened.producer_state.snapshot_entries() == before
    reopened.close()

    for name in snapshot_files(fs):
        fs.remove(os.path.join(DIR, name))
    rebuilt = open_log(fs, segment_bytes)
    assert rebuilt.producer_state.snapshot_entries() == before
    assert rebuilt.producer_state == rebuilt_from_log(rebuilt)


@given(st.lists(_step, min_size=1, max_size=40), st.integers(150, 600), st.data())
def test_truncation_reloads_the_state_of_the_batches_left(steps, segment_bytes, data):
    fs = new_fs()
    log = open_log(fs, segment_bytes)
    drive(log, steps, ProducerState())
    offset = data.draw(st.integers(0, log.log_end_offset))
    log.truncate_to(offset)
    assert log.producer_state == rebuilt_from_log(log)
    assert all(int(n[:20]) <= log.log_end_offset for n in snapshot_files(fs))
    # And the log goes on from there with the truncated state.
    log.close()
    assert open_log(fs, segment_bytes).producer_state == rebuilt_from_log(log)


@given(st.lists(_step, min_size=1, max_size=40), st.integers(150, 600), st.booleans())
def test_crash_recovers_the_state_of_the_surviving_batches(steps, segment_bytes, flush):
    fs = new_fs()
    log = open_log(fs, segment_bytes)
    drive(log, steps, ProducerState())
    if flush:
        log.flush()
    fs.crash(tear=True)
    reopened = open_log(fs, segment_bytes)
    assert reopened.producer_state == rebuilt_from_log(reopened)
    if flush:
        assert reopened.log_end_offset == log.log_end_offset


def test_truncate_fully_forgets_everything():
    fs = new_fs()
    log = open_log(fs, segment_bytes=150)
    for seq in range(10):
        log.append(idem_batch(1, 0, seq), 1)
    assert snapshot_files(fs)
    log.truncate_fully_and_start_at(100)
    assert log.producer_state.producers == {}
    assert snapshot_files(fs) == []
    assert log.append(idem_batch(1, 0, 55), 1) == 100  # unknown again: any sequence


def test_damaged_snapshot_is_deleted_and_the_state_rebuilt():
    fs = new_fs()
    log = open_log(fs, segment_bytes=150)
    for seq in range(10):
        log.append(idem_batch(1, 0, seq), 1)
    before = log.producer_state.snapshot_entries()
    log.close()
    newest = snapshot_files(fs)[-1]
    f = fs.open(os.path.join(DIR, newest))
    f.pwrite(b"\xff", f.size - 3)
    reopened = open_log(fs, segment_bytes=150)
    assert reopened.producer_state.snapshot_entries() == before
    assert newest not in snapshot_files(fs)


def test_retention_deletes_snapshots_of_deleted_segments_but_keeps_the_state():
    fs = new_fs()
    log = Log.open(
        DIR, LogConfig(segment_bytes=150, retention_bytes=300), now_ms=0, fs=fs, producer_state=True
    )
    for seq in range(12):
        log.append(idem_batch(seq % 2 + 1, 0, seq // 2), 1)
    before = log.producer_state.snapshot_entries()
    assert log.delete_old_segments(1) > 0
    first = log.segments[0].base_offset
    assert all(int(n[:20]) >= first for n in snapshot_files(fs))
    assert log.producer_state.snapshot_entries() == before


def test_snapshot_encoding_round_trips_and_checks_itself():
    state = ProducerState()
    state.check_and_update(next(iter_batch_headers(idem_batch(77, 3, 2**31 - 2, 3)))[1], 40)
    entries = state.snapshot_entries()
    data = encode_snapshot(43, entries)
    assert decode_snapshot(data) == (43, entries)
    with pytest.raises(CorruptSnapshotError, match="CRC"):
        decode_snapshot(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptSnapshotError, match="version"):
        decode_snapshot(b"\x00\x09" + data[2:])
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data[:5])
