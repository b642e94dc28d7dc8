"""A static member (KIP-345, `group.instance.id`) across coordinator
failovers: the broker leading the group's `__consumer_offsets` partition is
killed (SIGKILL, then restarted) and paused (SIGSTOP/SIGCONT), and the one
member of the group, a confluent-kafka consumer with the settings `raftka
mirror` uses (session 10 s, heartbeat 1 s), must keep its partitions: it is
never fenced (FENCED_INSTANCE_ID is fatal for a static member, and no other
process holds its instance id) and it consumes again within seconds of
each fault, not after a rebalance timeout.

Real processes (`LocalCluster`: one controller, three brokers), the data
topic and `__consumer_offsets` with three replicas, a producer writing the
whole time (acks=all). Each test takes 30-50 s, so they run with
RAFTKA_SOAK=1; the core of the fencing (a member id handed out in a
rebalance that the coordinator's log never got) is reproduced in the
default suite by tests/broker/test_group_static.py.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from confluent_kafka.admin import AdminClient, NewTopic

from cluster_group_testing import BackgroundProducer, Member, wait_for_split
from cluster import LocalCluster
from test_group_failover import coordinator_of

PARTITIONS = 2
SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "offsets.topic.num.partitions": "1",
    "offsets.topic.replication.factor": "3",
    "group.initial.rebalance.delay.ms": "500",
}
TOPIC, GROUP = "orders", "mirror-like"
#: How long the member may go without a record after a fault ends.
RECOVERY_S = 15.0


def wait_consuming(member: Member, since: float, timeout_s: float) -> float:
    """Seconds from `since` until the member reads a record that arrived after it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fenced = [e for _t, e, fatal in member.errors() if fatal or "fenced" in e.lower()]
        assert not fenced, f"the static member was fenced: {fenced}"
        if any(t > since for t, *_ in member.consumed()):
            return time.monotonic() - since
        time.sleep(0.1)
    raise AssertionError(f"{member.name} read nothing for {timeout_s} s after the fault; "
                         f"errors: {member.errors()[-5:]}")


def current_coordinator(bootstrap: str, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return coordinator_of(bootstrap, GROUP)[0]
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="about 30 s of coordinator faults: RAFTKA_SOAK=1")
def test_static_member_keeps_its_partitions_across_coordinator_kills_and_pauses(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], operation_timeout=30)[TOPIC].result(60)
        producer = BackgroundProducer(bootstrap, TOPIC, PARTITIONS, rate_per_s=50)
        member = Member("confluent-kafka", bootstrap, GROUP, TOPIC, "static", session_ms=10000,
                        heartbeat_ms=1000, report_dir=tmp_path, instance_id="mirror-like-0")
        recoveries = []
        try:
            wait_for_split([member], PARTITIONS)
            for fault in ("kill", "pause", "kill", "pause"):
                coordinator = current_coordinator(bootstrap)
                if fault == "kill":
                    cluster.kill(coordinator)
                    time.sleep(3)
                    cluster.start(coordinator)
                else:
                    cluster.kill(coordinator, signal.SIGSTOP)
                    time.sleep(4)
                    cluster.kill(coordinator, signal.SIGCONT)
                ended = time.monotonic()
                recoveries.append((fault, coordinator, round(wait_consuming(member, ended, RECOVERY_S), 1)))
                time.sleep(1)
            print("STATIC FAILOVER", recoveries)
            assert member.process.poll() is None
            _coordinator, state, members = coordinator_of(bootstrap, GROUP)
            assert (state, members) == ("STABLE", 1)
        finally:
            member.kill()
            producer._stop.set()


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="coordinator faults with no group writes: RAFTKA_SOAK=1")
def test_restarted_static_member_gets_its_partitions_once_group_writes_succeed_again(tmp_path) -> None:
    """`__consumer_offsets` with min.insync.replicas = its replication
    factor (the mirror chaos test's source: two replicas, two in sync): while
    a broker is down the coordinator can write nothing. A static member
    restarted meanwhile takes its place back as soon as the broker is back."""
    settings = {**SETTINGS, "min.insync.replicas": "3"}
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=settings) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "1"})],
                            operation_timeout=30)[TOPIC].result(60)
        producer = BackgroundProducer(bootstrap, TOPIC, PARTITIONS, rate_per_s=50)
        first = Member("confluent-kafka", bootstrap, GROUP, TOPIC, "first", session_ms=10000,
                       heartbeat_ms=1000, report_dir=tmp_path, instance_id="mirror-like-0")
        members = [first]
        try:
            wait_for_split([first], PARTITIONS)
            timings = []
            for _ in range(2):
                coordinator = current_coordinator(bootstrap)
                cluster.kill(coordinator)
                time.sleep(1)
                members[-1].kill()
                again = Member("confluent-kafka", bootstrap, GROUP, TOPIC, f"again{len(members)}",
                               session_ms=10000, heartbeat_ms=1000, report_dir=tmp_path,
                               instance_id="mirror-like-0")
                members.append(again)
                time.sleep(3)
                cluster.start(coordinator)
                restarted = time.monotonic()
                timings.append(round(wait_consuming(again, restarted, 60), 1))
            print("RESTART WHILE UNWRITABLE", timings)
        finally:
            for m in members:
                m.kill()
            producer._stop.set()


@pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="about 40 s, a coordinator that cannot write: RAFTKA_SOAK=1")
def test_member_id_lost_by_a_failed_group_write_is_not_fenced(tmp_path) -> None:
    """The member id a static member gets in a rebalance is written when
    its SyncGroup ends; when that write fails (here `__consumer_offsets`
    is below min.insync.replicas) the coordinator reloads the group from
    its log, where the instance has its older id. The process with the
    newer id must not be fenced by that older id (fatal for librdkafka): it
    rejoins, and gets the partitions once the group can be written again."""
    settings = {**SETTINGS, "min.insync.replicas": "3"}
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=settings) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "1"})],
                            operation_timeout=30)[TOPIC].result(60)
        # No records: the members commit nothing, so the only group writes
        # are the rebalances' (a failed commit would reload the group too).
        static = Member("confluent-kafka", bootstrap, GROUP, TOPIC, "static", session_ms=10000,
                        heartbeat_ms=1000, report_dir=tmp_path, instance_id="mirror-like-0")
        dynamic = Member("confluent-kafka", bootstrap, GROUP, TOPIC, "dynamic", report_dir=tmp_path)
        members = [static, dynamic]
        try:
            wait_for_split([static, dynamic], PARTITIONS)
            coordinator = current_coordinator(bootstrap)
            other = next(b.node_id for b in cluster.brokers if b.node_id != coordinator)
            cluster.kill(other)
            time.sleep(6)  # fenced by the controller, out of the ISR: no group write can succeed
            static.kill()
            dynamic.terminate()  # leaves: a rebalance, nothing written yet
            restarted = Member("confluent-kafka", bootstrap, GROUP, TOPIC, "restarted", session_ms=10000,
                               heartbeat_ms=1000, report_dir=tmp_path, instance_id="mirror-like-0")
            members.append(restarted)
            time.sleep(8)  # its rebalance ends, the write fails, the group is reloaded: many times
            fenced = [e for _t, e, fatal in restarted.errors() if fatal or "fenced" in e.lower()]
            assert not fenced, f"the static member was fenced: {fenced}"
            cluster.start(other)
            back = time.monotonic()
            while restarted.assigned != frozenset(range(PARTITIONS)):
                fenced = [e for _t, e, fatal in restarted.errors() if fatal or "fenced" in e.lower()]
                assert not fenced, f"the static member was fenced: {fenced}"
                assert time.monotonic() - back < 60, "no assignment a minute after the broker returned"
                time.sleep(0.1)
            print("ASSIGNED AFTER THE BROKER RETURNED", round(time.monotonic() - back, 1))
        finally:
            for m in members:
                m.kill()
