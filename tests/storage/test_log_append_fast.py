"""Log.append's fast path: the same outcome as the full checks, real short
writes, closed logs."""

import errno
import os
import resource
import signal
import struct
import tempfile

import pytest
from hypothesis import given
from hypothesis import strategies as st
from log_testing import as_stored, batch

from storage.batch import CRC_OFFSET, CRC_START_OFFSET, build_batch, validate_batch
from storage.config import LogConfig
from storage.errors import CorruptRecordError, StorageError
from storage.log import Log
from storage.sim_fs import SimFileSystem

# (offset, struct format) of the header fields a client controls.
FIELDS = {
    "batch_length": (8, ">i"),
    "magic": (16, ">b"),
    "crc": (17, ">I"),
    "attributes": (21, ">h"),
    "last_offset_delta": (23, ">i"),
    "producer_id": (43, ">q"),
    "base_sequence": (53, ">i"),
    "records_count": (57, ">i"),
}
_INTERESTING = st.sampled_from([-(1 << 31), -2, -1, 0, 1, 2, 3, 4, 5, 7, 0x20, 0x27, 48, 49, 100, (1 << 31) - 1])

KINDS = {
    "bytes": bytes,
    "bytearray": bytearray,
    "writable view": lambda b: memoryview(bytearray(b)),
    "read-only view": lambda b: memoryview(bytes(b)),
}


@st.composite
def client_batches(draw):
    n = draw(st.integers(1, 5))
    idempotent = draw(st.booleans())
    raw = build_batch(
        [(b"k%d" % i, b"v" * draw(st.integers(0, 40)), (), 1_700_000_000_000 + i) for i in range(n)],
        compression=draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4])),
        producer_id=draw(st.integers(0, 1000)) if idempotent else -1,
        producer_epoch=0 if idempotent else -1,
        base_sequence=draw(st.integers(0, 1000)) if idempotent else -1,
        is_transactional=draw(st.booleans()) and idempotent,
    )
    return bytearray(raw)


def _fix_crc(buf: bytearray) -> None:
    from crc32c import crc32c

    struct.pack_into(">I", buf, CRC_OFFSET, crc32c(bytes(buf[CRC_START_OFFSET:])))


