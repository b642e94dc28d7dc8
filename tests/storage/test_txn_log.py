"""Transactions in the Log: transactional batches, markers, the last
stable offset and the aborted-transaction index (`.txnindex`), through
appends, followers, restarts, crashes and truncation, on the simulated disk.

The model test drives a log and a plain model (a list of what happened)
with the same random steps and holds the log's LSO and aborted list to
the model's, also after a crash and a rebuild."""

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.batch import ControlRecordType, build_batch, iter_batch_headers, iter_records, read_txn_marker
from storage.config import LogConfig
from storage.log import Log
from storage.producer_state import ProduceCheck, ProducerStateError
from storage.sim_fs import SimFileSystem
from storage.txn_index import ENTRY_SIZE, TXN_INDEX_SUFFIX, AbortedTxn, decode_entries

DIR = "/data/t-0"
TS = 1_700_000_000_000


def txn_batch(pid, epoch, seq, count=1, transactional=True):
    return build_batch([(b"k%d" % i, b"v" * 20, (), TS + i) for i in range(count)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)


def plain_batch(count=1):
    return build_batch([(b"p%d" % i, b"w" * 20, (), TS + i) for i in range(count)])


def new_fs():
    fs = SimFileSystem(seed=3)
    fs.makedirs("/data")
    return fs


def open_log(fs, segment_bytes=1 << 20):
    return Log.open(DIR, LogConfig(segment_bytes=segment_bytes), now_ms=0, fs=fs, producer_state=True)


def all_aborted(log):
    return log.collect_aborted_txns(0, log.log_end_offset + 1)


def test_a_transaction_holds_the_lso_at_its_first_offset_until_its_marker_is_replicated():
    log = open_log(new_fs())
    log.append(plain_batch(2), now_ms=0)  # 0, 1
    log.append(txn_batch(7, 0, 0, 3), now_ms=0)  # 2..4
    log.append(plain_batch(1), now_ms=0)  # 5
    ps = log.producer_state
    assert ps.last_stable_offset(6) == 2
    assert ps.entry(7).current_txn_first_offset == 2
    marker = log.append_marker(7, 0, 5, commit=True, now_ms=0, leader_epoch=0)
    assert marker == 6
    # The marker is not below the HW yet: still unstable.
    assert ps.last_stable_offset(6) == 2
    assert ps.last_stable_offset(7) == 7
    assert ps.entry(7).current_txn_first_offset == -1
    assert ps.entry(7).coordinator_epoch == 5
    assert all_aborted(log) == []


def test_an_abort_is_indexed_with_the_last_stable_offset_after_it():
    fs = new_fs()
    log = open_log(fs)
    log.append(txn_batch(1, 0, 0, 2), now_ms=0)  # 0, 1
    log.append(txn_batch(2, 0, 0, 1), now_ms=0)  # 2
    log.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)  # 3
    log.append_marker(2, 0, 0, commit=False, now_ms=0, leader_epoch=0)  # 4
    assert all_aborted(log) == [AbortedTxn(1, 0, 3, 2), AbortedTxn(2, 2, 4, 5)]
    data = fs.read_file(f"{DIR}/{0:020d}{TXN_INDEX_SUFFIX}")
    assert len(data) == 2 * ENTRY_SIZE
    assert struct.unpack_from(">hqqqq", data, 0) == (0, 1, 0, 3, 2)
    # A fetch from offset 4 still overlaps the second (its marker is at 4).
    assert log.collect_aborted_txns(4, 5) == [AbortedTxn(2, 2, 4, 5)]
    assert log.collect_aborted_txns(5, 6) == []
    # An upper bound at or below a transaction's first offset leaves it out.
    assert log.collect_aborted_txns(0, 2) == [AbortedTxn(1, 0, 3, 2)]


