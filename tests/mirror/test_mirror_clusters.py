"""`raftka mirror` between real clusters: a ZooKeeper-mode raftka (source)
and a KRaft raftka (target), one broker each, real confluent-kafka clients,
the mirror as its own process.

What a user would check after a migration: every record arrived in its
partition with its key, value, headers and timestamp; the topic configs
and later partition increases followed; a consumer group moves to the
target and carries on where it stopped; a mirror killed at any moment
loses nothing; two clusters mirroring each other do not loop; a refused
record is reported and retried, never skipped.

The SIGKILL test kills 3 times by default, 10 times with RAFTKA_SOAK=1.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import pytest
from cluster_testing import run_cli
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions
from mirror_testing import (ONE_BROKER, MirrorProcess, create, high_watermarks, produce, read_all, read_committed,
                            wait_until)

from cluster import LocalCluster
from mirror.offsets import Checkpoint
from common.wire.ports import free_ports

SOAK = os.environ.get("RAFTKA_SOAK") == "1"
BASE_TS = 1_700_000_000_000
FAST = ["--set", "emit.checkpoints.interval.seconds=1", "--set", "refresh.topics.interval.seconds=2",
        "--set", "offset.flush.interval.ms=300"]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    from quorum.zookeeper.ensemble import zookeeper_missing_reason

    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"the source runs in ZooKeeper mode and needs a local ZooKeeper: {reason}")
    base = tmp_path_factory.mktemp("mirror")
    # the source's cleaner looks for work every 200 ms: the compacted topic has gaps before it is mirrored
    zk = LocalCluster(base / "zk", controllers=1, brokers=1, mode="zk", zookeeper_tick_time_ms=500,
                      overrides={**ONE_BROKER, "log.cleaner.backoff.ms": "200",
                                 "log.cleaner.min.cleanable.ratio": "0.01"})
    kr = LocalCluster(base / "kraft", controllers=1, brokers=1, overrides=ONE_BROKER)
    try:
        zk.start_all()
        kr.start_all()
        zk.wait_ready(120)
        kr.wait_ready(120)
        yield zk.bootstrap, kr.bootstrap
    finally:
        zk.stop_all(20)
        kr.stop_all(20)


@pytest.fixture
def mirrors(tmp_path):
    started: list[MirrorProcess] = []

    def start(*args: str, flows: int = 1) -> MirrorProcess:
        m = MirrorProcess(tmp_path / f"mirror-{len(started)}.err", *args, flows=flows)
        started.append(m)
        return m.start()

    yield start
    for m in started:
        m.ensure_dead()


def _records(n: int, partitions: int, keys: int, tag: str) -> list[tuple]:
    return [(i % partitions, f"k{i % keys}".encode(), f"{tag}-{i}".encode(), [("seq", str(i).encode()),
             ("origin", b"zk")], BASE_TS + i) for i in range(n)]


def _group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    except KafkaException:
        return {}
    return {p.partition: p.offset for p in result.topic_partitions if p.topic == topic and p.offset >= 0}


def _consume(bootstrap: str, group: str, topic: str, count: int | None, timeout: float = 60) -> list[bytes]:
    """Values a group member reads from its committed offsets: `count` of
    them, or (None) until the topic's end; commits what it read."""
    ends = high_watermarks(bootstrap, topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if count is not None and len(out) >= count:
                break
            assigned = c.assignment()
            if count is None and assigned and all(
                    max(tp.offset, 0) >= ends.get(tp.partition, 0) for tp in c.committed(assigned, timeout=10)):
                break
            m = c.poll(0.2)
            if m is None or m.error() is not None:
                continue
            out.append(m.value())
            c.commit(message=m, asynchronous=False)
        return out
    finally:
        c.close()


def _consume_assigned(bootstrap: str, group: str, topic: str, partitions: int, count: int) -> list[bytes]:
    """`count` values read by a group member that assigns itself the
    partitions (no join: quicker), committing what it read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
                c.commit(message=m, asynchronous=False)
        return out
    finally:
        c.close()


def test_zk_mode_to_kraft_keeps_records_configs_and_moves_a_group(clusters, mirrors) -> None:
    src, tgt = clusters
    create(src, "orders", 3)
    create(src, "profiles", 2, {"cleanup.policy": "compact", "retention.ms": "3600000", "segment.bytes": "2048"})
    orders = _records(600, 3, 37, "o")
    produce(src, "orders", orders)
    profiles = _records(200, 2, 10, "p")
    for i in range(0, 200, 20):  # batches of their own, so that 2 KiB segments roll
        produce(src, "profiles", profiles[i:i + 20])
    # compacted on the source first, so the mirror meets offset gaps (and syncs around them)
    wait_until(lambda: sum(len(v) for v in read_all(src, "profiles").values()) < 200, 30, "profiles compacted")
    first_half = _consume_assigned(src, "billing", "orders", 3, 300)
    assert len(first_half) == 300

    mirror = mirrors("--source", src, "--target", tgt, "--topics", "orders|profiles", "--set",
                     "sync.group.offsets.enabled=true", "--set", "sync.group.offsets.interval.seconds=1", *FAST)
    for topic in ("orders", "profiles"):
        source = read_all(src, topic)
        counts = {p: len(rs) for p, rs in source.items()}  # the target's offsets have no gaps
        wait_until(lambda topic=topic, counts=counts: high_watermarks(tgt, f"source.{topic}") == counts, 60,
                   f"source.{topic} on the target caught up")
        target = read_all(tgt, f"source.{topic}")
        assert {p: [r[1:] for r in rs] for p, rs in target.items()} == {p: [r[1:] for r in rs]
                                                                       for p, rs in source.items()}

    # the configs that matter came along; later partitions follow
    admin = AdminClient({"bootstrap.servers": tgt})
    configs = admin.describe_configs([ConfigResource("TOPIC", "source.profiles")])
    entries = next(iter(configs.values())).result(30)
    assert (entries["cleanup.policy"].value, entries["retention.ms"].value) == ("compact", "3600000")
    src_admin = AdminClient({"bootstrap.servers": src})  # referenced until the answer comes
    src_admin.create_partitions([NewPartitions("orders", 4)])["orders"].result(30)
    change = ConfigResource("TOPIC", "profiles", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    next(iter(src_admin.incremental_alter_configs([change]).values())).result(30)
    wait_until(lambda: len(high_watermarks(tgt, "source.orders")) == 4, 30, "source.orders grew to 4 partitions")

    def retention() -> str:
        resource = ConfigResource("TOPIC", "source.profiles")
        return next(iter(admin.describe_configs([resource]).values())).result(30)["retention.ms"].value

    wait_until(lambda: retention() == "7200000", 30, "the source's config change followed")

    # the group's offsets arrive on the target, translated, and it finishes there
    source_offsets = _group_offsets(src, "billing", "orders")
    wait_until(lambda: _group_offsets(tgt, "billing", "source.orders") == source_offsets, 30,
               f"billing's offsets {source_offsets} synced to the target")
    checkpoints = [Checkpoint.decode(r[1], r[2]) for rs in read_all(tgt, "source.checkpoints.internal").values()
                   for r in rs]
    assert {(c.partition, c.downstream) for c in checkpoints if c.group == "billing"} >= set(source_offsets.items())
    heartbeats = [r for rs in read_all(tgt, "heartbeats").values() for r in rs]
    assert heartbeats and heartbeats[-1][1] == b"\x00\x06source\x00\x06target"  # MM2's key: the two aliases
    second_half = _consume(tgt, "billing", "source.orders", None)
    values = [r[2] for r in orders]
    assert sorted(first_half + second_half) == sorted(values), "every record read once across the two clusters"

    status = run_cli("mirror", "status", "--source", src, "--target", tgt, "--topics", "orders|profiles", "--json")
    assert status.returncode == 0, status.stderr
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert {r["topic"] for r in rows} == {"orders", "profiles"}
    assert all(r["records_behind"] == 0 for r in rows), rows
    assert mirror.stop() == 0


def _owned(admin: AdminClient, group: str) -> list[int]:
    """Partitions each member of `group` owns."""
    try:
        desc = admin.describe_consumer_groups([group])[group].result(30)
    except KafkaException:
        return []
    return [len(m.assignment.topic_partitions) for m in desc.members]


def test_two_processes_share_the_work_and_sigkill_loses_nothing(clusters, mirrors) -> None:
    """Two mirror processes share a topic's partitions; one of them, picked
    at random, is SIGKILLed at a random moment and started again, while a
    producer keeps writing: every record arrives, in order per partition."""
    src, tgt = clusters
    create(src, "stream", 4)
    stop = threading.Event()
    sent: list[int] = []

    def write() -> None:
        p = Producer({"bootstrap.servers": src, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
        i = 0
        while not stop.is_set():
            p.produce("stream", key=str(i % 11).encode(), value=str(i).encode(), partition=i % 4)
            i += 1
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.05)
        assert p.flush(60) == 0
        sent.append(i)

    args = ["--source", src, "--target", tgt, "--topics", "stream", "--set", "group.id=mirror-kill-test", *FAST]
    running = {name: mirrors(*args, "--instance", name) for name in ("a", "b")}
    admin = AdminClient({"bootstrap.servers": src})
    wait_until(lambda: sorted(_owned(admin, "mirror-kill-test")) == [2, 2], 60, "each process owns 2 partitions")
    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(7)
    try:
        for _ in range(10 if SOAK else 3):
            time.sleep(rng.uniform(0.2, 2.5))
            name = rng.choice(sorted(running))
            running[name].kill()
            running[name] = mirrors(*args, "--instance", name)
    finally:
        stop.set()
        writer.join(60)
    wait_until(lambda: sum(high_watermarks(tgt, "source.stream").values()) >= sent[0], 90,
               "the target holds at least every record written")
    source, target = read_all(src, "stream"), read_all(tgt, "source.stream")
    duplicates = 0
    for p, records in source.items():
        seen, in_order = set(), []
        for r in target[p]:
            if r[2] in seen:
                duplicates += 1
            else:
                seen.add(r[2])
                in_order.append(r[2])
        assert in_order == [r[2] for r in records], f"partition {p}: records lost or out of order"
    assert sent[0] == sum(len(v) for v in source.values())
    print(f"{sent[0]} records, {duplicates} written twice across the kills")
    assert all(m.stop() == 0 for m in running.values())


def test_two_clusters_mirroring_each_other_do_not_loop(clusters, mirrors, tmp_path) -> None:
    src, tgt = clusters
    create(src, "cyc", 1)
    create(tgt, "cyc", 1)
    produce(src, "cyc", [(0, b"k", b"from-zk", [], BASE_TS)] * 5)
    produce(tgt, "cyc", [(0, b"k", b"from-kraft", [], BASE_TS)] * 7)
    config = tmp_path / "mm2.properties"
    config.write_text(f"clusters = zk, kr\nzk.bootstrap.servers = {src}\nkr.bootstrap.servers = {tgt}\n"
                      "zk->kr.enabled = true\nkr->zk.enabled = true\ntopics = .*cyc\n"
                      "refresh.topics.interval.seconds = 1\nemit.heartbeats.enabled = false\n")
    m = mirrors("--config", str(config), flows=2)
    wait_until(lambda: sum(high_watermarks(tgt, "zk.cyc").values()) == 5, 60, "zk.cyc on kraft")
    wait_until(lambda: sum(high_watermarks(src, "kr.cyc").values()) == 7, 60, "kr.cyc on zk")
    time.sleep(3)  # three topic refreshes: a looping mirror would have made kr.zk.cyc / zk.kr.cyc by now
    for bootstrap in (src, tgt):
        topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
        assert sorted(t for t in topics if t.endswith("cyc")) in (["cyc", "kr.cyc"], ["cyc", "zk.cyc"])
    assert sum(high_watermarks(tgt, "zk.cyc").values()) == 5
    assert m.stop() == 0


def test_a_refused_record_is_reported_and_retried_not_skipped(clusters, mirrors) -> None:
    src, tgt = clusters
    create(src, "big", 2)
    # the target's topic exists already, with a limit the source's records exceed
    create(tgt, "source.big", 2, {"max.message.bytes": "3000"})
    produce(src, "big", [(0, b"b", b"L" * 6000, [], BASE_TS + 1), (0, b"c", b"small", [], BASE_TS + 2),
                         (1, b"d", b"other partition", [], BASE_TS + 3)])
    m = mirrors("--source", src, "--target", tgt, "--topics", "big", "--set", "group.id=mirror-big-test", *FAST)
    line = wait_until(lambda: next((x for x in m.reader.lines if "refused the record big[0]@0" in x), None), 30,
                      "the refusal reported")
    assert "MSG_SIZE_TOO_LARGE" in line and "retrying" in line
    # the other partition goes on; the refused one does not write past its refused record
    wait_until(lambda: high_watermarks(tgt, "source.big").get(1) == 1, 30, "partition 1 mirrored meanwhile")
    time.sleep(2)
    assert read_all(tgt, "source.big")[0] == [], "the record after the refused one was not written past it"
    # The operator's fix: drop the target topic; the mirror creates it again with the source's limits.
    # (Raising the existing topic's max.message.bytes would be the lighter fix, but a raftka broker
    # applies that config to a live partition only after a restart.)
    admin = AdminClient({"bootstrap.servers": tgt})
    admin.delete_topics(["source.big"])["source.big"].result(30)
    wait_until(lambda: high_watermarks(tgt, "source.big").get(0, 0) >= 2, 60, "the records went through")
    values = [r[2] for r in read_all(tgt, "source.big")[0]]
    assert list(dict.fromkeys(values)) == [b"L" * 6000, b"small"]
    assert m.stop() == 0


def test_an_unreachable_cluster_is_named_and_retried(tmp_path) -> None:
    (port,) = free_ports(1, "127.0.0.1")
    m = MirrorProcess(tmp_path / "unreachable.err", "--source", f"127.0.0.1:{port}", "--target",
                      f"127.0.0.1:{port}").launch()
    try:
        line = wait_until(lambda: next((x for x in m.reader.lines if "does not answer" in x), None), 60,
                          "the unreachable source named")
        assert f"cluster source at 127.0.0.1:{port}" in line and "retrying in" in line
        assert m.stop() == 0
    finally:
        m.ensure_dead()


def test_exactly_once_sigkill_neither_loses_nor_duplicates(clusters, mirrors) -> None:
    src, tgt = clusters
    create(src, "eos", 2)
    stop = threading.Event()
    sent: list[int] = []

    def write() -> None:
        p = Producer({"bootstrap.servers": src, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
        i = 0
        while not stop.is_set():
            p.produce("eos", value=str(i).encode(), partition=i % 2)
            i += 1
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.05)
        assert p.flush(60) == 0
        sent.append(i)

    args = ["--source", src, "--target", tgt, "--topics", "eos", "--instance", "e", "--set",
            "group.id=mirror-eos-test", "--set", "exactly.once.support=enabled", *FAST]
    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(11)
    try:
        for _ in range(10 if SOAK else 3):
            m = mirrors(*args)
            time.sleep(rng.uniform(0.2, 2.5))
            m.kill()
    finally:
        stop.set()
        writer.join(60)
    m = mirrors(*args)
    source = read_all(src, "eos")
    wait_until(lambda: sum(map(len, read_committed(tgt, "source.eos", 2, 1.0).values())) >= sent[0], 90,
               "every record committed on the target")
    target = read_committed(tgt, "source.eos", 2)
    for p, records in source.items():
        assert target[p] == [r[2] for r in records], f"partition {p}: not exactly once, in order"
    assert m.stop() == 0


def test_a_client_setting_passed_through_reaches_the_broker(clusters, mirrors) -> None:
    src, tgt = clusters
    create(src, "passthrough", 1)
    m = mirrors("--source", src, "--target", tgt, "--topics", "passthrough", "--set", "group.id=mirror-passthrough",
                "--set", "source.consumer.client.id=mirror-eu-reader", "--set", "source.consumer.fetch.max.bytes=2000000",
                *FAST)
    admin = AdminClient({"bootstrap.servers": src})

    def members() -> list[str]:
        group = admin.describe_consumer_groups(["mirror-passthrough"])["mirror-passthrough"].result(30)
        return [member.client_id for member in group.members]

    # the broker records each member's client.id, as the client sent it
    assert wait_until(members, 30, "the mirror's consumer in its group") == ["mirror-eu-reader"]
    assert m.stop() == 0
