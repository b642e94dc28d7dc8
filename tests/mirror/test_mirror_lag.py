"""The lag an exactly-once `raftka mirror` shows while its target cannot
take records: the records the source gained since are behind (the
consumer having read them does not make them copied), the seconds are the
age of the oldest of them (not the time since the last copied one), and
both go back to 0 once the target has them. `raftka mirror status` reads
the same figures from the clusters with the mirror stopped. On the same
clusters: a mirror whose source consumer is fenced for good (another
member took its static group membership) replaces it and goes on."""

from __future__ import annotations

import json
import re
import signal
import time

from confluent_kafka import Consumer, KafkaException

from cluster_testing import run_cli
from mirror_testing import ONE_BROKER, MirrorProcess, create, produce, read_committed, wait_until

from cluster import LocalCluster

STATUS = re.compile(r"\] mirroring: \d+ records mirrored, (\d+) behind \(([\d.]+) s\)")


def _lag(mirror: MirrorProcess, since: int) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(2))) for line in mirror.reader.lines[since:] if (m := STATUS.search(line))]


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
        # The last copied record gets older than the first one not copied: the
        # seconds behind must count from the latter.
        time.sleep(4)
        mark = len(mirror.reader.lines)
        appended = time.time()
        produce(src.bootstrap, "lagged", [(0, b"k", str(i).encode(), [], 0) for i in range(50, 250)])
        lagged = wait_until(lambda: [(b, s, time.time() - appended) for b, s in _lag(mirror, mark)
                                     if b >= 200 and s >= 2], 60,
                            f"a status line with the 200 records not on the target behind: {_lag(mirror, mark)}")
        _, seconds, age = lagged[0]
        assert seconds <= age + 1.0, f"{seconds} s behind, the oldest record not copied is {age:.1f} s old"
        tgt.kill(paused, signal.SIGCONT)
        paused = None
        wait_until(lambda: len(read_committed(tgt.bootstrap, "source.lagged", 1, 1.0)[0]) == 250, 120,
                   "all 250 records on the target")
        mark = len(mirror.reader.lines)
        wait_until(lambda: _lag(mirror, mark)[-1:] == [(0, 0.0)], 30, f"the lag back to 0: {_lag(mirror, mark)}")

        # Another consumer joins as the mirror's static member (as the mirror's own
        # rejoin can look after a coordinator failover): the mirror's consumer is
        # fenced for good (librdkafka's fatal error), replaced, and the copy goes on.
        impostor = Consumer({"bootstrap.servers": src.bootstrap, "group.id": "mirror-source-target",
                             "group.instance.id": "mirror-source-target-m", "session.timeout.ms": 10000})
        impostor.subscribe(["lagged"])

        def replaced() -> bool:
            try:
                impostor.poll(0.2)
            except KafkaException:
                pass  # fenced in turn by the mirror's new consumer
            return any("failed for good" in line for line in mirror.reader.lines[mark:])

        try:
            wait_until(replaced, 30, "the mirror's fenced consumer replaced")
        finally:
            impostor.close()
        produce(src.bootstrap, "lagged", [(0, b"k", str(i).encode(), [], 0) for i in range(250, 255)])
        wait_until(lambda: len(read_committed(tgt.bootstrap, "source.lagged", 1, 1.0)[0]) == 255, 60,
                   f"the 5 records written after the fencing on the target: {mirror.output()[-2000:]}")
        assert mirror.stop() == 0

        # Stopped: 10 more records wait; `status` counts them and the age of the first.
        appended = time.time()
        produce(src.bootstrap, "lagged", [(0, b"k", str(i).encode(), [], 0) for i in range(255, 265)])
        time.sleep(2)
        out = run_cli("mirror", "status", "--json", "--source", src.bootstrap, "--target", tgt.bootstrap,
                      "--topics", "lagged", "--set", "exactly.once.support=enabled")
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout.splitlines()[0])
        age = time.time() - appended
        assert row["records_behind"] == 10, row
        assert 2 <= row["seconds_behind"] <= age + 0.5, (row, age)
    finally:
        if paused is not None:
            tgt.kill(paused, signal.SIGCONT)
        if mirror is not None:
            mirror.ensure_dead()
        src.stop_all(20)
        tgt.stop_all(20)