def test_marker_checks_stale_producer_epoch_and_coordinator_epoch():
    log = open_log(new_fs())
    log.append(txn_batch(1, 3, 0), now_ms=0)
    log.append_marker(1, 3, 10, commit=True, now_ms=0, leader_epoch=0)
    end = log.log_end_offset
    with pytest.raises(ProducerStateError) as e:
        log.append_marker(1, 2, 10, commit=True, now_ms=0, leader_epoch=0)
    assert e.value.error_code == ProduceCheck.INVALID_PRODUCER_EPOCH
    with pytest.raises(ProducerStateError) as e:
        log.append_marker(1, 3, 9, commit=False, now_ms=0, leader_epoch=0)
    assert e.value.error_code == ProduceCheck.TRANSACTION_COORDINATOR_FENCED == 52
    assert log.log_end_offset == end


def test_produce_checks_of_transactional_producers():
    log = open_log(new_fs())
    log.append(txn_batch(1, 0, 0), now_ms=0)
    # A non-transactional write while the transaction is open.
    with pytest.raises(ProducerStateError) as e:
        log.append(txn_batch(1, 0, 1, transactional=False), now_ms=0)
    assert e.value.error_code == ProduceCheck.INVALID_TXN_STATE == 48
    log.append_marker(1, 1, 0, commit=False, now_ms=0, leader_epoch=0)  # the coordinator bumped the epoch
    # The old epoch is fenced.
    with pytest.raises(ProducerStateError) as e:
        log.append(txn_batch(1, 0, 1), now_ms=0)
    assert e.value.error_code == ProduceCheck.INVALID_PRODUCER_EPOCH


def test_kip_890_hook_refuses_a_transaction_the_coordinator_did_not_verify():
    log = open_log(new_fs())
    ps = log.producer_state
    ps.require_verification = True
    with pytest.raises(ProducerStateError) as e:
        log.append(txn_batch(1, 0, 0), now_ms=0)
    assert e.value.error_code == ProduceCheck.INVALID_TXN_STATE
    ps.mark_verified(1, 0)
    log.append(txn_batch(1, 0, 0), now_ms=0)
    log.append(txn_batch(1, 0, 1), now_ms=0)  # the same transaction: no new verification needed
    log.append_marker(1, 0, 0, commit=True, now_ms=0, leader_epoch=0)
    with pytest.raises(ProducerStateError):  # the marker ended the verification
        log.append(txn_batch(1, 0, 2), now_ms=0)


def test_a_follower_fed_the_leaders_bytes_has_the_same_state_and_index():
    leader = open_log(new_fs(), segment_bytes=300)
    leader.append(txn_batch(1, 0, 0, 2), now_ms=0)
    leader.append(txn_batch(2, 0, 0, 2), now_ms=0)
    leader.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)
    leader.append(plain_batch(3), now_ms=0)
    leader.append_marker(2, 0, 0, commit=True, now_ms=0, leader_epoch=0)
    leader.append(txn_batch(1, 0, 2, 1), now_ms=0)
    follower = Log.open("/data/f-0", LogConfig(segment_bytes=300), now_ms=0, fs=new_fs(), producer_state=True)
    data = leader.read_bytes(0, 1 << 20)
    for position, header in iter_batch_headers(data):
        follower.append_as_follower(data[position:position + header.size_in_bytes], now_ms=0)
    assert follower.log_end_offset == leader.log_end_offset
    assert all_aborted(follower) == all_aborted(leader) == [AbortedTxn(1, 0, 4, 2)]
    assert follower.producer_state.ongoing == leader.producer_state.ongoing == {1: 9}
    assert follower.producer_state.last_stable_offset(10) == 9


def test_restart_keeps_the_open_transaction_and_the_aborted_index():
    fs = new_fs()
    log = open_log(fs, segment_bytes=300)
    log.append(txn_batch(1, 0, 0, 2), now_ms=0)
    log.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)
    log.append(txn_batch(2, 0, 0, 2), now_ms=0)
    log.append(plain_batch(2), now_ms=0)
    log.close()
    log = open_log(fs, segment_bytes=300)
    assert all_aborted(log) == [AbortedTxn(1, 0, 2, 3)]
    assert log.producer_state.ongoing == {2: 3}
    assert log.producer_state.last_stable_offset(log.log_end_offset) == 3


