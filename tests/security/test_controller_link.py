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
    # Sessions of 3 s (KIP-368): the broker's links to the controller renew theirs in time.
    controller = node(1, "controller", f"CONTROLLER://127.0.0.1:{ports['controller']}", "controller1", "c-secret",
                      **{"listener.name.controller.connections.max.reauth.ms": "3000"})
    controller.ready.wait("READY ", 60, controller)
    broker = node(2, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker']}", "broker2", "b-secret")
    broker.ready.wait("READY ", 60, broker)
    # Topic creation goes broker -> controller over SASL_SSL; data through the broker.
    sec = ClientSecurity(f"127.0.0.1:{ports['broker']}")
    assert ROUND_TRIPS["confluent-kafka"](sec, "over-secure-quorum") == VALUES
    # A broker with the wrong password never registers, and says why.
    intruder = node(3, "broker", f"PLAINTEXT://127.0.0.1:{ports['broker3']}", "broker3", "bad-b3-password")
    deadline = time.monotonic() + 60
    while "SASL PLAIN login as broker3" not in (tmp_path / "n3.err").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    assert intruder.poll() is None and not any(line.startswith("READY") for line in intruder.ready.lines)
    intruder_log = (tmp_path / "n3.err").read_text()
    assert "SASL PLAIN login as broker3" in intruder_log and "Invalid username or password" in intruder_log
    controller_log = (tmp_path / "n1.err").read_text()
    assert "SASL PLAIN authentication from 127.0.0.1" in controller_log
    assert "bad-b3-password" not in controller_log + intruder_log
    listed = AdminClient({"bootstrap.servers": sec.bootstrap}).list_topics(timeout=10)
    assert sorted(listed.brokers) == [2]
    assert ROUND_TRIPS["confluent-kafka"](sec, "after-renewals") == VALUES
    assert "did not re-authenticate" not in (tmp_path / "n1.err").read_text()


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
    denied = "Principal = User:broker3 is Denied operation = CLUSTER_ACTION"
    deadline = time.monotonic() + 60
    while denied not in (tmp_path / "n1.err").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    assert outsider.poll() is None and not any(line.startswith("READY") for line in outsider.ready.lines)
    assert denied in (tmp_path / "n1.err").read_text()
    listed = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports['broker']}"}).list_topics(timeout=10)
    assert sorted(listed.brokers) == [2]
    # An admin client straight on the controller listener, authenticated but
    # without ClusterAction, gets each request's own check and Kafka's error.
    assert_direct_admin_checks(ports["controller"], tmp_path / "ca.pem")


def assert_direct_admin_checks(port: int, ca) -> None:
    import ssl

    import trio
    from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
    from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
    from kio.schema.errors import ErrorCode

    from common.security.client import ClientSecurity as NodeSecurity
    from common.wire.client import open_connection
    from quorum.node.describe_quorum import describe_quorum_request
    from quorum.node.workload import create_topics_request

    tls = ssl.create_default_context(cafile=str(ca))

    def login(user: str, password: str) -> NodeSecurity:
        return NodeSecurity("SASL_SSL", tls, "PLAIN", user, password)

    node_configs = DescribeConfigsRequest(resources=(DescribeConfigsResource(
        resource_type=4, resource_name="1", configuration_keys=None),))

    async def errors(conn) -> tuple:
        quorum = await conn.request(describe_quorum_request())
        configs = await conn.request(node_configs)
        created = await conn.request(create_topics_request(["direct"]))
        return quorum.error_code, configs.results[0].error_code, created.topics[0].error_code

    async def main():
        async with open_connection("127.0.0.1", port, security=login("broker3", "b3-secret")) as conn:
            assert await errors(conn) == (ErrorCode.cluster_authorization_failed,
                                          ErrorCode.cluster_authorization_failed,
                                          ErrorCode.topic_authorization_failed)
        async with open_connection("127.0.0.1", port, security=login("controller1", "c-secret")) as conn:
            # Describe and DescribeConfigs on the cluster (operations 8 and 10), allowed (3), literal (3);
            # Create (5) on topics prefixed (4) "allowed-".
            granted = await conn.request(CreateAclsRequest(creations=tuple(
                AclCreation(resource_type=rtype, resource_name=name, resource_pattern_type=pattern,
                            principal="User:broker3", host="*", operation=op, permission_type=3)
                for rtype, name, pattern, op in ((4, "kafka-cluster", 3, 8), (4, "kafka-cluster", 3, 10),
                                                 (2, "allowed-", 4, 5)))))
            assert all(r.error_code == ErrorCode.none for r in granted.results), granted
        async with open_connection("127.0.0.1", port, security=login("broker3", "b3-secret")) as conn:
            with trio.fail_after(10):
                while (found := await errors(conn))[:2] != (ErrorCode.none, ErrorCode.none):
                    await trio.sleep(0.2)
            assert found[2] == ErrorCode.topic_authorization_failed
            # Item by item, as Kafka: the allowed topic is created, the other refused.
            created = await conn.request(create_topics_request(["allowed-one", "refused-one"]))
            codes = {t.name: t.error_code for t in created.topics}
            assert codes == {"allowed-one": ErrorCode.none, "refused-one": ErrorCode.topic_authorization_failed}

    trio.run(main)
