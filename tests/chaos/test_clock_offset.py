"""The clock nemesis' lever: `raftka.test.clock.offset.file` moves a node's wall clock.

Unit level: the offset comes from the file, is read again as the file
changes, and a file that holds no number leaves the offset as it was.
Process level: a real broker started with the key stamps LogAppendTime
records with its moved clock, and follows the file while it runs.
"""

from __future__ import annotations

import time
from pathlib import Path

from chaos.nemesis import CLOCK_FILE, Clocks
from cluster.launcher import LocalCluster
from common.clock import (
    OFFSET_FILE_KEY,
    OffsetWallClock,
    node_wall_clock,
    wall_clock_ms,
)


def settle() -> None:
    time.sleep(0.15)  # the offset file is read again at most every 100 ms


def test_the_offset_comes_from_the_file_and_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    clock = OffsetWallClock(path)
    assert abs(clock() - wall_clock_ms()) < 50  # no file: no offset
    path.write_text("-60000\n")
    settle()
    assert abs(clock() - (wall_clock_ms() - 60000)) < 50
    path.write_text("not a number")
    settle()
    assert clock.offset_ms == -60000 and abs(clock() - (wall_clock_ms() - 60000)) < 50
    path.write_text("0")
    settle()
    assert abs(clock() - wall_clock_ms()) < 50


def test_without_the_key_a_node_reads_the_plain_wall_clock(tmp_path: Path) -> None:
    assert node_wall_clock({}, tmp_path) is wall_clock_ms
    clock = node_wall_clock({OFFSET_FILE_KEY: "skew"}, tmp_path)
    assert isinstance(clock, OffsetWallClock) and clock.path == tmp_path / "skew"


def append_time(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Producer

    got: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(topic, b"x", on_delivery=lambda err, msg: got.append(msg.timestamp()[1]) if err is None else None)
    producer.flush(20)
    assert got, "the record was not acknowledged"
    return got[0]


def test_a_broker_stamps_records_with_its_moved_clock(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = LocalCluster(tmp_path / "cluster", controllers=1, brokers=1,
                           broker_overrides={OFFSET_FILE_KEY: CLOCK_FILE})
    broker = cluster.brokers[0]
    clocks = Clocks({broker.node_id: broker.log_dir})
    try:
        cluster.start_all()
        cluster.wait_ready(timeout_s=60)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("t", 1, 1, config={"message.timestamp.type": "LogAppendTime"})])["t"].result(30)
        assert abs(append_time(cluster.bootstrap, "t") - wall_clock_ms()) < 5000
        clocks.set(broker.node_id, 3_600_000 - 60_000)  # 59 minutes ahead
        settle()
        assert abs(append_time(cluster.bootstrap, "t") - (wall_clock_ms() + 3_540_000)) < 5000
        clocks.heal()
        settle()
        assert abs(append_time(cluster.bootstrap, "t") - wall_clock_ms()) < 5000
    finally:
        cluster.stop_all(timeout_s=20)