def test_a_crash_rebuilds_the_index_from_the_markers_in_the_log():
    fs = new_fs()
    log = open_log(fs, segment_bytes=300)
    log.append(txn_batch(1, 0, 0, 2), now_ms=0)
    log.append(txn_batch(2, 0, 0, 1), now_ms=0)
    log.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)
    log.append(plain_batch(2), now_ms=0)
    log.append_marker(2, 0, 0, commit=False, now_ms=0, leader_epoch=0)
    log.append(txn_batch(3, 0, 0, 1), now_ms=0)
    log.flush()
    expected = all_aborted(log)
    assert len(expected) == 2 and len(log.segments) > 1
    # Lose every index and snapshot: the log alone must give them back.
    for name in fs.listdir(DIR):
        if name.endswith((TXN_INDEX_SUFFIX, ".snapshot")):
            fs.remove(f"{DIR}/{name}")
    fs.crash()
    log = open_log(fs, segment_bytes=300)
    assert all_aborted(log) == expected
    assert log.producer_state.ongoing == {3: 7}
    rebuilt = [decode_entries(fs.read_file(f"{DIR}/{n}")) for n in sorted(fs.listdir(DIR)) if n.endswith(TXN_INDEX_SUFFIX)]
    assert [e for entries in rebuilt for e in entries] == expected


def test_truncation_drops_the_index_entries_and_reopens_the_transaction():
    log = open_log(new_fs())
    log.append(txn_batch(1, 0, 0, 2), now_ms=0)  # 0, 1
    log.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)  # 2
    assert all_aborted(log) == [AbortedTxn(1, 0, 2, 3)]
    log.truncate_to(2)
    assert all_aborted(log) == []
    assert log.producer_state.ongoing == {1: 0}


def test_read_txn_marker_reads_kafkas_end_transaction_marker():
    log = open_log(new_fs())
    log.append(txn_batch(1, 0, 0), now_ms=0)
    log.append_marker(1, 0, 42, commit=True, now_ms=5, leader_epoch=0)
    data = log.read_bytes(1, 1 << 20)
    assert read_txn_marker(data) == (ControlRecordType.COMMIT, 42)
    # Kafka's layout: key int16 version 0, int16 type; value int16 version 0, int32 coordinator epoch.
    (header,) = [h for _, h in iter_batch_headers(data)]
    assert header.is_control and header.is_transactional and header.producer_id == 1


# --- the model ---------------------------------------------------------------

PIDS = (1, 2, 3)
step = st.one_of(
    st.tuples(st.just("data"), st.sampled_from(PIDS), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("end"), st.sampled_from(PIDS), st.booleans()),
    st.tuples(st.just("hw"), st.integers(0, 4)),
    st.tuples(st.just("truncate"), st.integers(1, 6)),
)


class Model:
    """What the LSO and the aborted list must be, from first principles:
    the batches appended, replayed."""

    def __init__(self):
        self.batches = []  # (kind, pid, base offset, count, commit)
        self.hw = 0

    @property
    def leo(self) -> int:
        return self.batches[-1][2] + self.batches[-1][3] if self.batches else 0

    def _replay(self):
        open_: dict[int, int] = {}
        done = []
        for kind, pid, base, _count, commit in self.batches:
            if kind == "data":
                open_.setdefault(pid, base)
            elif kind == "end" and pid in open_:
                done.append((pid, open_.pop(pid), base, not commit))
        return open_, done

    @property
    def open(self) -> dict[int, int]:
        return self._replay()[0]

    def lso(self) -> int:
        open_, done = self._replay()
        firsts = list(open_.values()) + [f for _, f, m, _ in done if m >= self.hw]
        return min([self.hw] + firsts)

    def aborted(self):
        return [(p, f, m) for p, f, m, a in self._replay()[1] if a]

    def truncate(self, offset: int) -> None:
        """`Log.truncate_to`: the batch holding `offset` goes whole."""
        self.batches = [b for b in self.batches if b[2] + b[3] <= offset]
        # A truncated replica's HW is at most its log end; take it there
        # (the real state forgets which completed transactions were above
        # the HW when it reloads, as Kafka's does).
        self.hw = self.leo


