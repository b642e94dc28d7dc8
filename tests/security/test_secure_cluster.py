"""A 3+3 cluster with every link on SASL_SSL (controller listener, the
inter-broker listener, the client listener): replication, a controller
failover and a broker restart work (six processes: about 40 s here)."""

from __future__ import annotations

import signal
import subprocess
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cluster_testing import ReadyLine, raftka_command, run_cli
from common.security.certs import CertificateAuthority
from common.wire.ports import free_ports
from secure_clients import ROUND_TRIPS, VALUES, ClientSecurity
from secure_node import CLUSTER_ID, write_properties

USERS = 'user_node="node-secret" user_app="app-secret"'


def _jaas(user: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" '
            f'password="{password}" {USERS};')


def _active_controller(tmp_path) -> int:
    """The controller that logged becoming active last (the logs' timestamps order them)."""
    latest = {}
    for node_id in (1, 2, 3):
        lines = [line for line in (tmp_path / f"n{node_id}.err").read_text().splitlines()
                 if "active controller for epoch" in line]
        if lines:
            latest[lines[-1][:23]] = node_id
    assert latest, "no controller became active"
    return latest[max(latest)]


def test_every_link_on_sasl_ssl(tmp_path):
    ca = CertificateAuthority()
    ca.write_ca(tmp_path / "ca.pem")
    ca.write_keystore(tmp_path / "node.pem", "localhost", ("localhost", "127.0.0.1"))
    ports = free_ports(9)
    controller_ports, internal_ports, external_ports = ports[:3], ports[3:6], ports[6:]
    common = {
        "controller.quorum.voters": ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(controller_ports)),
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:SASL_SSL,INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.location": str(tmp_path / "node.pem"),
        "ssl.truststore.location": str(tmp_path / "ca.pem"),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas("node", "node-secret"),
        "listener.name.internal.plain.sasl.jaas.config": _jaas("node", "node-secret"),
        "listener.name.external.plain.sasl.jaas.config": _jaas("node", "node-secret"),
        "broker.session.timeout.ms": "4000", "broker.heartbeat.interval.ms": "500",
        "offsets.topic.replication.factor": "3", "default.replication.factor": "3",
    }
    processes: dict[int, subprocess.Popen[str]] = {}

    def start(node_id: int) -> subprocess.Popen[str]:
        config = tmp_path / f"n{node_id}.properties"
        command = "controller" if node_id <= 3 else "broker"
        err = open(tmp_path / f"n{node_id}.err", "a")
        process = subprocess.Popen(raftka_command(command, "--config", str(config)), stdout=subprocess.PIPE,
                                   stderr=err, text=True)
        process.ready = ReadyLine(process)
        processes[node_id] = process
        return process

    for node_id in range(1, 7):
        if node_id <= 3:
            props = {"process.roles": "controller", "listeners": f"CONTROLLER://127.0.0.1:{controller_ports[node_id - 1]}"}
        else:
            i = node_id - 4
            props = {"process.roles": "broker",
                     "listeners": f"INTERNAL://127.0.0.1:{internal_ports[i]},EXTERNAL://127.0.0.1:{external_ports[i]}"}
        config = write_properties(tmp_path / f"n{node_id}.properties", {
            **common, **props, "node.id": str(node_id), "log.dirs": str(tmp_path / f"n{node_id}")})
        assert run_cli("storage", "format", "--config", str(config), "--cluster-id", CLUSTER_ID).returncode == 0
    try:
        for node_id in range(1, 7):
            start(node_id)
        for node_id, process in processes.items():
            process.ready.wait("READY ", 180, process)
        sec = ClientSecurity(",".join(f"127.0.0.1:{p}" for p in external_ports), "SASL_SSL", ca=str(tmp_path / "ca.pem"),
                             mechanism="PLAIN", user="app", password="app-secret")
        admin = AdminClient(sec.confluent())
        admin.create_topics([NewTopic("secure-replicated", 1, 3)], operation_timeout=60)["secure-replicated"].result(90)
        producer = Producer({**sec.confluent(), "acks": "all"})
        for value in VALUES:
            producer.produce("secure-replicated", value=value)
        assert producer.flush(60) == 0
        isr = admin.list_topics("secure-replicated", timeout=10).topics["secure-replicated"].partitions[0].isrs
        assert sorted(isr) == [4, 5, 6]
        # Controller failover: the active controller is killed; the other two
        # elect a new one over SASL_SSL, and it serves topic creation.
        active = _active_controller(tmp_path)
        processes[active].send_signal(signal.SIGKILL)
        processes[active].wait()
        assert ROUND_TRIPS["confluent-kafka"](sec, "after-controller-1") == VALUES
        # A broker restart: it logs in, registers again and rejoins the ISR.
        processes[4].send_signal(signal.SIGTERM)
        processes[4].wait(60)
        start(4).ready.wait("READY ", 120, processes[4])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            isr = admin.list_topics("secure-replicated", timeout=10).topics["secure-replicated"].partitions[0].isrs
            if sorted(isr) == [4, 5, 6]:
                break
            time.sleep(1)
        assert sorted(isr) == [4, 5, 6]
        assert ROUND_TRIPS["kafka-python"](sec, "after-broker-4") == VALUES
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
