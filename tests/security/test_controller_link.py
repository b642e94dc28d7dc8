"""The controller listener secured like a client listener: a broker
registers, fetches the metadata log and forwards admin requests over
SASL_SSL; a broker with a wrong password stays out and says why; a client
without credentials cannot fetch the metadata log or vote."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from cluster_testing import ReadyLine, raftka_command, run_cli
from common.security.certs import CertificateAuthority
from common.wire.ports import free_ports
from secure_clients import ROUND_TRIPS, VALUES, ClientSecurity
from secure_node import CLUSTER_ID, write_properties

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" password="{password}" '
        'user_controller1="c-secret" user_broker2="b-secret" user_broker3="b3-secret";')


@pytest.fixture
def secure_quorum(tmp_path):
    ca = CertificateAuthority()
    ca.write_ca(tmp_path / "ca.pem")
    ca.write_keystore(tmp_path / "node.pem", "localhost", ("localhost", "127.0.0.1"))
    controller_port, broker_port, broker3_port, internal2, internal3 = free_ports(5)
    common = {
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:SASL_SSL,PLAINTEXT:PLAINTEXT",
        "ssl.keystore.location": str(tmp_path / "node.pem"),
        "ssl.truststore.location": str(tmp_path / "ca.pem"),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "offsets.topic.replication.factor": "1",
        "broker.session.timeout.ms": "4000", "broker.heartbeat.interval.ms": "500",
    }

    def node(node_id: int, roles: str, listeners: str, user: str, password: str,
             **extra: str) -> subprocess.Popen[str]:
        props = {**common, **extra, "process.roles": roles, "node.id": str(node_id), "listeners": listeners,
                 "log.dirs": str(tmp_path / f"n{node_id}"),
                 "listener.name.controller.plain.sasl.jaas.config": JAAS.format(user=user, password=password)}
        config = write_properties(tmp_path / f"n{node_id}.properties", props)
        assert run_cli("storage", "format", "--config", str(config), "--cluster-id", CLUSTER_ID).returncode == 0
        err = open(tmp_path / f"n{node_id}.err", "w")
        command = "controller" if roles == "controller" else "broker"
        process = subprocess.Popen(raftka_command(command, "--config", str(config)), stdout=subprocess.PIPE,
                                   stderr=err, text=True)
        process.ready = ReadyLine(process)
        processes.append(process)
        return process

    processes: list[subprocess.Popen[str]] = []
    yield node, tmp_path, {"controller": controller_port, "broker": broker_port, "broker3": broker3_port,
                           "internal2": internal2, "internal3": internal3}
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_broker_and_controller_over_sasl_ssl(secure_quorum):
    node, tmp_path, ports = secure_quorum
    controller = node(1, "controller", f"CONTROLLER://127.0.0.1:{ports['controller']}", "controller1", "c-secret")
    controller.ready.wait("READY ", 60, controller)
    broker = node(2, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker']}", "broker2", "b-secret")
    broker.ready.wait("READY ", 60, broker)
    # Topic creation goes broker -> controller over SASL_SSL; data through the broker.
    sec = ClientSecurity(f"127.0.0.1:{ports['broker']}")
    assert ROUND_TRIPS["confluent-kafka"](sec, "over-secure-quorum") == VALUES
    # A broker with the wrong password never registers, and says why.
    intruder = node(3, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker3']}", "broker3", "bad-b3-password")
    time.sleep(8)
    assert intruder.poll() is None and not any(line.startswith("READY") for line in intruder.ready.lines)
    intruder_log = (tmp_path / "n3.err").read_text()
    assert "SASL PLAIN login as broker3" in intruder_log and "Invalid username or password" in intruder_log
    controller_log = (tmp_path / "n1.err").read_text()
    assert "SASL PLAIN authentication from 127.0.0.1" in controller_log
    assert "bad-b3-password" not in controller_log + intruder_log
    listed = AdminClient({"bootstrap.servers": sec.bootstrap}).list_topics(timeout=10)
    assert sorted(listed.brokers) == [2]


def test_replication_over_a_sasl_ssl_inter_broker_listener(secure_quorum):
    """Followers fetch over the INTERNAL (SASL_SSL) listener: an acks=all
    produce to a topic with two replicas completes only if they do."""
    from confluent_kafka import Producer

    node, tmp_path, ports = secure_quorum
    internal = {"inter.broker.listener.name": "INTERNAL",
                "listener.security.protocol.map": "CONTROLLER:SASL_SSL,PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL",
                "listener.name.internal.plain.sasl.jaas.config": JAAS.format(user="broker2", password="b-secret"),
                "offsets.topic.replication.factor": "2"}
    controller = node(1, "controller", f"CONTROLLER://127.0.0.1:{ports['controller']}", "controller1", "c-secret",
                      **{k: v for k, v in internal.items() if k == "listener.security.protocol.map"})
    controller.ready.wait("READY ", 60, controller)
    brokers = [node(2, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker']},INTERNAL://127.0.0.1:{ports['internal2']}",
                    "broker2", "b-secret", **internal),
               node(3, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker3']},INTERNAL://127.0.0.1:{ports['internal3']}",
                    "broker3", "b3-secret", **internal)]
    for broker in brokers:
        broker.ready.wait("READY ", 60, broker)
    bootstrap = f"127.0.0.1:{ports['broker']}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("replicated", 1, 2)], operation_timeout=30)["replicated"].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 30000})
    reports = []
    for value in VALUES:
        producer.produce("replicated", value=value, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(60) == 0
    assert reports == [None] * len(VALUES)
    isr = admin.list_topics("replicated", timeout=10).topics["replicated"].partitions[0].isrs
    assert sorted(isr) == [2, 3]
    # Both registered their INTERNAL endpoint as SASL_SSL, which the followers used.
    assert "fetcher from broker" not in (tmp_path / "n2.err").read_text() + (tmp_path / "n3.err").read_text()


def test_controller_listener_needs_cluster_action(secure_quorum):
    """With an authorizer, the controller listener is checked like a broker's:
    a broker whose principal lacks ClusterAction on the cluster cannot fetch
    the metadata log or register, however right its password."""
    node, tmp_path, ports = secure_quorum
    acl = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "super.users": "User:controller1;User:broker2"}
    controller = node(1, "controller", f"CONTROLLER://127.0.0.1:{ports['controller']}", "controller1", "c-secret",
                      **acl)
    controller.ready.wait("READY ", 60, controller)
    broker = node(2, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker']}", "broker2", "b-secret")
    broker.ready.wait("READY ", 60, broker)
    outsider = node(3, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker3']}", "broker3", "b3-secret")
    time.sleep(8)
    assert outsider.poll() is None and not any(line.startswith("READY") for line in outsider.ready.lines)
    controller_log = (tmp_path / "n1.err").read_text()
    assert "Principal = User:broker3 is Denied operation = CLUSTER_ACTION" in controller_log
    listed = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports['broker']}"}).list_topics(timeout=10)
    assert sorted(listed.brokers) == [2]
