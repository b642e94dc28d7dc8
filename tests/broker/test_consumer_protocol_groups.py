"""KIP-848 consumer groups with a real librdkafka consumer (`group.protocol=consumer`).

The broker computes the assignment (ConsumerGroupHeartbeat): three
consumers split twelve partitions; a fourth joins and the others keep
consuming what they keep (incremental revocation, no stop-the-world);
commits made with the member epoch are read back; the partition's records
alone rebuild the group (what a coordinator that takes over does)."""

from __future__ import annotations

import datetime
import random
import threading
import time

import trio
from broker_testing import in_thread, start_broker

from broker.core.group import (
    OFFSETS_TOPIC_NAME,
    GroupCoordinatorConfig,
    GroupCoordinatorShard,
)
from storage.batch import iter_batch_headers, iter_records

PARTITIONS = 12
GROUP_CONFIG = GroupCoordinatorConfig(offsets_topic_num_partitions=1, offsets_topic_replication_factor=1,
                                      group_consumer_heartbeat_interval_ms=300,
                                      group_consumer_session_timeout_ms=6000)


def member(bootstrap: str, name: str, stop: threading.Event, assignments: dict) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kc", "client.id": name,
                         "group.protocol": "consumer", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["t"])
    try:
        while not stop.is_set():
            consumer.poll(0.05)
            assignments[name] = frozenset(tp.partition for tp in consumer.assignment())
        consumer.commit(offsets=[TopicPartition("t", p, 100 + p) for p in assignments[name]], asynchronous=False)
    finally:
        consumer.close()