def aborted_of(log):
    return [(a.producer_id, a.first_offset, a.last_offset) for a in all_aborted(log)]


# The suite's hypothesis profile sets the examples (tests/conftest.py); RAFTKA_SOAK=1 runs 3000.
@settings(deadline=None, **({"max_examples": 3000} if os.environ.get("RAFTKA_SOAK") == "1" else {}))
@given(st.lists(step, max_size=40), st.sampled_from([250, 400, 1 << 20]))
def test_lso_and_aborted_index_follow_the_model(steps, segment_bytes):
    fs = new_fs()
    log = open_log(fs, segment_bytes=segment_bytes)
    model = Model()
    seqs = dict.fromkeys(PIDS, 0)
    for s in steps:
        if s[0] == "data":
            _, pid, n = s
            base = log.append(txn_batch(pid, 0, seqs[pid], n), now_ms=0)
            seqs[pid] += n
            model.batches.append(("data", pid, base, n, None))
        elif s[0] == "plain":
            base = log.append(plain_batch(s[1]), now_ms=0)
            model.batches.append(("plain", -1, base, s[1], None))
        elif s[0] == "end":
            _, pid, commit = s
            offset = log.append_marker(pid, 0, 0, commit=commit, now_ms=0, leader_epoch=0)
            assert offset == model.leo
            model.batches.append(("end", pid, offset, 1, commit))
        elif s[0] == "hw":
            model.hw = min(model.leo, model.hw + s[1])
        else:
            cut = max(model.leo - s[1], 0)
            log.truncate_to(cut)
            model.truncate(cut)
            assert log.log_end_offset == model.leo
            # Sequences after a truncation: the producer state's own.
            for pid in PIDS:
                entry = log.producer_state.entry(pid)
                seqs[pid] = entry.last_seq + 1 if entry is not None and entry.batches else 0
        ps = log.producer_state
        assert ps.last_stable_offset(model.hw) == model.lso()
        assert ps.unstable == bool(ps.ongoing or ps.unreplicated)
        assert ps.ongoing == model.open
    assert aborted_of(log) == model.aborted()
    # Every entry's last stable offset lets the search stop correctly:
    # for any window, what the search finds is what overlaps it.
    for start in range(0, model.leo + 1, 3):
        for end in range(start, model.leo + 2, 4):
            want = [(p, f, m) for p, f, m in model.aborted() if m >= start and f < end]
            found = [(a.producer_id, a.first_offset, a.last_offset) for a in log.collect_aborted_txns(start, end)]
            assert found == want, (start, end)
    # A follower fed the leader's bytes batch by batch agrees.
    follower = Log.open("/data/f-0", LogConfig(segment_bytes=segment_bytes), now_ms=0, fs=fs, producer_state=True)
    if model.leo:
        data = log.read_bytes(0, 1 << 30)
        for position, header in iter_batch_headers(data):
            follower.append_as_follower(data[position:position + header.size_in_bytes], now_ms=0)
    assert aborted_of(follower) == model.aborted()
    assert follower.producer_state.ongoing == model.open
    # A crash that loses every snapshot and index: the rebuild agrees.
    log.flush()
    for name in fs.listdir(DIR):
        if name.endswith((TXN_INDEX_SUFFIX, ".snapshot")):
            fs.remove(f"{DIR}/{name}")
    fs.crash()
    log = open_log(fs, segment_bytes=segment_bytes)
    assert aborted_of(log) == model.aborted()
    assert log.producer_state.ongoing == model.open


