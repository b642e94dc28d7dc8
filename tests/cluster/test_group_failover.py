"""Coordinator failover: the broker leading a group's `__consumer_offsets`
partition is killed (SIGKILL) while the group consumes, and the group
recovers with its committed offsets.

Real processes (`LocalCluster`: one controller, three brokers), confluent-kafka
member processes, a producer writing the whole time (acks=all). Both the
data topic and `__consumer_offsets` (Kafka's default
`offsets.topic.replication.factor=3`) have three replicas, so when the
coordinator dies the controller fences it and another in-sync replica
becomes leader of the group's partition; that broker knows the group only
from the partition's records, which it replays on becoming leader. Every
commit acknowledged before the kill must be there, the group must be
Stable again under the new coordinator, and a new member must resume from
the commits without losing a record.
"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic

from cluster_group_testing import BackgroundProducer, Member, check_history, last_commits, wait_for_split, wait_until_consumed
from cluster import LocalCluster
from test_groups import committed_offsets

PARTITIONS = 6
SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "offsets.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "1000",
}
TOPIC, GROUP = "payments", "ledger"


def coordinator_of(bootstrap: str, group: str) -> tuple[int, str, int]:
    """(coordinator id, group state, member count) from DescribeGroups."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group], request_timeout=30)[group].result(60)
    return described.coordinator.id, described.state.name, len(described.members)


def wait_for_group(bootstrap: str, members: int, timeout_s: float = 90) -> int:
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = coordinator_of(bootstrap, GROUP)
            if seen[1] == "STABLE" and seen[2] == members:
                return seen[0]
        except Exception as exc:  # the coordinator may be loading or gone for a moment
            seen = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"the group never became stable with {members} members: {seen}")


def test_group_recovers_its_committed_offsets_when_its_coordinator_is_killed(tmp_path) -> None:
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=SETTINGS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], operation_timeout=30)[TOPIC].result(60)
        producer = BackgroundProducer(bootstrap, TOPIC, PARTITIONS)
        members = [Member("confluent-kafka", bootstrap, GROUP, TOPIC, f"m{i}", report_dir=tmp_path) for i in range(2)]
        everyone = list(members)
        try:
            wait_for_split(members, PARTITIONS)
            coordinator = wait_for_group(bootstrap, 2)
            time.sleep(2)  # consume and commit for a while
            before = last_commits(members)

            cluster.kill(coordinator)
            survivors = ",".join(b.address for b in cluster.brokers if b.node_id != coordinator)
            successor = wait_for_group(survivors, 2)
            assert successor != coordinator
            assert "loaded 1 groups" in cluster.node(successor).output_since_start()

            # The new coordinator rebuilt the offsets from the partition's
            # records: at least every commit acknowledged before the kill.
            recovered = committed_offsets("confluent-kafka", survivors, GROUP, TOPIC)
            assert all(recovered.get(p, -1) >= o for p, o in before.items()), (before, recovered)

            time.sleep(2)  # the group goes on consuming and committing
            for m in members:
                m.terminate()
            committed = committed_offsets("confluent-kafka", survivors, GROUP, TOPIC)
            assert committed == last_commits(everyone)

            resumer = Member("confluent-kafka", survivors, GROUP, TOPIC, "resumer", report_dir=tmp_path)
            everyone.append(resumer)
            wait_for_split([resumer], PARTITIONS)
            time.sleep(0.5)
            acked = producer.stop()
            wait_until_consumed(resumer, producer.end_offsets(), timeout_s=90)
            resumer.terminate()
            starts = {}
            for _t, p, o, _v in resumer.consumed():
                starts.setdefault(p, o)
            assert starts == committed, "the new member did not resume at the committed offsets"
            check_history(everyone, acked)
        finally:
            for m in everyone:
                m.kill()
            producer._stop.set()
