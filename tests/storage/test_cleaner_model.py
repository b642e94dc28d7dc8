"""Model-based test of compaction: the cleaner against a plain-list oracle.

Hypothesis appends keyed records (values, tombstones, a few keyless
records, headers, every codec) in batches of one to four, rolls segments,
moves the clock and the high watermark, runs the cleaner in steps of
random size, and restarts the broker (log and cleaner). The oracle keeps
the records a consumer must see and applies the documented rules of one
pass to them; after every step the log must hold exactly those records,
at their original offsets. On top of that, the properties users rely on:

- a consumer replaying the log from the start ends with the same table as
  one that replayed the uncompacted history;
- each key's newest value is still there, at its offset;
- a tombstone outlives its first clean by `delete.retention.ms`, then goes;
- the active segment's bytes are never touched; codecs are kept.
"""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cleaner_testing import BASE_TS, log_batches, log_records, replay
from storage.batch import build_batch
from storage.cleaner import CompactedLog, LogCleaner
from storage.cleaner_config import CleanerConfig, CompactionConfig
from storage.config import LogConfig
from storage.log import Log
from storage.offset_map import ENTRY_OVERHEAD_BYTES
from storage.sim_fs import SimFileSystem

DIR = "/data/t-0"
DELETE_RETENTION_MS = 1_000
KEYS = [b"key-%02d" % i for i in range(12)]


class CompactionMachine(RuleBasedStateMachine):
    @initialize(segment_bytes=st.integers(250, 900), small_map=st.booleans())
    def start(self, segment_bytes, small_map):
        self.fs = SimFileSystem(seed=0)
        self.fs.makedirs("/data")
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=100)
        self.compaction = CompactionConfig(delete_retention_ms=DELETE_RETENTION_MS, min_cleanable_dirty_ratio=0.0)
        # 1024 bytes hold about ten keys: the map fills up and passes stop early.
        self.cleaner_config = CleanerConfig(dedupe_buffer_size=1024) if small_map else CleanerConfig()
        self.now = BASE_TS
        self.log = Log.open(DIR, self.config, now_ms=self.now, fs=self.fs)
        self.cleaner = LogCleaner(self.cleaner_config)
        self.history = []  # every record appended: (offset, key, value, ts, headers)
        self.expected = []  # what the log must hold
        self.codecs = {}  # batch base offset -> codec
        self.stamped = {}  # tombstone offset -> time of the pass that first cleaned it
        self.first_dirty = 0
        self.known_horizon = None  # the cleaner's memory of due tombstones

    # --- actions ---

    @rule(
        records=st.lists(
            st.tuples(st.sampled_from(KEYS + [None]), st.booleans(), st.binary(max_size=12)), min_size=1, max_size=4
        ),
        codec=st.sampled_from([0, 0, 1, 2, 3, 4]),
        advance_ms=st.integers(0, 400),
    )
    def append(self, records, codec, advance_ms):
        self.now += advance_ms
        batch = [
            (key, None if tombstone and key is not None else value, (("h", value),) if value else (), self.now)
            for key, tombstone, value in records
        ]
        base = self.log.append(build_batch(batch, compression=codec), self.now)
        assert base == self.log.log_end_offset - len(batch)
        self.codecs[base] = codec
        for i, (key, value, headers, ts) in enumerate(batch):
            record = (base + i, key, value, ts, headers)
            self.history.append(record)
            self.expected.append(record)

    @rule(advance_ms=st.integers(0, 1_500))
    def advance(self, advance_ms):
        self.now += advance_ms

    @rule()
    def roll(self):
        if self.log.active_segment.size:
            self.log.roll(self.now)

    @rule(hw_back=st.one_of(st.none(), st.integers(0, 6)), budget=st.integers(1, 3_000))
    def clean(self, hw_back, budget):
        hw = None
        if hw_back is not None:
            ends = sorted({r[0] + 1 for r in self.expected} | {self.log.log_start_offset})
            hw = ends[max(0, len(ends) - 1 - hw_back)]
        active_before = self.log.active_segment.log.pread(1 << 30, 0)
        active_base = self.log.active_segment.base_offset
        passes = self._oracle_passes(hw)
        done = 0
        for _ in range(1_000):
            step = self.cleaner.maybe_clean([CompactedLog(self.log, self.compaction, hw)], self.now, budget)
            done += step.passes_completed
            if not step.busy and not step.bytes:
                break
        assert done == passes
        assert self.cleaner.first_dirty_offset(self.log) == self.first_dirty
        assert self.log.active_segment.base_offset == active_base
        assert self.log.active_segment.log.pread(1 << 30, 0) == active_before

    @rule()
    def restart(self):
        self.log.close()
        self.cleaner.close()
        self.log = Log.open(DIR, self.config, now_ms=self.now, fs=self.fs)
        # A new cleaner reads the clean section's horizons back: nothing
        # to forget.
        self.cleaner = LogCleaner(self.cleaner_config)

    # --- the oracle ---

    def _oracle_passes(self, hw) -> int:
        """Apply the passes the cleaner must run now; return how many."""
        passes = 0
        while self._oracle_pass(hw):
            passes += 1
            assert passes < 100
        return passes

    def _oracle_pass(self, hw) -> bool:
        log, now = self.log, self.now
        first_dirty = self.first_dirty
        end = log.active_segment.base_offset
        if hw is not None and hw < end:
            # Whole batches only: the start of the batch holding the HW.
            end = next((b for b in self.codecs if b < hw < self._batch_end(b)), hw)
        end = max(end, first_dirty)
        dirty = [r for r in self.expected if first_dirty <= r[0] < end]
        due_tombstones = self.known_horizon is not None and self.known_horizon <= now
        if not dirty and not (due_tombstones and first_dirty > log.log_start_offset):
            return False
        # The offset map, batch by batch, stopping when full (storage.offset_map).
        newest, used, map_end = {}, 0, first_dirty
        live_batches = {self._batch_start(r[0]) for r in self.expected}
        for base in sorted(b for b in live_batches if first_dirty <= b < end):
            batch = [r for r in dirty if base <= r[0] < self._batch_end(base)]
            if used >= self.cleaner_config.dedupe_buffer_size and map_end > first_dirty:
                break
            for offset, key, *_ in batch:
                if key is not None:
                    if key not in newest:
                        used += len(key) + ENTRY_OVERHEAD_BYTES
                    newest[key] = offset
            map_end = self._batch_end(base)
        kept = []
        for record in self.expected:
            offset, key, value = record[:3]
            if offset >= map_end:
                # Past the map, even in a segment the pass rewrites: as it is.
                kept.append(record)
                continue
            if key is None or offset < newest.get(key, -1):
                continue
            if value is None:
                stamped = self.stamped.setdefault(offset, now)
                if now >= stamped + DELETE_RETENTION_MS:
                    assert newest.get(key, -1) <= offset
                    continue
            kept.append(record)
        self.expected = kept
        live = {r[0] for r in kept}
        self.stamped = {o: t for o, t in self.stamped.items() if o in live}
        self.known_horizon = min((t + DELETE_RETENTION_MS for t in self.stamped.values()), default=None)
        self.first_dirty = map_end
        return True

    def _batch_start(self, offset):
        return max(b for b in self.codecs if b <= offset)

    def _batch_end(self, base):
        later = [b for b in self.codecs if b > base]
        return min(later) if later else self.log.log_end_offset

    # --- what must hold after every step ---

    @invariant()
    def holds_exactly_the_expected_records(self):
        assert log_records(self.log) == self.expected

    @invariant()
    def consumer_from_the_start_sees_the_history_table(self):
        keyed = [r for r in self.history if r[1] is not None]
        assert replay([r for r in self.expected if r[1] is not None]) == replay(keyed)
        newest = {}
        for record in keyed:
            newest[record[1]] = record
        present = set(self.expected)
        for record in newest.values():
            if record[2] is not None:
                assert record in present, f"newest value of {record[1]!r} lost"

    @invariant()
    def batches_keep_their_codec(self):
        for header, _data in log_batches(self.log):
            if header.records_count:
                assert header.compression == self.codecs[header.base_offset]

    def teardown(self):
        self.cleaner.close()