def wait_for_split(assignments: dict, names: list[str], timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = {n: assignments.get(n, frozenset()) for n in names}
        parts = sorted(p for s in snap.values() for p in s)
        if all(snap.values()) and parts == list(range(PARTITIONS)):
            return snap
        time.sleep(0.05)
    raise AssertionError(f"the group never split the partitions: {assignments}")


async def test_librdkafka_consumer_protocol_assigns_incrementally_and_commits(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GROUP_CONFIG)
    await running.create_topic("t", partitions=PARTITIONS)
    names = ["c0", "c1", "c2"]
    stop = {n: threading.Event() for n in names + ["c3"]}
    assignments: dict = {}
    async with trio.open_nursery() as members:
        for n in names:
            members.start_soon(in_thread, member, running.bootstrap, n, stop[n], assignments)
        first = await in_thread(wait_for_split, assignments, names)
        assert sorted(len(s) for s in first.values()) == [4, 4, 4]
        # A fourth member: each of the three gives up one partition and keeps the rest throughout.
        samples: list[dict] = []

        def watch() -> dict:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                samples.append({n: assignments.get(n, frozenset()) for n in names})
                snap = {n: assignments.get(n, frozenset()) for n in names + ["c3"]}
                parts = sorted(p for s in snap.values() for p in s)
                if all(snap.values()) and parts == list(range(PARTITIONS)):
                    return snap
                time.sleep(0.01)
            raise AssertionError(f"the fourth member never got partitions: {assignments}")

        joined = time.monotonic()
        members.start_soon(in_thread, member, running.bootstrap, "c3", stop["c3"], assignments)
        second = await in_thread(watch)
        # Sampled every 10 ms: a partition a member keeps never leaves its assignment.
        gapless = all(first[n] & second[n] <= sample[n] for sample in samples for n in names)
        print(f"fourth member assigned after {time.monotonic() - joined:.2f} s; "
              f"kept partitions stayed assigned in all {len(samples)} samples: {gapless}")
        assert sorted(len(s) for s in second.values()) == [3, 3, 3, 3]
        assert gapless, "a member stopped owning a partition it keeps while the fourth joined"
        for n in names:
            assert second[n] <= first[n], "a kept member was given a partition it did not have"
        # The coordinator's shard is dropped and rebuilt from its log (what
        # a new coordinator does): the group goes on with the same epoch,
        # and its members keep their partitions.
        coordinator = running.broker.coordinator
        epoch = coordinator.shards[0].shard.consumer.groups["kc"].group_epoch
        coordinator._unload(coordinator.shards[0], "a test moves the coordinator")
        coordinator.on_metadata_update()
        with trio.fail_after(10):
            while 0 not in coordinator.shards or not coordinator.shards[0].shard.loaded:
                await trio.sleep(0.01)
        reloaded = coordinator.shards[0].shard.consumer.groups["kc"]
        assert reloaded.group_epoch == epoch and len(reloaded.members) == 4
        await trio.sleep(2.0)  # a few heartbeats against the rebuilt shard
        assert {n: assignments[n] for n in second} == second
        assert coordinator.shards[0].shard.consumer.groups["kc"].group_epoch == epoch
        for event in stop.values():
            event.set()
    shard = running.broker.coordinator.shards[0].shard
    got = {p: o.offset for (t, p), o in shard.offsets.items("kc")}
    assert got == {p: 100 + p for p in range(PARTITIONS)}
    # The log alone rebuilds the consumer group and its offsets.
    log = running.partition(OFFSETS_TOPIC_NAME, 0).log
    rebuilt = GroupCoordinatorShard(0, GROUP_CONFIG, random.Random(0))
    data = log.read_bytes(log.log_start_offset, 1 << 30)
    for position, _header in iter_batch_headers(data):
        for record in iter_records(data, position):
            rebuilt.replay(record.key, record.value)
    group = rebuilt.consumer.groups["kc"]
    live = shard.consumer.groups["kc"]
    assert group.group_epoch == live.group_epoch and set(group.members) == set(live.members)
    assert "kc" not in rebuilt.groups  # its offsets do not make it a classic group
    assert {p: o.offset for (t, p), o in rebuilt.offsets.items("kc")} == got
    running.stop()


class MemberProcess:
    """One `consumer_protocol_member.py` process and what it printed."""

    def __init__(self, bootstrap: str, name: str) -> None:
        import os
        import subprocess
        import sys
        from pathlib import Path

        here = Path(__file__).parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent.parent), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(here / "consumer_protocol_member.py"), bootstrap, "kp",
                                      "t", name], stdout=subprocess.PIPE, text=True, env=env)
        self.assigned: frozenset = frozenset()
        self.records: list[tuple[int, int]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            kind, *rest = line.split()
            if kind == "assigned":
                self.assigned = frozenset(int(p) for p in rest[0].split(",")) if rest else frozenset()
            else:
                self.records.append((int(rest[0]), int(rest[1])))

    def kill(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def produce(bootstrap: str, per_partition: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        for i in range(per_partition):
            producer.produce("t", value=b"v%d" % i, partition=p)
    assert producer.flush(30) == 0


async def test_killed_member_partitions_move_after_session_timeout_and_resume_exactly(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GROUP_CONFIG)
    await running.create_topic("t", partitions=PARTITIONS)
    await in_thread(produce, running.bootstrap, 5)
    members = [MemberProcess(running.bootstrap, f"p{i}") for i in range(3)]
    try:
        def until(cond, timeout_s: float = 60.0) -> float:
            start = time.monotonic()
            while not cond():
                assert time.monotonic() - start < timeout_s, [sorted(m.assigned) for m in members]
                time.sleep(0.02)
            return time.monotonic() - start

        def split(ms) -> bool:
            parts = sorted(p for m in ms for p in m.assigned)
            return all(m.assigned for m in ms) and parts == list(range(PARTITIONS))

        await in_thread(until, lambda: split(members) and sum(len(m.records) for m in members) == 5 * PARTITIONS)
        victim, survivors = members[0], members[1:]
        lost = victim.assigned
        victim.kill()
        await in_thread(produce, running.bootstrap, 5)
        moved_s = await in_thread(until, lambda: split(survivors))
        print(f"killed member's partitions moved after {moved_s:.2f} s (session timeout 6 s)")
        # Not before the session timeout (6 s here), and not long after it.
        assert 4.0 < moved_s < 15.0, moved_s
        await in_thread(until, lambda: sum(len(m.records) for m in members) >= 10 * PARTITIONS)
        # Committed offsets resume exactly: every record of the victim's
        # partitions after its last commit is read once by the new owner.
        seen = [r for m in members for r in m.records]
        assert sorted(seen) == sorted((p, o) for p in range(PARTITIONS) for o in range(10))
        assert lost
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.kill()
    running.stop()


def static_member(bootstrap: str, name: str, stop: threading.Event, assignments: dict) -> None:
    """A librdkafka consumer-protocol member with `group.instance.id`:
    closing it is a temporary leave (member epoch -2)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ks", "client.id": name,
                         "group.instance.id": name, "group.protocol": "consumer",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe(["t"])
    try:
        while not stop.is_set():
            consumer.poll(0.05)
            assignments[name] = frozenset(tp.partition for tp in consumer.assignment())
    finally:
        consumer.close()
        assignments[name] = frozenset()


async def test_static_member_restarts_within_session_timeout_without_rebalance(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GROUP_CONFIG)
    await running.create_topic("t", partitions=PARTITIONS)
    names = ["s0", "s1", "s2"]
    stop = {n: threading.Event() for n in names}
    assignments: dict = {}
    async with trio.open_nursery() as members:
        for n in names:
            members.start_soon(in_thread, static_member, running.bootstrap, n, stop[n], assignments)
        try:
            await static_member_checks(running, nursery, names, stop, assignments)
        finally:
            # A failed assert must not leave consumer threads the nursery waits for.
            for event in stop.values():
                event.set()
    running.stop()


async def static_member_checks(running, nursery, names, stop, assignments) -> None:
    from kio.schema.consumer_group_heartbeat.v1 import request as hb
    from kio.schema.errors import ErrorCode

    first = await in_thread(wait_for_split, assignments, names, 30.0)
    group = running.broker.coordinator.shards[0].shard.consumer.groups["ks"]
    epoch = group.group_epoch
    # A second live consumer with a held instance id is refused, as Kafka does.
    conn = await running.connect(nursery)
    refused = await conn.request(hb.ConsumerGroupHeartbeatRequest(
        group_id="ks", member_id="intruder", member_epoch=0, instance_id="s1",
        rebalance_timeout=datetime.timedelta(seconds=30), subscribed_topic_names=("t",), topic_partitions=()))
    assert refused.error_code == ErrorCode.unreleased_instance_id, refused
    assert "s1" in refused.error_message
    # s0 closes (a temporary leave) and comes back within the 6 s session timeout.
    samples: list[dict] = []
    stop["s0"].set()

    def watch_restart() -> dict:
        while assignments.get("s0"):
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        restarted = False
        while time.monotonic() < deadline:
            samples.append({n: assignments.get(n, frozenset()) for n in names[1:]})
            if not restarted and time.monotonic() > deadline - 29:
                restarted = True
                stop["s0"] = threading.Event()
                threading.Thread(target=static_member, daemon=True,
                                 args=(running.bootstrap, "s0", stop["s0"], assignments)).start()
            if restarted and assignments.get("s0") == first["s0"]:
                return {n: assignments.get(n, frozenset()) for n in names}
            time.sleep(0.01)
        raise AssertionError(f"the restarted static member never got its partitions back: {assignments}")

    started = time.monotonic()
    again = await in_thread(watch_restart)
    print(f"static member back with its partitions after {time.monotonic() - started:.2f} s")
    assert again == first
    # The others never lost a partition, and the group epoch did not move (no rebalance).
    assert all(first[n] <= sample[n] for sample in samples for n in names[1:]), "a kept member lost a partition"
    assert group.group_epoch == epoch
    assert sorted(m.instance_id for m in group.members.values()) == names


async def test_partition_racks_come_from_the_brokers_racks(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GROUP_CONFIG, rack="r1")
    await running.create_topic("t", partitions=2)
    coordinator = running.broker.coordinator
    topics = coordinator._topic_metadata()
    topic_id = topics["t"][0]
    assert coordinator._partition_racks[(topic_id, 0)] == coordinator._partition_racks[(topic_id, 1)] == {"r1"}
    running.stop()