@st.composite
def mutations(draw, buf: bytearray):
    """`buf` changed the way a buggy or hostile client might."""
    kind = draw(st.sampled_from(["none", "fields", "fields", "fields", "flip", "trailing", "truncated"]))
    if kind == "fields":
        for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=3)):
            offset, fmt = FIELDS[name]
            bits = 8 * struct.calcsize(fmt)
            lo, hi = (0, (1 << bits) - 1) if fmt == ">I" else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
            struct.pack_into(fmt, buf, offset, min(max(draw(_INTERESTING), lo), hi))
        if draw(st.booleans()):
            _fix_crc(buf)  # so the fields' own checks are what fail
    elif kind == "flip":
        buf[draw(st.integers(0, len(buf) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "trailing":
        buf += b"\x00" * draw(st.integers(1, 70))
    elif kind == "truncated":
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    return bytes(buf)


def _expected_error(raw: bytes, max_message_bytes: int):
    """What the full checks say about `raw` as a leader append."""
    try:
        header = validate_batch(raw, 0, max_message_bytes, from_client=True)
    except StorageError as e:
        return type(e), str(e)
    if header.size_in_bytes != len(raw):
        return CorruptRecordError, None
    return None


@given(data=st.data(), kind=st.sampled_from(sorted(KINDS)), sim=st.booleans(), epoch=st.sampled_from([None, 0, 5]))
def test_append_accepts_and_refuses_exactly_what_the_full_checks_do(data, kind, sim, epoch):
    max_message_bytes = data.draw(st.sampled_from([1_048_588, 150]))
    config = LogConfig(max_message_bytes=max_message_bytes, index_interval_bytes=100)
    with tempfile.TemporaryDirectory() as tmp:
        fs = SimFileSystem() if sim else None
        log = Log.open(os.path.join(tmp, "t-0"), config, now_ms=0, fs=fs, checkpoint_files=False)
        stored = []
        for _ in range(data.draw(st.integers(1, 6))):
            raw = data.draw(mutations(data.draw(client_batches())))
            expected = _expected_error(raw, max_message_bytes)
            before = (log.log_end_offset, log.active_segment.size)
            if expected is None:
                base = log.append(KINDS[kind](raw), now_ms=1, leader_epoch=epoch)
                assert base == before[0]
                stored.append(as_stored(raw, base, epoch))
            else:
                with pytest.raises(expected[0]) as refused:
                    log.append(KINDS[kind](raw), now_ms=1, leader_epoch=epoch)
                if expected[1] is not None:
                    assert str(refused.value) == expected[1]
                else:
                    assert "append takes one batch" in str(refused.value)
                assert (log.log_end_offset, log.active_segment.size) == before
        assert log.read_bytes(0, 1 << 20) == b"".join(stored)
        log.close()


def _set(raw: bytes, fix_crc: bool = True, **fields) -> bytes:
    buf = bytearray(raw)
    for name, value in fields.items():
        offset, fmt = FIELDS[name]
        struct.pack_into(fmt, buf, offset, value)
    if fix_crc:
        _fix_crc(buf)
    return bytes(buf)


_GOOD = batch(3, value_size=20)
# One broken rule each (the CRC recomputed, so that rule is what fails).
BROKEN = {
    "magic 1": _set(_GOOD, magic=1),
    "batch_length below a header": _set(_GOOD, batch_length=48),
    "batch_length past the buffer": _GOOD[:-1],
    "shorter than a header": _GOOD[:60],
    "a second batch behind": _GOOD + _GOOD,
    "over max.message.bytes": batch(30, value_size=20),
    "CRC": _GOOD[:-1] + bytes([_GOOD[-1] ^ 1]),
    "records_count above last_offset_delta + 1": _set(_GOOD, records_count=4),
    "records_count below last_offset_delta + 1": _set(_GOOD, records_count=2),
    "no records, last_offset_delta -1": _set(_GOOD, records_count=0, last_offset_delta=-1),
    "codec 5": _set(_GOOD, attributes=5),
    "codec 7": _set(_GOOD, attributes=7),
    "control batch": _set(_GOOD, attributes=0x20),
    "idempotent without a sequence": _set(_GOOD, producer_id=7, base_sequence=-1),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("sim", [False, True], ids=["os", "sim"])
def test_each_broken_rule_is_refused_with_the_full_checks_message(tmp_path, rule, kind, sim):
    log = Log.open(
        str(tmp_path / "t-0"), LogConfig(max_message_bytes=600), now_ms=0, fs=SimFileSystem() if sim else None,
        checkpoint_files=False,
    )
    log.append(bytearray(_GOOD), now_ms=0)
    raw = BROKEN[rule]
    expected = _expected_error(raw, 600)
    assert expected is not None, rule
    with pytest.raises(expected[0]) as refused:
        log.append(KINDS[kind](raw), now_ms=0)
    assert expected[1] is None or str(refused.value) == expected[1]
    assert (log.log_end_offset, log.read_bytes(0, 1 << 20)) == (3, as_stored(_GOOD, 0))


def test_a_short_write_is_undone_and_the_next_append_succeeds(tmp_path):
    # RLIMIT_FSIZE makes the kernel write only up to the limit (a real
    # short write), then refuse with EFBIG: what a full disk does.
    log = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0)
    first = batch(3, value_size=100)
    log.append(bytearray(first), now_ms=0)
    size = log.active_segment.size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
        with pytest.raises(OSError) as failed:
            log.append(bytearray(batch(5, value_size=100)), now_ms=0)
        assert failed.value.errno == errno.EFBIG
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert (log.log_end_offset, log.active_segment.size, os.path.getsize(log.active_segment.log.path)) == (3, size, size)
    second = batch(2)
    assert log.append(bytearray(second), now_ms=0) == 3
    log.close()
    reopened = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0)
    assert reopened.read_bytes(0, 1 << 20) == as_stored(first, 0) + as_stored(second, 3)
    reopened.close()


def test_append_after_close_never_writes_into_a_reused_descriptor(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0)
    log.append(bytearray(batch(1)), now_ms=0)
    log.close()
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)  # likely the freed number
    try:
        with pytest.raises(OSError):
            log.append(bytearray(batch(1)), now_ms=0)
        assert os.fstat(other).st_size == 0
    finally:
        os.close(other)


def test_retention_of_batches_without_timestamps_counts_from_their_last_append(tmp_path):
    # With no record timestamps, segment age is the time of its last append.
    untimed = build_batch([(b"k", b"v", (), None)])
    config = LogConfig(segment_bytes=2 * len(untimed), retention_ms=1000)
    log = Log.open(str(tmp_path / "t-0"), config, now_ms=0)
    log.append(bytearray(untimed), now_ms=0)
    log.append(bytearray(untimed), now_ms=5000)
    log.append(bytearray(untimed), now_ms=5000)  # rolls: the first segment is full
    assert log.delete_old_segments(now_ms=5900) == 0
    assert log.delete_old_segments(now_ms=6001) == 1
    assert log.log_start_offset == 2
    log.close()
