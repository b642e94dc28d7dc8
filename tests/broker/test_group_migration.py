"""Online upgrade and downgrade of a group between the classic protocol
and KIP-848's consumer protocol, with real librdkafka consumers.

Three classic consumers read a stream from six partitions; they are
restarted one by one with `group.protocol=consumer` and then back again.
Throughout, every produced record is consumed (at least once, no gaps) and
the committed offsets carry over; halfway the group holds both kinds of
members, which the describe command shows, and a coordinator that takes
over rebuilds the mixed group from `__consumer_offsets`. A static member
rolled back to the classic protocol under its group.instance.id turns the
group classic again without a rebalance, as both admin clients show."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import trio
from broker_testing import in_thread, start_broker

from broker.core.group import GroupCoordinatorConfig

PARTITIONS = 6
GROUP = "mig"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"offsets_topic_num_partitions": 1, "offsets_topic_replication_factor": 1,
          "group_consumer_heartbeat_interval_ms": 300, "group_consumer_session_timeout_ms": 6000,
          "group_initial_rebalance_delay_ms": 0}


class Stream:
    """What the members of the test consumed and own."""

    def __init__(self) -> None:
        self.assigned: dict[str, frozenset[int]] = {}
        self.records: list[tuple[int, int]] = []
        self.lock = threading.Lock()


def run_member(bootstrap: str, name: str, protocol: str, stop: threading.Event, stream: Stream,
               instance_id: str | None = None) -> None:
    from confluent_kafka import Consumer, KafkaException

    conf = {"bootstrap.servers": bootstrap, "group.id": GROUP, "client.id": name, "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}
    if instance_id is not None:
        conf["group.instance.id"] = instance_id
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 300})
    consumer = Consumer(conf)
    consumer.subscribe(["t"])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.05)
            stream.assigned[name] = frozenset(tp.partition for tp in consumer.assignment())
            if msg is None or msg.error() is not None:
                continue
            with stream.lock:
                stream.records.append((msg.partition(), msg.offset()))
            try:
                consumer.commit(message=msg, asynchronous=False)
            except KafkaException:
                pass  # a rebalance fenced the commit: the next owner reads the record again
    finally:
        consumer.close()
        stream.assigned.pop(name, None)


def run_producer(bootstrap: str, stop: threading.Event, produced: dict) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    while not stop.is_set():
        for p in range(PARTITIONS):
            producer.produce("t", value=b"x", partition=p)
            produced[p] = produced.get(p, 0) + 1
        producer.poll(0)
        time.sleep(0.05)
    assert producer.flush(30) == 0


def wait_split(stream: Stream, names: list[str], timeout_s: float = 30.0) -> float:
    start = time.monotonic()
    while True:
        snap = {n: stream.assigned.get(n, frozenset()) for n in names}
        parts = sorted(p for s in snap.values() for p in s)
        if set(snap) == set(stream.assigned) and all(snap.values()) and parts == list(range(PARTITIONS)):
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"the group never split the partitions among {names}: {snap}"
        time.sleep(0.02)


def cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "raftka.cli", *args], check=False, capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_rolling_upgrade_to_consumer_protocol_and_back_keeps_offsets(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GroupCoordinatorConfig(**CONFIG))
    await running.create_topic("t", partitions=PARTITIONS)
    coordinator = running.broker.coordinator
    stream, produced = Stream(), {}
    stops: dict[str, threading.Event] = {}
    timings = []

    async with trio.open_nursery() as members:
        stop_producer = threading.Event()
        members.start_soon(in_thread, run_producer, running.bootstrap, stop_producer, produced)

        async def start(name: str, protocol: str) -> None:
            stops[name] = threading.Event()
            members.start_soon(in_thread, run_member, running.bootstrap, name, protocol, stops[name], stream)

        async def restart(old: str, new: str, protocol: str) -> None:
            began = time.monotonic()
            stops[old].set()
            with trio.fail_after(30):
                while old in stream.assigned:
                    await trio.sleep(0.02)
            await start(new, protocol)
            names = sorted(stream.assigned.keys() | {new})
            await in_thread(wait_split, stream, names)
            timings.append((new, time.monotonic() - began))

        for i in range(3):
            await start(f"classic{i}", "classic")
        await in_thread(wait_split, stream, [f"classic{i}" for i in range(3)])
        assert GROUP in coordinator.shards[0].shard.groups

        await restart("classic0", "consumer0", "consumer")
        # Halfway: one consumer-protocol member and two classic ones in one consumer group.
        shard = coordinator.shards[0].shard
        group = shard.consumer.groups[GROUP]
        assert GROUP not in shard.groups
        kinds = sorted("classic" if m.classic else "consumer" for m in group.members.values())
        assert kinds == ["classic", "classic", "consumer"], kinds
        out = await in_thread(cli, "consumer-groups", "describe", "-b", running.bootstrap, "--group", GROUP, "--members")
        header, *rows = [line.split() for line in out.strip().splitlines()]
        protocols = sorted(row[header.index("PROTOCOL")] for row in rows)
        assert protocols == ["classic", "classic", "consumer"], out

        # A new coordinator rebuilds the mixed group from the log alone.
        epoch = group.group_epoch
        coordinator._unload(coordinator.shards[0], "a test moves the coordinator")
        coordinator.on_metadata_update()
        with trio.fail_after(10):
            while 0 not in coordinator.shards or not coordinator.shards[0].shard.loaded:
                await trio.sleep(0.01)
        reloaded = coordinator.shards[0].shard.consumer.groups[GROUP]
        assert reloaded.group_epoch == epoch
        assert {mid: (m.classic.session_timeout_ms if m.classic else None) for mid, m in reloaded.members.items()} \
            == {mid: (6000 if m.classic else None) for mid, m in group.members.items()}

        await restart("classic1", "consumer1", "consumer")
        await restart("classic2", "consumer2", "consumer")
        group = coordinator.shards[0].shard.consumer.groups[GROUP]
        assert all(m.classic is None for m in group.members.values())

        # Downgrade: back to classic one by one; the last consumer-protocol
        # member's leave turns the group back into a classic group.
        await restart("consumer0", "back0", "classic")
        await restart("consumer1", "back1", "classic")
        await restart("consumer2", "back2", "classic")
        shard = coordinator.shards[0].shard
        assert GROUP in shard.groups and GROUP not in shard.consumer.groups
        assert shard.groups[GROUP].protocol_type == "consumer"

        stop_producer.set()
        with trio.fail_after(30):
            while not produced or any(
                    sum(1 for p, _ in set(stream.records) if p == q) < produced.get(q, 0) for q in range(PARTITIONS)):
                await trio.sleep(0.1)
        for event in stops.values():
            event.set()

    consumed = set(stream.records)
    for p in range(PARTITIONS):
        assert {o for q, o in consumed if q == p} == set(range(produced[p])), f"partition {p} has a gap"
    total = sum(produced.values())
    duplicates = len(stream.records) - len(consumed)
    print(f"{total} records, {duplicates} read twice; all partitions assigned again after each restart in "
          + ", ".join(f"{n} {s:.1f} s" for n, s in timings))
    # Committed offsets carried over each conversion: a lost offset would
    # send a partition back to its start (auto.offset.reset=earliest).
    assert duplicates < total // 4, (duplicates, total)
    shard = coordinator.shards[0].shard
    assert {p: o.offset for (t, p), o in shard.offsets.items(GROUP)} == produced
    running.stop()


async def test_migration_policy_disabled_keeps_the_group_classic(nursery, tmp_path) -> None:
    config = GroupCoordinatorConfig(**CONFIG, group_consumer_migration_policy="disabled")
    running = await start_broker(nursery, tmp_path, group_coordinator=config)
    await running.create_topic("t", partitions=PARTITIONS)
    stream = Stream()
    stop = threading.Event()

    def consumer_protocol_join_error() -> str:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": running.bootstrap, "group.id": GROUP, "group.protocol": "consumer",
                             "auto.offset.reset": "earliest"})
        errors = []
        consumer.subscribe(["t"], on_assign=lambda *_: errors.append("assigned"))
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline and not errors:
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is not None:
                    # librdkafka treats GROUP_ID_NOT_FOUND from ConsumerGroupHeartbeat as fatal.
                    errors.append(msg.error().str())
        finally:
            consumer.close()
        return errors[0] if errors else "nothing"

    async with trio.open_nursery() as members:
        members.start_soon(in_thread, run_member, running.bootstrap, "classic0", "classic", stop, stream)
        try:
            await in_thread(wait_split, stream, ["classic0"])
            error = await in_thread(consumer_protocol_join_error)
            assert "The group id does not exist" in error, error
            shard = running.broker.coordinator.shards[0].shard
            assert GROUP in shard.groups and GROUP not in shard.consumer.groups
            assert stream.assigned["classic0"] == frozenset(range(PARTITIONS))
        finally:
            stop.set()
    running.stop()


def described(bootstrap: str) -> dict:
    """The group as each admin client shows it: confluent-kafka's
    describe_consumer_groups (ConsumerGroupDescribe, then DescribeGroups for
    a classic group) and kafka-python's describe_groups (DescribeGroups)."""
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaAdminClient

    confluent = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it alive
    group = confluent.describe_consumer_groups([GROUP], request_timeout=20)[GROUP].result(30)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        classic = admin.describe_groups([GROUP])[GROUP]
    finally:
        admin.close()
    return {
        "state": group.state.name,
        "type": group.type.name,
        "members": {m.group_instance_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
                    for m in group.members},
        "classic": classic,
    }