# --- compaction ----------------------------------------------------------------

def test_compaction_drops_aborted_records_keeps_markers_and_stops_at_the_lso():
    from storage.cleaner import CompactedLog, LogCleaner
    from storage.cleaner_config import CleanerConfig, CompactionConfig

    fs = new_fs()
    log = Log.open(DIR, LogConfig(segment_bytes=260), now_ms=TS, fs=fs, producer_state=True)

    def keyed(pid, seq, key, value, transactional=True):
        return build_batch([(key, value, (), TS)], producer_id=pid, producer_epoch=0, base_sequence=seq,
                           is_transactional=transactional)

    log.append(build_batch([(b"k", b"committed-plain", (), TS)]), now_ms=TS)  # 0
    log.append(keyed(1, 0, b"k", b"aborted"), now_ms=TS)  # 1: would shadow offset 0
    log.append(keyed(2, 0, b"j", b"committed-txn"), now_ms=TS)  # 2
    log.append_marker(1, 0, 0, commit=False, now_ms=TS, leader_epoch=0)  # 3
    log.append_marker(2, 0, 0, commit=True, now_ms=TS, leader_epoch=0)  # 4
    log.append(keyed(3, 0, b"j", b"open"), now_ms=TS)  # 5: open, past the LSO
    log.append(keyed(3, 1, b"j", b"open2"), now_ms=TS)  # 6
    log.roll(TS)
    cleaner = LogCleaner(CleanerConfig())
    compaction = CompactionConfig(min_cleanable_dirty_ratio=0.0)
    for _ in range(100):
        step = cleaner.maybe_clean([CompactedLog(log, compaction, log.log_end_offset)], TS, 1 << 20)
        if not step.busy and not step.bytes:
            break
    data = log.read_bytes(0, 1 << 20)
    records = [(r.offset, r.key, r.value) for p, h in iter_batch_headers(data) if not h.is_control
               for r in iter_records(data, p)]
    markers = [h.base_offset for p, h in iter_batch_headers(data) if h.is_control]
    # The aborted record is gone and did not shadow the committed one; the
    # open transaction (past the LSO, 5) is untouched; both markers stay.
    assert records == [(0, b"k", b"committed-plain"), (2, b"j", b"committed-txn"), (5, b"j", b"open"),
                       (6, b"j", b"open2")]
    assert markers == [3, 4]
    assert all_aborted(log) == [AbortedTxn(1, 1, 3, 2)]
    # The cleaned segment's index survives a restart.
    log.close()
    log = Log.open(DIR, LogConfig(segment_bytes=260), now_ms=TS, fs=fs, producer_state=True)
    assert all_aborted(log) == [AbortedTxn(1, 1, 3, 2)]
    assert log.producer_state.ongoing == {3: 5}
    cleaner.close()


def test_retention_deletes_a_segments_txnindex_with_it():
    fs = new_fs()
    log = open_log(fs, segment_bytes=1 << 20)
    log.append(txn_batch(1, 0, 0, 2), now_ms=0)
    log.append_marker(1, 0, 0, commit=False, now_ms=0, leader_epoch=0)
    first = f"{DIR}/{0:020d}{TXN_INDEX_SUFFIX}"
    assert fs.exists(first)
    log.roll(0)
    log.append(plain_batch(1), now_ms=0)
    log.maybe_increment_log_start_offset(3)
    assert log.delete_old_segments(0) == 1
    assert not fs.exists(first)
    assert all_aborted(log) == []


