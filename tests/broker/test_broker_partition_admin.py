"""ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments through a
real broker and the in-process controller, with real clients (kafka-python,
confluent-kafka) and raw old request versions. Broker 2 is registered but
runs nowhere (its registration names this broker's listener, so a client
that picks it still reaches a broker): enough for the controller's
decisions and this broker's view."""

import os

from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, TopicPartition
from kio.schema.elect_leaders.v0 import request as el0
from kio.schema.errors import ErrorCode

from broker_testing import in_thread, start_broker


async def started(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.controller.register_broker(2, "127.0.0.1", rb.port)
    return rb


def kafka_python_admin(rb) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=rb.bootstrap, request_timeout_ms=10000)


async def test_reassignment_started_listed_and_cancelled_with_kafka_python(nursery, tmp_path):
    rb = await started(nursery, tmp_path)
    await rb.create_topic("t", assignments=[(1,)])

    def run():
        admin = kafka_python_admin(rb)
        try:
            accepted = admin.alter_partition_reassignments({TopicPartition("t", 0): [1, 2]})
            ongoing = admin.list_partition_reassignments()
            cancelled = admin.alter_partition_reassignments({TopicPartition("t", 0): None})
            after = admin.list_partition_reassignments({"t": [0]})
            again = admin.alter_partition_reassignments({TopicPartition("t", 0): None})
            return accepted, ongoing, cancelled, after, again
        finally:
            admin.close()

    accepted, ongoing, cancelled, after, again = await in_thread(run)
    assert accepted == {TopicPartition("t", 0): None}
    assert ongoing == {TopicPartition("t", 0): {"replicas": [1, 2], "adding_replicas": [2], "removing_replicas": []}}
    assert cancelled == {TopicPartition("t", 0): None}
    assert after == {}
    (error,) = again.values()
    assert error.errno == ErrorCode.no_reassignment_in_progress.value
    p = rb.broker.image.topic("t").partitions[0]
    assert (p.replicas, p.isr, p.leader) == ((1,), (1,), 1)


async def test_a_broker_moved_off_a_partition_stops_its_replica_and_deletes_the_log(nursery, tmp_path):
    rb = await started(nursery, tmp_path)
    await rb.create_topic("t", assignments=[(1, 2)])
    assert os.path.isdir(tmp_path / "t-0")

    def run():
        admin = kafka_python_admin(rb)
        try:
            return admin.alter_partition_reassignments({TopicPartition("t", 0): [2]})
        finally:
            admin.close()

    assert await in_thread(run) == {TopicPartition("t", 0): None}
    # Broker 2 was in the ISR: the move completes at once and 2 leads.
    p = rb.broker.image.topic("t").partitions[0]
    assert (p.replicas, p.isr, p.leader) == ((2,), (2,), 2)
    assert ("t", 0) not in rb.broker.replicas.partitions
    assert not os.path.exists(tmp_path / "t-0")


async def test_preferred_election_with_confluent_kafka_and_elect_leaders_v0(nursery, tmp_path):
    rb = await started(nursery, tmp_path)
    await rb.create_topic("t", assignments=[(2, 1), (1, 2), (2, 1)])
    # Broker 2 "fails": this broker takes over partitions 0 and 2.
    await rb.controller.send(_fence(rb, 2))
    await rb.controller.register_broker(2, "127.0.0.1", rb.port)
    led = {i: p.leader for i, p in rb.broker.image.topic("t").partitions.items()}
    assert led == {0: 1, 1: 1, 2: 1}
    # 2 is not back in the ISR yet.
    conn = await rb.connect(nursery)
    r = await conn.request(el0.ElectLeadersRequest(topic_partitions=(el0.TopicPartitions(topic="t", partitions=(0,)),)))
    assert [(p.partition_id, p.error_code) for p in r.replica_election_results[0].partition_result] == \
        [(0, ErrorCode.preferred_leader_not_available)]
    await _rejoin_isr(rb, 2)

    def elect():
        admin = AdminClient({"bootstrap.servers": rb.bootstrap})
        future = admin.elect_leaders(ElectionType.PREFERRED, [CKTopicPartition("t", 0), CKTopicPartition("t", 1)])
        return future.result(20)

    results = await in_thread(elect)
    outcome = {(tp.topic, tp.partition): (None if e is None else e.name()) for tp, e in results.items()}
    assert outcome == {("t", 0): None, ("t", 1): "ELECTION_NOT_NEEDED"}
    # Answered once this broker's image shows it.
    assert rb.broker.image.topic("t").partitions[0].leader == 2
    r = await conn.request(el0.ElectLeadersRequest(topic_partitions=None))
    assert [(res.topic, [(p.partition_id, p.error_code) for p in res.partition_result])
            for res in r.replica_election_results] == [("t", [(2, ErrorCode.none)])]
    assert {i: p.leader for i, p in rb.broker.image.topic("t").partitions.items()} == {0: 2, 1: 1, 2: 2}


