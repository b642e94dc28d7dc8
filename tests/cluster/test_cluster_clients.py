"""`raftka cluster up --controllers 3 --brokers 3` as a real process, used by unmodified clients.

One cluster serves the module: it must print READY, then every client
(confluent-kafka, kafka-python, aiokafka) creates a 3-partition topic
through its own admin API, produces 10,000 keyed records with headers
with acks=1 and acks=all, and reads every one back with assign(); deleting
a topic removes its logs from the brokers' dirs.
"""

import time

import pytest

from broker_testing import check_round_trip, workload
from cluster_testing import CLIENTS, ClusterUp, confluent_create, confluent_produce

PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    up = ClusterUp(tmp_path_factory.mktemp("cluster") / "data")
    try:
        up.start()
        yield up
    finally:
        up.kill_everything()


def test_ready_line_names_every_broker_and_every_process_runs(cluster):
    addresses = cluster.bootstrap.split(",")
    assert len(addresses) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    state = cluster.state()
    assert [n["role"] for n in state["nodes"]].count("broker") == 3
    assert len(cluster.node_pids()) == 6
    assert cluster.reader.lines == [f"READY bootstrap={cluster.bootstrap}"]  # exactly one line on stdout


@pytest.mark.parametrize("acks", ["1", "all"])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_client_round_trip(cluster, client, acks):
    create, produce, consume = CLIENTS[client]
    topic = f"{client}-acks-{acks}"
    create(cluster.bootstrap, topic, PARTITIONS)
    records = workload()
    reports = produce(cluster.bootstrap, topic, records, acks)
    assert len(reports) == len(records)
    consumed = consume(cluster.bootstrap, topic, PARTITIONS, len(records))
    by_partition = check_round_trip(records, consumed, PARTITIONS)
    # Each acknowledged offset holds the record the client was told it holds.
    by_offset = {(c.partition, c.offset): c.value for records_p in by_partition.values() for c in records_p}
    assert {(p, o): v for p, o, v in reports} == by_offset


def test_deleted_topic_logs_leave_every_broker_dir(cluster):
    from confluent_kafka.admin import AdminClient

    topic = "doomed"
    confluent_create(cluster.bootstrap, topic, 6)
    confluent_produce(cluster.bootstrap, topic, workload(600), "1")

    def topic_dirs():
        return sorted(p.name for d in cluster.broker_log_dirs() for p in d.iterdir()
                      if p.name.startswith(f"{topic}-"))

    assert topic_dirs() == [f"{topic}-{p}" for p in range(6)]  # spread over the three brokers
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    deadline = time.monotonic() + 15
    while topic_dirs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert topic_dirs() == []
    assert topic not in admin.list_topics(timeout=10).topics
