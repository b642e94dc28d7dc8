"""A broker killed with SIGKILL and started again keeps every acknowledged record at its offset.

Real processes (`LocalCluster`: one controller, two brokers), real client
(confluent-kafka, acks=1). The broker sessions are shortened so the
restarted process need not wait out the default 9 s before the controller
lets it register again (its old registration is still live when it comes
back: DUPLICATE_BROKER_REGISTRATION until the session expires).
"""

from confluent_kafka.admin import AdminClient

from broker_testing import workload
from cluster_testing import confluent_consume, confluent_create, confluent_produce
from cluster import LocalCluster

TOPIC = "survivor"
PARTITIONS = 4
FAST_SESSIONS = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "300"}


def leaders(bootstrap: str) -> dict[int, int]:
    topic = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10).topics[TOPIC]
    return {p.id: p.leader for p in topic.partitions.values()}


def test_sigkilled_broker_keeps_every_acknowledged_record(tmp_path):
    with LocalCluster(tmp_path, controllers=1, brokers=2, overrides=FAST_SESSIONS) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        confluent_create(cluster.bootstrap, TOPIC, PARTITIONS)
        acked = confluent_produce(cluster.bootstrap, TOPIC, workload(4000), "1")
        victim = cluster.brokers[0]
        assert victim.node_id in leaders(cluster.bootstrap).values()

        cluster.kill(victim.node_id)  # SIGKILL: no controlled shutdown, no clean-shutdown marker
        cluster.start(victim.node_id)
        cluster.wait_ready(120)
        assert "no clean shutdown marker" in victim.output_since_start()

        more = confluent_produce(cluster.bootstrap, TOPIC, workload(400), "1")
        consumed = confluent_consume(cluster.bootstrap, TOPIC, PARTITIONS, len(acked) + len(more))
        on_disk = {(c.partition, c.offset): c.value for c in consumed}
        expected = {(p, o): v for p, o, v in acked + more}
        assert on_disk == expected  # nothing lost, nothing moved, no offset handed out twice
        assert set(leaders(cluster.bootstrap).values()) <= {b.node_id for b in cluster.brokers}