def _fence(rb, broker_id: int):
    from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest

    reg = rb.controller.image.brokers[broker_id]
    return BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=reg.epoch,
                                  current_metadata_offset=rb.controller.image.offset, want_fence=True,
                                  want_shut_down=False)


async def _rejoin_isr(rb, broker_id: int) -> None:
    """The leader (this broker) puts `broker_id` back in the ISRs, as if it caught up."""
    from kio.schema.alter_partition.v3 import request as ap_req

    image = rb.controller.image
    topic = image.topic("t")
    parts = []
    for index, p in sorted(topic.partitions.items()):
        if broker_id in p.replicas and broker_id not in p.isr:
            parts.append(ap_req.PartitionData(
                partition_index=index, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                new_isr_with_epochs=tuple(ap_req.BrokerState(broker_id=b, broker_epoch=-1)
                                          for b in (*p.isr, broker_id))))
    r = await rb.controller.send(ap_req.AlterPartitionRequest(
        broker_id=1, broker_epoch=image.brokers[1].epoch,
        topics=(ap_req.TopicData(topic_id=topic.topic_id, partitions=tuple(parts)),)))
    assert all(p.error_code == ErrorCode.none for t in r.topics for p in t.partitions), r


def raftka_cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "raftka.cli", "partitions", *args], capture_output=True, text=True,
                          timeout=60)


async def test_partitions_cli_reassigns_lists_and_cancels(nursery, tmp_path):
    rb = await started(nursery, tmp_path)
    await rb.create_topic("t", assignments=[(1,), (1,)])
    bootstrap = ("--bootstrap-server", rb.bootstrap, "--timeout", "10")
    moved = await in_thread(raftka_cli, "reassign", *bootstrap, "--topic", "t", "--partition", "1",
                            "--replicas", "2,1")
    assert moved.returncode == 0, moved.stderr
    listed = await in_thread(raftka_cli, "list-reassignments", *bootstrap, "--topic", "t")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "│ t " in line]
    assert len(rows) == 1 and "2,1" in rows[0], listed.stdout
    cancelled = await in_thread(raftka_cli, "reassign", *bootstrap, "--topic", "t", "--partition", "1", "--cancel")
    assert cancelled.returncode == 0, cancelled.stderr
    assert rb.broker.image.topic("t").partitions[1].replicas == (1,)
    nothing = await in_thread(raftka_cli, "reassign", *bootstrap, "--topic", "t", "--partition", "1", "--cancel")
    assert nothing.returncode == 1 and "NO_REASSIGNMENT_IN_PROGRESS" in nothing.stderr, nothing
    unknown = await in_thread(raftka_cli, "reassign", *bootstrap, "--topic", "t", "--partition", "0",
                              "--replicas", "1,7")
    assert unknown.returncode == 1 and "INVALID_REPLICA_ASSIGNMENT" in unknown.stderr, unknown
    balanced = await in_thread(raftka_cli, "elect-leaders", *bootstrap)
    assert balanced.returncode == 0 and "already led by its preferred replica" in balanced.stdout, balanced
