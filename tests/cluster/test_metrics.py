"""Every node of a 3+3 cluster serves Prometheus metrics with Kafka's JMX exporter names.

Real processes (`LocalCluster(metrics=True)`), real clients (confluent-kafka),
scraped over HTTP and parsed with prometheus_client's own text parser. An
operator's usual alerts are checked the way they would fire: a killed
broker makes UnderReplicatedPartitions and the ISR shrinks rise on the
survivors, and a restart brings the first back to 0; the active
controller count sums to one over the controllers, also after the active
one is killed.
"""

import math
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from broker_testing import workload
from cluster import LocalCluster
from cluster_testing import confluent_produce
from common.wire.ports import free_ports

TOPIC = "watched"
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "raftka.json"
PARTITIONS = 6
FAST_SESSIONS = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "300",
                 "replica.lag.time.max.ms": "3000"}


def scrape(node) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of one node's /metrics."""
    with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(cluster, nodes, name: str, **labels) -> float:
    return sum(value(scrape(n), name, **labels) for n in nodes if n.is_running())


def wait_for(what: str, predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def consume_in_group(bootstrap: str, count: int) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watchers", "auto.offset.reset": "earliest"})
    consumer.subscribe([TOPIC])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == count


def test_metrics_of_a_3_plus_3_cluster_follow_a_broker_failure_and_a_controller_failover(tmp_path):
    with LocalCluster(tmp_path, controllers=3, brokers=3, overrides=FAST_SESSIONS, metrics=True) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], operation_timeout=30)[TOPIC].result(60)
        acked = confluent_produce(cluster.bootstrap, TOPIC, workload(600), "all")
        consume_in_group(cluster.bootstrap, len(acked))

        brokers, controllers = cluster.brokers, cluster.controllers
        # Every leader's count of what it took in, per topic and broker-wide.
        bytes_in = total(cluster, brokers, "kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC)
        assert bytes_in >= sum(len(v) for _, _, v in acked)
        assert total(cluster, brokers, "kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == len(acked)
        assert total(cluster, brokers, "kafka_server_brokertopicmetrics_bytesout_total", topic=TOPIC) > 0
        assert total(cluster, brokers, "kafka_server_brokertopicmetrics_replicationbytesin_total", topic=TOPIC) > 0
        assert total(cluster, brokers, "kafka_server_replicamanager_leadercount") >= PARTITIONS
        assert total(cluster, brokers, "kafka_server_replicamanager_underreplicatedpartitions") == 0
        first = scrape(brokers[0])
        assert any(name == "kafka_network_requestmetrics_requests_total" and dict(labels)["request"] == "Produce"
                   and v > 0 for (name, labels), v in first.items())
        assert any(name == "kafka_network_requestmetrics_totaltimems_count" and dict(labels)["request"] == "Fetch"
                   and v > 0 for (name, labels), v in first.items())
        assert value(first, "process_open_fds") > 0
        # Queue and send times per API, beside the total time.
        every = [scrape(b) for b in brokers]
        for metric in ("requestqueuetimems", "responsesendtimems"):
            for api in ("Produce", "Fetch"):
                assert sum(value(s, f"kafka_network_requestmetrics_{metric}_count", request=api)
                           for s in every) > 0, (metric, api)
                assert all(value(s, f"kafka_network_requestmetrics_{metric}", request=api, quantile="0.99")
                           < 10_000 for s in every if (f"kafka_network_requestmetrics_{metric}_count",
                                                       (("request", api),)) in s)
        # Errors by code per API: every produced partition answered NONE, and
        # a deletion of a topic that does not exist is counted under its code.
        assert sum(value(s, "kafka_network_requestmetrics_errors_total", request="Produce", error="NONE")
                   for s in every) >= PARTITIONS
        admin.delete_topics(["never-created"], operation_timeout=10)["never-created"].exception(30)
        errors = [{dict(labels)["error"]: v for (name, labels), v in scrape(b).items()
                   if name == "kafka_network_requestmetrics_errors_total" and dict(labels)["request"] == "DeleteTopics"}
                  for b in brokers]
        assert sum(e.get("UNKNOWN_TOPIC_OR_PARTITION", 0) for e in errors) == 1, errors
        # The consumer's group (left: Empty) is coordinated by one of the brokers,
        # which counted its rebalance (Kafka 4's group-coordinator-metrics).
        assert total(cluster, brokers, "kafka_coordinator_group_groupmetadatamanager_numgroupsempty") == 1
        assert total(cluster, brokers, "kafka_server_group_coordinator_metrics_group_rebalance_count") >= 1
        assert total(cluster, brokers, "kafka_server_group_coordinator_metrics_group_rebalance_rate") > 0

        # The controllers: one active, the cluster's topics and brokers counted from the metadata.
        assert total(cluster, controllers, "kafka_controller_kafkacontroller_activecontrollercount") == 1
        c = scrape(controllers[0])
        assert value(c, "kafka_controller_kafkacontroller_activebrokercount") == 3
        assert value(c, "kafka_controller_kafkacontroller_globalpartitioncount") >= PARTITIONS
        assert value(c, "kafka_server_raftmetrics_current_leader") in {n.node_id for n in controllers}
        assert sum(v for (name, _), v in c.items() if name == "kafka_server_raftmetrics_current_state") == 1
        # KIP-595's latencies and rates: the leader appended and committed the
        # topic's records within the window; the brokers (observers) fetched them.
        leader = next(n for n in controllers
                      if value(scrape(n), "kafka_controller_kafkacontroller_activecontrollercount") == 1)
        on_leader = scrape(leader)
        assert 0 < value(on_leader, "kafka_server_raftmetrics_commit_latency_avg") \
            <= value(on_leader, "kafka_server_raftmetrics_commit_latency_max") < 10_000
        assert value(on_leader, "kafka_server_raftmetrics_append_records_rate") > 0
        assert value(first, "kafka_server_raftmetrics_fetch_records_rate") > 0
        assert value(on_leader, "kafka_controller_controllereventmanager_eventqueuetimems_count") > 0

        # Every metric the shipped Grafana dashboard queries is served.
        served = {name for node in cluster.nodes.values() for name, _ in scrape(node)}
        queried = set(re.findall(r"\b(?:kafka|process)_[a-z_]+", DASHBOARD.read_text()))
        assert queried and queried <= served, sorted(queried - served)

        shrinks_before = total(cluster, brokers, "kafka_server_replicamanager_isrshrinks_total")
        victim = brokers[0]
        cluster.kill(victim.node_id)
        survivors = [b for b in brokers if b is not victim]
        # Every partition of the topic (and of __consumer_offsets) had a replica on the victim.
        wait_for("UnderReplicatedPartitions to count every partition",
                 lambda: total(cluster, survivors, "kafka_server_replicamanager_underreplicatedpartitions")
                 >= PARTITIONS)
        assert total(cluster, survivors, "kafka_server_replicamanager_isrshrinks_total") > shrinks_before
        wait_for("the controller to fence the killed broker",
                 lambda: total(cluster, controllers, "kafka_controller_kafkacontroller_fencedbrokercount") == 3)

        expands_before = total(cluster, survivors, "kafka_server_replicamanager_isrexpands_total")
        cluster.start(victim.node_id)
        cluster.wait_ready(120)
        wait_for("UnderReplicatedPartitions back to 0",
                 lambda: total(cluster, brokers, "kafka_server_replicamanager_underreplicatedpartitions") == 0)
        assert total(cluster, brokers, "kafka_server_replicamanager_isrexpands_total") > expands_before

        # A controller failover: the new active controller counts itself, the old one is gone.
        active = [n for n in controllers
                  if value(scrape(n), "kafka_controller_kafkacontroller_activecontrollercount") == 1]
        assert len(active) == 1
        cluster.kill(active[0].node_id)
        wait_for("a new active controller",
                 lambda: total(cluster, controllers, "kafka_controller_kafkacontroller_activecontrollercount") == 1)
        for n in controllers:
            if n.is_running():
                assert value(scrape(n), "kafka_server_raftmetrics_current_leader") != active[0].node_id
        # The new leader timed its election.
        new_leader = next(n for n in controllers if n.is_running()
                          and value(scrape(n), "kafka_controller_kafkacontroller_activecontrollercount") == 1)
        elected = value(scrape(new_leader), "kafka_server_raftmetrics_election_latency_max")
        assert not math.isnan(elected) and 0 <= elected < 30_000


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="the Debian `prometheus` package is not installed")
def test_a_real_prometheus_scrapes_a_node(tmp_path):
    from cluster.prometheus import PrometheusServer

    with LocalCluster(tmp_path / "cluster", controllers=1, brokers=1, metrics=True) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        (port,) = free_ports(1, "127.0.0.1")
        with PrometheusServer(tmp_path / "prometheus", cluster, port=port, scrape_interval_s=1) as prometheus:
            def queried():
                url = (f"{prometheus.url}/api/v1/query?query="
                       "kafka_controller_kafkacontroller_activecontrollercount")
                with urllib.request.urlopen(url, timeout=5) as response:
                    import json
                    result = json.load(response)["data"]["result"]
                return result and sum(float(r["value"][1]) for r in result) == 1

            wait_for("Prometheus to scrape the controller", lambda: _quiet(queried), 60)


def _quiet(fn):
    try:
        return fn()
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="the Debian `prometheus` package is not installed")
def test_cluster_up_serves_metrics_and_runs_prometheus_over_them(tmp_path):
    from cluster_testing import ClusterUp

    (port,) = free_ports(1, "127.0.0.1")
    up = ClusterUp(tmp_path / "data", 1, 1, "--prometheus", "--prometheus-port", str(port))
    try:
        up.start()
        said = " ".join(up.stderr_path.read_text().split())
        assert f"Prometheus at http://127.0.0.1:{port} scraping every node" in said
        for node in up.state()["nodes"]:
            assert f"http://{node['metrics']}/metrics" in said
            with urllib.request.urlopen(f"http://{node['metrics']}/metrics", timeout=10) as response:
                assert b"process_cpu_seconds_total" in response.read()
        assert up.stop() == 0
    finally:
        up.kill_everything()