def test_compaction_removes_a_marker_once_its_transaction_is_gone_and_delete_retention_passed():
    """Kafka's cleaner on markers: kept while records of their transaction
    are met before them; then given a delete horizon (and an aborted
    transaction leaves the `.txnindex`); removed in a pass after it."""
    from storage.batch_filter import delete_horizon_ms
    from storage.cleaner import CompactedLog, LogCleaner
    from storage.cleaner_config import CleanerConfig, CompactionConfig

    fs = new_fs()
    log = Log.open(DIR, LogConfig(segment_bytes=400), now_ms=TS, fs=fs, producer_state=True)

    def keyed(pid, seq, key, value, transactional=True):
        return build_batch([(key, value, (), TS)], producer_id=pid, producer_epoch=0, base_sequence=seq,
                           is_transactional=transactional)

    log.append(keyed(1, 0, b"k", b"aborted"), now_ms=TS)  # 0
    log.append(keyed(2, 0, b"j", b"committed-txn"), now_ms=TS)  # 1
    log.append_marker(1, 0, 0, commit=False, now_ms=TS, leader_epoch=0)  # 2
    log.append_marker(2, 0, 0, commit=True, now_ms=TS, leader_epoch=0)  # 3
    # Each producer's next transaction, committed: their last batches (kept
    # by compaction) and markers move on.
    log.append(keyed(1, 1, b"a", b"a1"), now_ms=TS)  # 4
    log.append_marker(1, 0, 0, commit=True, now_ms=TS, leader_epoch=0)  # 5
    log.append(keyed(2, 1, b"b", b"b1"), now_ms=TS)  # 6
    log.append_marker(2, 0, 0, commit=True, now_ms=TS, leader_epoch=0)  # 7
    log.append(build_batch([(b"j", b"newer", (), TS)]), now_ms=TS)  # 8: shadows 1
    log.roll(TS)
    retention_ms = 1000
    cleaner = LogCleaner(CleanerConfig())
    compaction = CompactionConfig(min_cleanable_dirty_ratio=0.0, delete_retention_ms=retention_ms)

    def clean(now_ms):
        for _ in range(100):
            step = cleaner.maybe_clean([CompactedLog(log, compaction, log.log_end_offset)], now_ms, 1 << 20)
            if not step.busy and not step.bytes:
                break

    def contents():
        data = log.read_bytes(0, 1 << 20)
        headers = list(iter_batch_headers(data))
        return ([r.offset for p, h in headers if not h.is_control for r in iter_records(data, p)],
                {h.base_offset: delete_horizon_ms(h) for p, h in headers if h.is_control})

    clean(TS)
    # Records 0 (aborted) and 1 (shadowed) went in this pass: their markers stay as they were.
    assert contents() == ([4, 6, 8], {2: None, 3: None, 5: None, 7: None})
    assert all_aborted(log) == [AbortedTxn(1, 0, 2, 1)]

    log.append(build_batch([(b"x", b"dirty", (), TS)]), now_ms=TS)  # something for the next pass to do
    log.roll(TS)
    clean(TS + 10)
    # No record of transactions 2 and 3 is left: their markers get a delete horizon.
    horizon = TS + 10 + retention_ms
    assert contents() == ([4, 6, 8, 9], {2: horizon, 3: horizon, 5: None, 7: None})
    assert all_aborted(log) == []
    clean(horizon - 1)
    assert contents()[1] == {2: horizon, 3: horizon, 5: None, 7: None}
    clean(horizon)
    assert contents() == ([4, 6, 8, 9], {5: None, 7: None})
    # A restart rebuilds the same state: no transaction open, nothing aborted.
    log.close()
    for name in fs.listdir(DIR):
        if name.endswith((TXN_INDEX_SUFFIX, ".snapshot")):
            fs.remove(f"{DIR}/{name}")
    log = Log.open(DIR, LogConfig(segment_bytes=400), now_ms=TS, fs=fs, producer_state=True)
    assert log.producer_state.ongoing == {}
    assert log.producer_state.last_stable_offset(log.log_end_offset) == log.log_end_offset
    assert all_aborted(log) == []
    cleaner.close()