TestCompaction = CompactionMachine.TestCase


def test_a_tombstone_past_the_map_outlives_its_horizon_until_a_map_covers_it():
    """Found by the machine above: a value and its tombstone in one
    segment, the HW between them. The first pass maps only the value; the
    tombstone is past its map. Once the tombstone's delete horizon would
    have passed, a pass with nothing to map must not drop it (the value
    would come back); a pass whose map covers it drops the value."""
    fs = SimFileSystem(seed=0)
    fs.makedirs("/data")
    log = Log.open(DIR, LogConfig(segment_bytes=250, index_interval_bytes=100), now_ms=BASE_TS, fs=fs)
    compaction = CompactionConfig(delete_retention_ms=DELETE_RETENTION_MS, min_cleanable_dirty_ratio=0.0)
    cleaner = LogCleaner(CleanerConfig())
    log.append(build_batch([(b"k", b"v", (), BASE_TS)]), BASE_TS)
    log.append(build_batch([(b"k", None, (), BASE_TS)]), BASE_TS)
    log.roll(BASE_TS)

    def clean(now, hw):
        for _ in range(100):
            step = cleaner.maybe_clean([CompactedLog(log, compaction, hw)], now, 1 << 20)
            if not step.busy and not step.bytes:
                return

    clean(BASE_TS, hw=1)
    clean(BASE_TS + 2 * DELETE_RETENTION_MS, hw=1)
    assert replay(log_records(log)) == {}, "the deleted key came back"
    assert [r[:3] for r in log_records(log)] == [(0, b"k", b"v"), (1, b"k", None)]
    clean(BASE_TS + 2 * DELETE_RETENTION_MS, hw=None)
    assert [r[:3] for r in log_records(log)] == [(1, b"k", None)]
    log.close()
    cleaner.close()
