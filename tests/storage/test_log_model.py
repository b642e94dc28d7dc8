"""Model-based test: `Log` on a simulated disk against a plain list.

Hypothesis drives appends (leader and follower), reads, rolls,
truncations, retention, log start moves, flushes, clean restarts and power
cuts (unsynced bytes dropped, the last writes torn, directory operations
undone). The model is the list of batches written since the log last
restarted; after every step the log must hold exactly the model's batches
from its log start offset on. After a crash it must hold a prefix of them
that keeps at least everything below the recovery point it had claimed.
"""

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from log_testing import as_stored

from storage.batch import build_batch
from storage.config import LogConfig
from storage.log import Log
from storage.sim_fs import SimFileSystem

DIR = "/data/t-0"


@dataclass
class ModelBatch:
    base: int
    last: int
    stored: bytes
    epoch: int
    timestamps: list[int] = field(default_factory=list)


class Model:
    def __init__(self) -> None:
        self.batches: list[ModelBatch] = []
        self.restart_base = 0
        self.log_start = 0
        self.flushed = 0
        # (epoch, start_offset), maintained with the cache's documented
        # operations, on a plain list.
        self.epochs: list[tuple[int, int]] = []

    @property
    def leo(self) -> int:
        return self.batches[-1].last + 1 if self.batches else self.restart_base

    def truncate(self, offset: int) -> None:
        """The log's rule: batches whose last offset is >= offset go."""
        while self.batches and self.batches[-1].last >= offset:
            self.batches.pop()
        self.epochs = [e for e in self.epochs if e[1] < self.leo]

    def restart(self, offset: int) -> None:
        self.batches = []
        self.epochs = []
        self.restart_base = self.log_start = self.flushed = offset

    def add(self, batch: ModelBatch) -> None:
        self.batches.append(batch)
        latest = self.epochs[-1][0] if self.epochs else -1
        if batch.epoch > latest:
            # An entry the new one contradicts goes (it started no data).
            self.epochs = [e for e in self.epochs if e[1] < batch.base]
            self.epochs.append((batch.epoch, batch.base))

    def move_log_start(self, offset: int) -> None:
        self.log_start = offset
        before = [e for e in self.epochs if e[1] <= offset]
        if before:
            self.epochs = [(before[-1][0], offset)] + [e for e in self.epochs if e[1] > offset]

    def visible(self) -> list[ModelBatch]:
        return [b for b in self.batches if b.last >= self.log_start]

    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> bytes:
        out, size = [], 0
        for b in self.batches:
            if b.last < offset:
                continue
            if max_offset is not None and b.last >= max_offset:
                break
            if out and size + len(b.stored) > max_bytes:
                break
            out.append(b.stored)
            size += len(b.stored)
        return b"".join(out)

    def offset_for_timestamp(self, target: int):
        for b in self.visible():
            for i, ts in enumerate(b.timestamps):
                if b.base + i >= self.log_start and ts >= target:
                    return b.base + i, ts
        return None


def oracle_end_offset(entries, requested, leo):
    if requested == -1 or not entries:
        return (-1, -1)
    if requested == entries[-1][0]:
        return (requested, leo)
    higher = [e for e in entries if e[0] > requested]
    lower = [e for e in entries if e[0] <= requested]
    if not higher:
        return (-1, -1)
    if not lower:
        return (requested, higher[0][1])
    return (lower[-1][0], higher[0][1])


