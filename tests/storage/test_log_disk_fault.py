"""The disk fault switch (`raftka.test.disk.fault.file`, the `eio` nemesis's lever).

While the switch file says `eio`, a log on `FaultSwitchFileSystem` fails
every append (the inline fast path too), flush and checkpoint with EIO and
is left as it was; reads still answer. Once the file is emptied, appends
go on at the offset they stopped at, and the log reopens with every
record it acknowledged. Without the setting the broker gets the plain
`OsFileSystem`, whose files the log writes to directly.
"""

from __future__ import annotations

import errno
import time

import pytest

from storage.batch import build_batch
from storage.config import LogConfig
from storage.fault_fs import FaultSwitchFileSystem, log_file_system
from storage.fs import OpenFileCache, OsFileSystem
from storage.log import Log


def batch(i: int) -> bytearray:
    return bytearray(build_batch([(b"k", b"value-%d" % i, (), 1_700_000_000_000 + i)]))


def settle() -> None:
    time.sleep(0.15)  # the switch file is read again at most every 100 ms


def test_without_the_setting_the_logs_get_the_plain_file_system(tmp_path):
    fs = log_file_system(str(tmp_path), "")
    assert type(fs) is OsFileSystem
    assert isinstance(log_file_system(str(tmp_path), "fault"), FaultSwitchFileSystem)


def test_writes_fail_with_eio_while_the_switch_is_on_and_resume_after(tmp_path):
    switch_file = tmp_path / "fault"
    fs = log_file_system(str(tmp_path), "fault", OpenFileCache(16))
    log = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0, fs=fs)
    for i in range(3):
        assert log.append(batch(i), now_ms=0) == i
    switch_file.write_text("eio\n")
    settle()
    for attempt in range(3):
        with pytest.raises(OSError) as failed:
            log.append(batch(100 + attempt), now_ms=0)
        assert failed.value.errno == errno.EIO
    with pytest.raises(OSError):
        log.flush()
    with pytest.raises(OSError):
        log.write_checkpoints()
    # The log is as it was: three records, all readable.
    assert log.log_end_offset == 3
    data = bytes(log.read_bytes(0, 1 << 20))
    assert [b"value-%d" % i in data for i in range(3)] == [True] * 3 and b"value-100" not in data
    switch_file.write_text("")
    settle()
    assert log.append(batch(3), now_ms=0) == 3
    log.close()
    reopened = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0, fs=OsFileSystem())
    assert reopened.log_end_offset == 4
    data = bytes(reopened.read_bytes(0, 1 << 20))
    assert all(b"value-%d" % i in data for i in range(4)) and b"value-10" not in data
    reopened.close()


def test_a_switch_file_with_another_word_changes_nothing(tmp_path, caplog):
    switch_file = tmp_path / "fault"
    fs = log_file_system(str(tmp_path), "fault")
    log = Log.open(str(tmp_path / "t-0"), LogConfig(), now_ms=0, fs=fs)
    switch_file.write_text("full")
    settle()
    assert log.append(batch(0), now_ms=0) == 0
    assert "write `eio` (writes fail) or nothing" in caplog.text
    log.close()


def test_eio_with_a_dir_fails_only_the_writes_under_that_dir(tmp_path):
    """`eio <dir>`: one of a broker's log dirs fails, the other writes on."""
    switch_file = tmp_path / "fault"
    fs = log_file_system(str(tmp_path), "fault", OpenFileCache(16))
    failing = Log.open(str(tmp_path / "d1" / "t-0"), LogConfig(), now_ms=0, fs=fs)
    healthy = Log.open(str(tmp_path / "d2" / "t-0"), LogConfig(), now_ms=0, fs=fs)
    switch_file.write_text("eio d1\n")  # relative to the switch file's directory
    settle()
    with pytest.raises(OSError) as failed:
        failing.append(batch(0), now_ms=0)
    assert failed.value.errno == errno.EIO
    assert healthy.append(batch(0), now_ms=0) == 0
    switch_file.write_text(f"eio {tmp_path / 'd2'}\n")  # an absolute dir
    settle()
    assert failing.append(batch(1), now_ms=0) == 0
    with pytest.raises(OSError):
        healthy.append(batch(1), now_ms=0)