async def test_a_static_member_rolled_back_to_classic_downgrades_without_a_rebalance(nursery, tmp_path) -> None:
    """A classic static member and a consumer-protocol one; the latter
    restarts with the classic protocol under its group.instance.id: the
    group is classic again, the restarted member has its partitions back,
    and the member that stayed keeps its partitions throughout. Both admin
    clients and `consumer-groups list --type --state` show the group on
    either side of the change."""
    running = await start_broker(nursery, tmp_path, group_coordinator=GroupCoordinatorConfig(**CONFIG))
    await running.create_topic("t", partitions=PARTITIONS)
    shard = running.broker.coordinator.shards
    stream = Stream()
    stops = {n: threading.Event() for n in ("stays", "upgraded", "rolledback")}
    seen_by_stays: set[frozenset[int]] = set()
    async with trio.open_nursery() as members:
        members.start_soon(in_thread, run_member, running.bootstrap, "stays", "classic", stops["stays"], stream, "ia")
        members.start_soon(in_thread, run_member, running.bootstrap, "upgraded", "consumer", stops["upgraded"],
                           stream, "ic")
        try:
            await in_thread(wait_split, stream, ["stays", "upgraded"])
            assert GROUP in shard[0].shard.consumer.groups
            upgraded = stream.assigned["upgraded"]
            # Mixed: ConsumerGroupDescribe shows both kinds with their partitions;
            # DescribeGroups answers as Kafka 4 does for a consumer group.
            mixed = await in_thread(described, running.bootstrap)
            assert (mixed["state"], mixed["type"]) == ("STABLE", "CONSUMER"), mixed
            assert mixed["members"] == {"ia": sorted(stream.assigned["stays"]), "ic": sorted(upgraded)}, mixed
            assert mixed["classic"]["error"] == f"[Error 69] GroupIdNotFoundError: Group {GROUP} is not a classic group."
            assert (mixed["classic"]["group_state"], mixed["classic"]["members"]) == ("Dead", []), mixed
            listed = await in_thread(cli, "consumer-groups", "list", "-b", running.bootstrap, "--type", "--state")
            assert [GROUP, "Consumer", "Stable"] in [line.split() for line in listed.splitlines()], listed

            stays = stream.assigned["stays"]
            stops["upgraded"].set()
            with trio.fail_after(30):
                while "upgraded" in stream.assigned:
                    seen_by_stays.add(stream.assigned["stays"])
                    await trio.sleep(0.02)
            members.start_soon(in_thread, run_member, running.bootstrap, "rolledback", "classic", stops["rolledback"],
                               stream, "ic")
            with trio.fail_after(30):
                while stream.assigned.get("rolledback") != upgraded:
                    seen_by_stays.add(stream.assigned["stays"])
                    await trio.sleep(0.02)
            assert GROUP in shard[0].shard.groups and GROUP not in shard[0].shard.consumer.groups
            for _ in range(50):  # a rebalance of the member that stayed would show within its heartbeats
                seen_by_stays.add(stream.assigned["stays"])
                await trio.sleep(0.02)
            assert seen_by_stays == {stays}, seen_by_stays
            assert shard[0].shard.groups[GROUP].state.value == "Stable"

            back = await in_thread(described, running.bootstrap)
            assert (back["state"], back["type"]) == ("STABLE", "CLASSIC"), back
            assert back["members"] == {"ia": sorted(stays), "ic": sorted(upgraded)}, back
            classic = back["classic"]
            assert (classic["error"], classic["group_state"], classic["protocol_type"]) == (None, "Stable", "consumer")
            assert [m["member_metadata"]["topics"] for m in classic["members"]] == [["t"], ["t"]], classic
            listed = await in_thread(cli, "consumer-groups", "list", "-b", running.bootstrap, "--type", "--state")
            assert [GROUP, "Classic", "Stable"] in [line.split() for line in listed.splitlines()], listed
            # kafka-python decodes each member's ConsumerProtocolAssignment and subscription.
            assert {m["group_instance_id"]: sorted(p for t in m["member_assignment"]["assigned_partitions"]
                                                   for p in t["partitions"])
                    for m in classic["members"]} == {"ia": sorted(stays), "ic": sorted(upgraded)}, classic
        finally:
            for event in stops.values():
                event.set()
    running.stop()