class LogMachine(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**32 - 1), flush_messages=st.sampled_from([None, None, 3]))
    def open_log(self, seed, flush_messages):
        self.config = LogConfig(
            segment_bytes=700,
            segment_ms=300,
            segment_index_bytes=40,
            index_interval_bytes=90,
            retention_ms=500,
            retention_bytes=1500,
            max_message_bytes=2000,
            flush_messages=flush_messages,
        )
        self.fs = SimFileSystem(seed=seed)
        self.now_ms = 1000
        self.epoch = 0
        self.model = Model()
        self.log = Log.open(DIR, self.config, fs=self.fs, now_ms=self.now_ms)

    def _reopen(self):
        self.log = Log.open(DIR, self.config, fs=self.fs, now_ms=self.now_ms)

    def _records(self, n, value_size, jitter):
        return [(b"k%d" % i, b"v" * value_size, (), self.now_ms + jitter[i % len(jitter)]) for i in range(n)]

    def _note_flush(self):
        assert self.log.recovery_point >= min(self.model.flushed, self.model.leo)
        self.model.flushed = self.log.recovery_point

    # --- appends ---

    @rule(
        n=st.integers(1, 4),
        value_size=st.integers(0, 60),
        jitter=st.lists(st.integers(-20, 20), min_size=1, max_size=4),
        advance_ms=st.integers(0, 120),
        bump_epoch=st.booleans(),
        stamp_epoch=st.booleans(),
        kind=st.sampled_from([bytes, bytearray, memoryview]),
    )
    def append(self, n, value_size, jitter, advance_ms, bump_epoch, stamp_epoch, kind):
        self.now_ms += advance_ms
        self.epoch += bump_epoch
        records = self._records(n, value_size, jitter)
        raw = build_batch(records)
        buf = kind(bytearray(raw)) if kind is memoryview else kind(raw)
        epoch = self.epoch if stamp_epoch else None
        base = self.log.append(buf, now_ms=self.now_ms, leader_epoch=epoch)
        assert base == self.model.leo
        stored_epoch = -1 if epoch is None else epoch
        self.model.add(
            ModelBatch(base, base + n - 1, as_stored(raw, base, epoch), stored_epoch, [r[3] for r in records])
        )
        self._note_flush()

    @rule(
        sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3),
        advance_ms=st.integers(0, 120),
        bump_epoch=st.booleans(),
    )
    def append_as_follower(self, sizes, advance_ms, bump_epoch):
        self.now_ms += advance_ms
        self.epoch += bump_epoch
        chunk, base = [], self.model.leo
        for n in sizes:
            records = self._records(n, 20, [0, 5])
            raw = build_batch(records, base_offset=base, partition_leader_epoch=self.epoch)
            chunk.append(raw)
            self.model.add(ModelBatch(base, base + n - 1, raw, self.epoch, [r[3] for r in records]))
            base += n
        assert self.log.append_as_follower(b"".join(chunk), now_ms=self.now_ms) == self.model.leo - sum(sizes)
        self._note_flush()

    # --- reads ---

    @rule(data=st.data())
    def read(self, data):
        offset = data.draw(st.integers(self.model.log_start, self.model.leo))
        max_bytes = data.draw(st.integers(0, 1500))
        max_offset = data.draw(st.none() | st.integers(offset, self.model.leo + 1))
        assert self.log.read_bytes(offset, max_bytes, max_offset) == self.model.read(offset, max_bytes, max_offset)

    @precondition(lambda self: self.model.visible())
    @rule(data=st.data())
    def read_from_a_recent_batch(self, data):
        """What a follower that keeps up asks for: the start of one of the
        last few batches, to the end of the log (the segment's
        `recent_batches` shortcut), or stopped short by `max_bytes`."""
        recent = self.model.visible()[-12:]
        offset = max(data.draw(st.sampled_from(recent)).base, self.model.log_start)
        max_bytes = data.draw(st.integers(0, 1500) | st.just(10**9))
        max_offset = data.draw(st.sampled_from([None, self.model.leo, self.model.leo + 1]))
        assert self.log.read_bytes(offset, max_bytes, max_offset) == self.model.read(offset, max_bytes, max_offset)

    @rule(delta_ms=st.integers(-30, 600))
    def offset_for_timestamp(self, delta_ms):
        target = self.now_ms - delta_ms
        assert self.log.offset_for_timestamp(target) == self.model.offset_for_timestamp(target)

    @rule(epoch=st.integers(-1, 8))
    def end_offset_for_epoch(self, epoch):
        expected = oracle_end_offset(self.model.epochs, epoch, self.model.leo)
        assert self.log.end_offset_for_epoch(epoch) == expected

    # --- segments, truncation, retention ---

    @rule()
    def roll(self):
        self.log.roll(now_ms=self.now_ms)

    @precondition(lambda self: self.model.leo > self.model.log_start)
    @rule(data=st.data())
    def truncate_to(self, data):
        offset = data.draw(st.integers(self.model.log_start, self.model.leo - 1))
        assert self.log.truncate_to(offset)
        self.model.truncate(offset)
        self.model.log_start = min(self.model.log_start, self.model.leo)
        self.model.flushed = min(self.model.flushed, self.model.leo)
        self._note_flush()

    @rule(delta=st.integers(0, 20))
    def truncate_fully_and_start_at(self, delta):
        offset = self.model.leo + delta
        self.log.truncate_fully_and_start_at(offset)
        self.model.restart(offset)

    @rule(data=st.data())
    def increment_log_start(self, data):
        offset = data.draw(st.integers(self.model.log_start, self.model.leo))
        self.log.maybe_increment_log_start_offset(offset)
        if offset > self.model.log_start:
            self.model.move_log_start(offset)

    @rule(advance_ms=st.integers(0, 800))
    def retention(self, advance_ms):
        self.now_ms += advance_ms
        before = self.log.size_in_bytes
        deleted = self.log.delete_old_segments(self.now_ms)
        assert self.log.log_start_offset >= self.model.log_start
        assert self.log.log_end_offset == self.model.leo
        assert (self.log.size_in_bytes < before) == (deleted > 0)
        segments = self.log.segments
        assert sum(s.size for s in segments[1:]) < self.config.retention_bytes or len(segments) == 1
        if deleted:
            self.model.move_log_start(self.log.log_start_offset)

    # --- durability ---

    @rule(data=st.data())
    def flush(self, data):
        offset = data.draw(st.none() | st.integers(self.model.log_start, self.model.leo))
        self.log.flush(offset)
        assert self.log.recovery_point >= (self.model.leo if offset is None else offset)
        self._note_flush()

    @rule()
    def close_and_reopen(self):
        self.log.close()
        self._reopen()
        assert self.log.recovery_point == self.model.leo
        self.model.flushed = self.model.leo
        # Opening drops epoch entries that start at or past the log end
        # offset and moves the first one up to the log start (Kafka's load).
        self.model.truncate(self.model.leo)
        self.model.move_log_start(self.model.log_start)

    @rule(tear=st.booleans(), lose_dir_ops=st.booleans())
    def crash(self, tear, lose_dir_ops):
        self.fs.crash(tear=tear, lose_dir_ops=lose_dir_ops)
        self._reopen()
        model = self.model
        leo = self.log.log_end_offset
        assert leo >= model.flushed, f"flushed data lost: log end {leo} < recovery point {model.flushed}"
        assert leo <= model.leo
        assert self.log.log_start_offset == model.log_start
        model.truncate(leo)
        if model.leo != leo:
            # Everything unflushed was lost and the log start offset was past it:
            # the log restarted empty there.
            assert leo == self.log.log_start_offset
            model.restart(leo)
        model.move_log_start(model.log_start)
        model.flushed = self.log.recovery_point
        assert model.flushed == leo

    # --- what must always hold ---

    @invariant()
    def log_matches_model(self):
        log, model = self.log, self.model
        assert log.log_end_offset == model.leo
        assert log.log_start_offset == model.log_start
        assert log.read_bytes(model.log_start, 10**9) == model.read(model.log_start, 10**9, None)
        assert log.epoch_cache.entries == model.epochs
        bases = [s.base_offset for s in log.segments]
        assert bases == sorted(set(bases)) and bases[0] <= log.log_start_offset

    def teardown(self):
        if hasattr(self, "log"):
            self.log.close()


TestLogModel = LogMachine.TestCase
