"""The lag an exactly-once `raftka mirror` shows while its target cannot
take records: the records the source gained since are behind (the
consumer having read them does not make them copied), and the figure goes
back to 0 once the target has them."""

from __future__ import annotations

import re
import signal

from mirror_testing import ONE_BROKER, MirrorProcess, create, produce, read_committed, wait_until

from cluster import LocalCluster

STATUS = re.compile(r"\] mirroring: \d+ records mirrored, (\d+) behind")


def _behind(mirror: MirrorProcess, since: int) -> list[int]:
    return [int(m.group(1)) for line in mirror.reader.lines[since:] if (m := STATUS.search(line))]


def test_lag_counts_records_not_committed_on_a_paused_target(tmp_path) -> None:
    src = LocalCluster(tmp_path / "src", controllers=1, brokers=1, overrides=ONE_BROKER)
    tgt = LocalCluster(tmp_path / "tgt", controllers=1, brokers=1, overrides=ONE_BROKER)
    mirror = None
    paused = None
    try:
        src.start_all()
        tgt.start_all()
        src.wait_ready(120)
        tgt.wait_ready(120)
        create(src.bootstrap, "lagged", 1)
        produce(src.bootstrap, "lagged", [(0, b"k", str(i).encode(), [], 0) for i in range(50)])
        mirror = MirrorProcess(tmp_path / "mirror.err", "--source", src.bootstrap, "--target", tgt.bootstrap,
                               "--topics", "lagged", "--instance", "m", "--set",
                               "exactly.once.support=enabled").start(120)
        wait_until(lambda: len(read_committed(tgt.bootstrap, "source.lagged", 1, 1.0)[0]) == 50, 60,
                   "the first 50 records on the target")
        paused = tgt.brokers[0].node_id
        tgt.kill(paused, signal.SIGSTOP)
        mark = len(mirror.reader.lines)
        produce(src.bootstrap, "lagged", [(0, b"k", str(i).encode(), [], 0) for i in range(50, 250)])
        wait_until(lambda: any(b >= 200 for b in _behind(mirror, mark)), 60,
                   f"a status line with the 200 records not on the target behind: {_behind(mirror, mark)}")
        tgt.kill(paused, signal.SIGCONT)
        paused = None
        wait_until(lambda: len(read_committed(tgt.bootstrap, "source.lagged", 1, 1.0)[0]) == 250, 120,
                   "all 250 records on the target")
        mark = len(mirror.reader.lines)
        wait_until(lambda: _behind(mirror, mark)[-1:] == [0], 30, "the lag back to 0")
        assert mirror.stop() == 0
    finally:
        if paused is not None:
            tgt.kill(paused, signal.SIGCONT)
        if mirror is not None:
            mirror.ensure_dead()
        src.stop_all(20)
        tgt.stop_all(20)
