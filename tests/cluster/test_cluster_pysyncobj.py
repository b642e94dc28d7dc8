"""`raftka cluster up --quorum-engine pysyncobj`: brokers fed by a metadata quorum on pysyncobj.

The brokers are unchanged (they fetch the metadata log from the active
controller with Raft Fetch); each unmodified client creates a topic,
produces with acks=all and reads every record back; a deleted topic
leaves the brokers' dirs.
"""

import time

import pytest
from broker_testing import check_round_trip, workload
from cluster_testing import CLIENTS, ClusterUp

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    up = ClusterUp(tmp_path_factory.mktemp("cluster") / "data", 3, 3, "--quorum-engine", "pysyncobj")
    try:
        up.start()
        yield up
    finally:
        up.kill_everything()


def test_controllers_run_the_pysyncobj_engine(cluster):
    for n in cluster.state()["nodes"]:
        if n["role"] == "controller":
            props = (cluster.data_dir / f"controller-{n['node_id']}.properties").read_text()
            assert "quorum.engine=pysyncobj" in props


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_client_round_trip(cluster, client):
    create, produce, consume = CLIENTS[client]
    topic = f"{client}-psy"
    create(cluster.bootstrap, topic, PARTITIONS)
    records = workload(2000)
    reports = produce(cluster.bootstrap, topic, records, "all")
    assert len(reports) == len(records)
    consumed = consume(cluster.bootstrap, topic, PARTITIONS, len(records))
    by_partition = check_round_trip(records, consumed, PARTITIONS)
    by_offset = {(c.partition, c.offset): c.value for records_p in by_partition.values() for c in records_p}
    assert {(p, o): v for p, o, v in reports} == by_offset


def test_topic_delete(cluster):
    from cluster_testing import confluent_create
    from confluent_kafka.admin import AdminClient

    topic = "psy-doomed"
    confluent_create(cluster.bootstrap, topic, 3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    deadline = time.monotonic() + 15
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic not in admin.list_topics(timeout=10).topics


def test_quorum_status_shows_the_engine_its_term_commit_point_and_members(cluster):
    import json

    from cluster_testing import run_cli

    controller = next(n for n in cluster.state()["nodes"] if n["role"] == "controller")
    out = run_cli("quorum", "status", "--bootstrap-controller", controller["address"])
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line and "  " in line)
    assert lines["Engine"].strip() == "pysyncobj"
    assert lines["CurrentVoters"].strip() == "[1, 2, 3]"
    # The term is the leader epoch, the commit point the high watermark; every member
    # connected to the leader shows where it stands in the metadata log.
    deadline = time.monotonic() + 30
    while True:
        data = json.loads(run_cli("quorum", "status", "--bootstrap-controller", controller["address"],
                                  "--json").stdout)
        if all(r["lag"] == 0 and r["last_fetch_timestamp"] > 0 for r in data["replicas"]):
            break
        assert time.monotonic() < deadline, data
        time.sleep(0.3)
    assert data["engine"] == "pysyncobj" and data["leader_epoch"] >= 1 and data["high_watermark"] >= 1
    assert sorted(r["status"] for r in data["replicas"]) == ["Follower", "Follower", "Leader"]


def test_idempotent_producer_gets_a_producer_id_from_the_controller(cluster):
    # An idempotent producer needs a producer id: the broker asks the active
    # controller for a block (AllocateProducerIds), committed through pysyncobj.
    from cluster_testing import confluent_create
    from confluent_kafka import Producer

    confluent_create(cluster.bootstrap, "psy-idempotent", 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    errors = []
    for i in range(50):
        producer.produce("psy-idempotent", b"v%d" % i, on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0 and errors == []


def test_killed_broker_is_fenced_and_its_partitions_get_new_leaders(cluster):
    # Last in the module: it kills a broker. The controller (pysyncobj's
    # leader) fences it when its session expires and elects new leaders.
    import os
    import signal

    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("psy-rf3", 3, 3)])["psy-rf3"].result(30)
    brokers = [n for n in cluster.state()["nodes"] if n["role"] == "broker"]
    victim = brokers[0]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        parts = admin.list_topics("psy-rf3", timeout=10).topics["psy-rf3"].partitions
        if len(parts) == 3 and any(p.leader == victim["node_id"] for p in parts.values()):
            break
        time.sleep(0.2)
    os.kill(victim["pid"], signal.SIGKILL)
    survivor = AdminClient({"bootstrap.servers": ",".join(b["address"] for b in brokers[1:])})
    deadline = time.monotonic() + 60
    leaders = {}
    while time.monotonic() < deadline:
        parts = survivor.list_topics("psy-rf3", timeout=10).topics["psy-rf3"].partitions
        leaders = {p.id: p.leader for p in parts.values()}
        if leaders and all(lead not in (victim["node_id"], -1) for lead in leaders.values()):
            break
        time.sleep(0.2)
    assert leaders and all(lead not in (victim["node_id"], -1) for lead in leaders.values()), leaders
