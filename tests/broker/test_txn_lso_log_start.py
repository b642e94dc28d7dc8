"""The LSO a partition serves never falls below its log start offset: when
retention or DeleteRecords moves the log start past the first offset of a
transaction still open, read_committed reads start at the log start (as
Kafka bounds its first unstable offset)."""

from __future__ import annotations

from broker.shell.hosted_partition import LogTransactions
from storage.batch import build_batch
from storage.config import LogConfig
from storage.log import Log
from storage.sim_fs import SimFileSystem

TS = 1_700_000_000_000


def test_the_lso_is_bounded_by_the_log_start_offset():
    fs = SimFileSystem(seed=1)
    fs.makedirs("/data")
    log = Log.open("/data/t-0", LogConfig(segment_bytes=1 << 20), now_ms=0, fs=fs, producer_state=True)
    log.append(build_batch([(b"k", b"open", (), TS)], producer_id=7, producer_epoch=0, base_sequence=0,
                           is_transactional=True), now_ms=0)  # 0: a transaction left open
    for i in range(3):
        log.append(build_batch([(b"p", b"plain%d" % i, (), TS)]), now_ms=0)  # 1..3
    view = LogTransactions(log)
    assert view.unstable and view.last_stable_offset(4) == 0
    log.maybe_increment_log_start_offset(2)  # DeleteRecords past the open transaction's start
    assert view.last_stable_offset(4) == 2
    assert view.last_stable_offset(1) == 1  # never past the high watermark
    log.append_marker(7, 0, 0, commit=True, now_ms=0, leader_epoch=0)  # 4
    assert view.last_stable_offset(5) == 5
