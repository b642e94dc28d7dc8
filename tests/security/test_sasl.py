"""SASL_PLAINTEXT and SASL_SSL with PLAIN and SCRAM-SHA-256/512: each
client library's round trip; SCRAM users managed in the metadata log;
a wrong password is refused with Kafka's error and hurts nobody else."""

from __future__ import annotations

import pytest

from secure_clients import ROUND_TRIPS, VALUES, ClientSecurity

CASES = [
    ("SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", "scram", "scram-secret"),
    ("SASL_SSL", "SCRAM-SHA-256", "scram", "scram-secret"),
]


@pytest.mark.parametrize("client", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("protocol, mechanism, user, password", CASES)
def test_round_trip_over_sasl(secure_node, client, protocol, mechanism, user, password):
    sec = ClientSecurity(f"127.0.0.1:{secure_node.ports[protocol]}", protocol,
                         ca=secure_node.ca if protocol == "SASL_SSL" else None, mechanism=mechanism, user=user,
                         password=password)
    topic = f"sasl-{client}-{protocol}-{mechanism}".lower()
    assert ROUND_TRIPS[client](sec, topic) == VALUES


def authentication_errors(sec: ClientSecurity) -> list[str]:
    """The authentication errors librdkafka reports for a connection with `sec`."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors = []
    admin = AdminClient({**sec.confluent(), "error_cb": errors.append, "log_level": 0})
    try:
        admin.list_topics(timeout=5)
    except KafkaException:
        pass
    admin.poll(1)  # error_cb is served by poll
    return [e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION]


@pytest.mark.parametrize("protocol, mechanism, user", [("SASL_PLAINTEXT", "PLAIN", "alice"),
                                                       ("SASL_SSL", "SCRAM-SHA-256", "scram"),
                                                       ("SASL_PLAINTEXT", "SCRAM-SHA-512", "nobody")])
def test_wrong_password_is_refused_and_the_node_stays_up(secure_node, protocol, mechanism, user):
    sec = ClientSecurity(f"127.0.0.1:{secure_node.ports[protocol]}", protocol,
                         ca=secure_node.ca if protocol == "SASL_SSL" else None, mechanism=mechanism, user=user,
                         password="wrong-password")
    errors = authentication_errors(sec)
    assert errors and "Authentication failed" in errors[0], errors
    log = secure_node.log()
    assert f"SASL {mechanism} authentication from 127.0.0.1" in log
    assert "wrong-password" not in log
    assert secure_node.alive()
    good = ClientSecurity(f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT", mechanism="PLAIN",
                          user="alice", password="alice-secret")
    assert not authentication_errors(good)


def test_plaintext_request_on_a_sasl_listener_closes_that_connection(secure_node):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}"})
    with pytest.raises(Exception):
        admin.list_topics(timeout=3)
    assert "unexpected Metadata(3) request during SASL authentication" in secure_node.log()
    assert secure_node.alive()


def test_scram_users_live_in_the_metadata_log(secure_node):
    """AlterUserScramCredentials adds a user who can log in at once;
    DescribeUserScramCredentials lists it; deleting it locks it out."""
    from kafka import KafkaAdminClient
    from kafka.admin import ScramMechanism, UserScramCredentialDeletion, UserScramCredentialUpsertion

    admin_sec = ClientSecurity(f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT",
                               mechanism="PLAIN", user="admin", password="admin-secret")
    admin = KafkaAdminClient(**admin_sec.kafka_python())
    try:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("bob", ScramMechanism.SCRAM_SHA_512,
                                                                         "bob-secret", iterations=4096)])
        described = admin.describe_user_scram_credentials(["bob"])
        assert "bob" in str(described)
        bob = ClientSecurity(admin_sec.bootstrap, "SASL_PLAINTEXT", mechanism="SCRAM-SHA-512", user="bob",
                             password="bob-secret")
        assert ROUND_TRIPS["confluent-kafka"](bob, "scram-bob") == VALUES
        admin.alter_user_scram_credentials([UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_512)])
    finally:
        admin.close()
    assert authentication_errors(bob)


def test_users_command(secure_node, tmp_path):
    from cluster_testing import run_cli

    config = tmp_path / "admin.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                      "sasl.password=admin-secret\n")
    bootstrap = f"127.0.0.1:{secure_node.ports['SASL_PLAINTEXT']}"
    common = ["--bootstrap-server", bootstrap, "--command-config", str(config)]
    added = run_cli("users", "add", *common, "--user", "dora", "--password", "dora-secret")
    assert added.returncode == 0, added.stderr
    listed = run_cli("users", "list", *common)
    assert "dora: SCRAM-SHA-256 (iterations 4096), SCRAM-SHA-512 (iterations 4096)" in listed.stdout, listed
    assert "scram: SCRAM-SHA-256 (iterations 4096), SCRAM-SHA-512 (iterations 8192)" in listed.stdout, listed
    dora = ClientSecurity(bootstrap, "SASL_PLAINTEXT", mechanism="SCRAM-SHA-256", user="dora", password="dora-secret")
    assert not authentication_errors(dora)
    deleted = run_cli("users", "delete", *common, "--user", "dora")
    assert deleted.returncode == 0, deleted.stderr
    assert authentication_errors(dora)
    refused = run_cli("users", "add", *common, "--user", "x", "--password", "p", "--iterations", "100")
    assert refused.returncode == 1 and "iterations" in refused.stderr, refused


def test_dev_secure_prints_settings_a_client_can_use(tmp_path):
    import subprocess

    from cluster_testing import READY_TIMEOUT_S, ReadyLine, raftka_command
    from common.wire.ports import free_ports

    port, controller = free_ports(2)
    process = subprocess.Popen(raftka_command("dev", "--secure", "--data-dir", str(tmp_path), "--port", str(port),
                                              "--controller-port", str(controller)),
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        reader = ReadyLine(process)
        reader.wait("READY ", READY_TIMEOUT_S, process)
        settings = dict(line.split("=", 1) for line in reader.lines if "=" in line and not line.startswith("READY"))
        assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.mechanism"] == "SCRAM-SHA-512"
        sec = ClientSecurity(settings["bootstrap.servers"], "SASL_SSL", ca=settings["ssl.ca.location"],
                             mechanism="SCRAM-SHA-512", user=settings["sasl.username"],
                             password=settings["sasl.password"])
        assert ROUND_TRIPS["confluent-kafka"](sec, "dev-secure") == VALUES
        java = (tmp_path / "secure" / "client.properties").read_text()
        assert "security.protocol=SASL_SSL" in java and "ScramLoginModule" in java
    finally:
        process.terminate()
        process.wait(30)


def test_cluster_up_secure_gives_each_broker_a_sasl_ssl_listener(tmp_path):
    from cluster_testing import ClusterUp

    cluster = ClusterUp(tmp_path / "cluster", 1, 2, "--secure", "--set", "offsets.topic.replication.factor=2")
    try:
        cluster.start()
        settings = dict(line.split("=", 1) for line in
                        (tmp_path / "cluster" / "secure" / "client-librdkafka.properties").read_text().splitlines())
        assert len(settings["bootstrap.servers"].split(",")) == 2
        sec = ClientSecurity(settings["bootstrap.servers"], "SASL_SSL", ca=settings["ssl.ca.location"],
                             mechanism="SCRAM-SHA-512", user=settings["sasl.username"],
                             password=settings["sasl.password"])
        assert ROUND_TRIPS["confluent-kafka"](sec, "cluster-secure") == VALUES
    finally:
        cluster.kill_everything()
