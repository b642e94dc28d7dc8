"""The ACL authorizer: a principal with Read on one topic and one group
consumes it and gets Kafka's authorization error for everything else;
deny beats allow; prefixed ACLs cover new topics; removing an ACL takes
effect on the next request; `raftka acls` manages them."""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from cluster_testing import run_cli
from secure_clients import ClientSecurity

VALUES = [f"order-{i}".encode() for i in range(10)]


def _sec(node, user: str) -> dict:
    return ClientSecurity(f"127.0.0.1:{node.ports['SASL_PLAINTEXT']}", "SASL_PLAINTEXT", mechanism="PLAIN",
                          user=user, password=f"{user}-secret").confluent()


def _acl(name, operation, principal="User:alice", permission=AclPermissionType.ALLOW,
         resource=ResourceType.TOPIC, pattern=ResourcePatternType.LITERAL):
    return AclBinding(resource, name, pattern, principal, "*", operation, permission)


def _wait(futures):
    for f in (futures.values() if isinstance(futures, dict) else futures):
        f.result(30)


@pytest.fixture(scope="module")
def orders(acl_node):
    admin = AdminClient(_sec(acl_node, "admin"))
    _wait(admin.create_topics([NewTopic("orders", 1, 1), NewTopic("payments", 1, 1)], operation_timeout=30))
    producer = Producer(_sec(acl_node, "admin"))
    for value in VALUES:
        producer.produce("orders", value=value)
    assert producer.flush(30) == 0
    _wait(admin.create_acls([_acl("orders", AclOperation.READ),
                             _acl("readers", AclOperation.READ, resource=ResourceType.GROUP)]))
    return admin


def _consume(node, user: str, group: str, topic: str = "orders", count: int = len(VALUES)):
    consumer = Consumer({**_sec(node, user), "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    out, errors = [], []
    deadline = time.monotonic() + 20
    try:
        while len(out) < count and not errors and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(message.error().code())
            else:
                out.append(message.value())
        if out and not errors:
            consumer.commit(asynchronous=False)
    except KafkaException as exc:
        errors.append(exc.args[0].code())
    finally:
        consumer.close()
    return out, errors


def test_read_on_one_topic_and_group_consumes_it(acl_node, orders):
    out, errors = _consume(acl_node, "alice", "readers")
    assert (out, errors) == (VALUES, [])


def test_everything_else_is_refused_with_kafkas_errors(acl_node, orders):
    alice = AdminClient(_sec(acl_node, "alice"))
    # Metadata hides the topics alice may not describe.
    assert set(alice.list_topics(timeout=10).topics) == {"orders"}
    # Produce: TOPIC_AUTHORIZATION_FAILED.
    reports = []
    producer = Producer({**_sec(acl_node, "alice"), "message.timeout.ms": 5000})
    producer.produce("orders", value=b"x", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(10)
    assert reports and reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Create and delete topics: TOPIC_AUTHORIZATION_FAILED.
    with pytest.raises(KafkaException) as created:
        _wait(alice.create_topics([NewTopic("alices", 1, 1)], operation_timeout=10))
    assert created.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as deleted:
        _wait(alice.delete_topics(["payments"], operation_timeout=10))
    assert deleted.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Another group: GROUP_AUTHORIZATION_FAILED.
    out, errors = _consume(acl_node, "alice", "someone-elses")
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors, (out, errors)
    # Another topic: TOPIC_AUTHORIZATION_FAILED.
    out, errors = _consume(acl_node, "alice", "readers", topic="payments", count=1)
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, (out, errors)
    # ACLs themselves: CLUSTER_AUTHORIZATION_FAILED.
    with pytest.raises(KafkaException) as acl_change:
        _wait(alice.create_acls([_acl("payments", AclOperation.READ)]))
    assert acl_change.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # Configs and partitions: TOPIC_AUTHORIZATION_FAILED (Read does not imply DescribeConfigs).
    from confluent_kafka.admin import ConfigResource, NewPartitions

    with pytest.raises(KafkaException) as configs:
        _wait(alice.describe_configs([ConfigResource("topic", "orders")]))
    assert configs.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    _wait(orders.describe_configs([ConfigResource("topic", "orders")]))
    with pytest.raises(KafkaException) as grown:
        _wait(alice.create_partitions([NewPartitions("orders", 2)]))
    assert grown.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Someone without any ACL sees nothing.
    assert set(AdminClient(_sec(acl_node, "eve")).list_topics(timeout=10).topics) == set()


def test_deny_beats_allow_and_removal_takes_effect_at_once(acl_node, orders):
    deny = _acl("orders", AclOperation.READ, permission=AclPermissionType.DENY)
    _wait(orders.create_acls([deny]))
    out, errors = _consume(acl_node, "alice", "readers")
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors, (out, errors)
    _wait(orders.delete_acls([AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL,
                                               "User:alice", "*", AclOperation.READ, AclPermissionType.DENY)]))
    # Assigned from offset 0: the group's committed offset does not matter.
    consumer = Consumer({**_sec(acl_node, "alice"), "group.id": "readers"})
    consumer.assign([TopicPartition("orders", 0, 0)])
    message = None
    deadline = time.monotonic() + 10
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == VALUES[0]


def test_prefixed_acl_covers_new_topics(acl_node, orders):
    _wait(orders.create_acls([
        _acl("logs-", AclOperation.CREATE, pattern=ResourcePatternType.PREFIXED),
        _acl("logs-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
    ]))
    alice = AdminClient(_sec(acl_node, "alice"))
    _wait(alice.create_topics([NewTopic("logs-app", 1, 1)], operation_timeout=30))
    producer = Producer(_sec(acl_node, "alice"))
    reports = []
    producer.produce("logs-app", value=b"line", on_delivery=lambda err, msg: reports.append(err))
    producer.flush(20)
    assert reports == [None]


def test_acls_command(acl_node, orders, tmp_path):
    config = tmp_path / "admin.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                      "sasl.password=admin-secret\n")
    common = ["--bootstrap-server", f"127.0.0.1:{acl_node.ports['SASL_PLAINTEXT']}", "--command-config", str(config)]
    added = run_cli("acls", "add", *common, "--allow-principal", "User:eve", "--operation", "Read",
                    "--operation", "Describe", "--topic", "payments")
    assert added.returncode == 0, added.stderr
    assert "Added ACL: ALLOW User:eve from * READ on TOPIC literal payments" in added.stdout
    assert set(AdminClient(_sec(acl_node, "eve")).list_topics(timeout=10).topics) == {"payments"}
    listed = run_cli("acls", "list", *common, "--topic", "payments")
    assert listed.returncode == 0 and listed.stdout.count("User:eve") == 2, listed
    removed = run_cli("acls", "remove", *common, "--allow-principal", "User:eve", "--topic", "payments")
    assert removed.returncode == 0 and removed.stdout.count("Removed ACL") == 2, removed
    assert set(AdminClient(_sec(acl_node, "eve")).list_topics(timeout=10).topics) == set()
    refused = run_cli("acls", "add", "--bootstrap-server", common[1], "--command-config", str(config),
                      "--allow-principal", "User:eve", "--operation", "Read", "--topic", "x",
                      "--resource-pattern-type", "any")
    assert refused.returncode != 0
    assert subprocess  # the CLI runs as its own process (run_cli)


def test_a_mechanism_the_listener_does_not_enable_is_refused(acl_node):
    """The SASL listener here enables PLAIN only: SCRAM gets UNSUPPORTED_SASL_MECHANISM."""
    errors = []
    admin = AdminClient({**_sec(acl_node, "alice"), "sasl.mechanism": "SCRAM-SHA-512", "error_cb": errors.append,
                         "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)
    assert any("SCRAM-SHA-512" in e.str() and "PLAIN" in e.str() for e in errors), [e.str() for e in errors]
    assert "asked for mechanism 'SCRAM-SHA-512'; this listener enables PLAIN" in acl_node.log()
    assert acl_node.alive()


def test_offsets_need_read_on_the_topic_as_well_as_the_group(acl_node, orders):
    """OffsetCommit needs READ on each topic, OffsetFetch DESCRIBE; the
    refused partitions get TOPIC_AUTHORIZATION_FAILED and the rest commit."""
    consumer = Consumer({**_sec(acl_node, "alice"), "group.id": "readers", "enable.auto.commit": False})
    try:
        with pytest.raises(KafkaException) as committed:
            consumer.commit(offsets=[TopicPartition("orders", 0, 3), TopicPartition("payments", 0, 1)],
                            asynchronous=False)
        assert committed.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        fetched = consumer.committed([TopicPartition("orders", 0), TopicPartition("payments", 0)], timeout=10)
        by_topic = {tp.topic: tp for tp in fetched}
        assert by_topic["orders"].error is None and by_topic["orders"].offset == 3
        assert by_topic["payments"].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    # The admin's committed offset on payments in the same group is hidden from alice's "all topics" fetch.
    admin_consumer = Consumer({**_sec(acl_node, "admin"), "group.id": "readers", "enable.auto.commit": False})
    admin_consumer.commit(offsets=[TopicPartition("payments", 0, 1)], asynchronous=False)
    admin_consumer.close()
    from confluent_kafka import ConsumerGroupTopicPartitions

    alice = AdminClient(_sec(acl_node, "alice"))
    listed = alice.list_consumer_group_offsets([ConsumerGroupTopicPartitions("readers")])["readers"].result(10)
    assert {tp.topic for tp in listed.topic_partitions} == {"orders"}
    listed = orders.list_consumer_group_offsets([ConsumerGroupTopicPartitions("readers")])["readers"].result(10)
    assert {tp.topic for tp in listed.topic_partitions} == {"orders", "payments"}


def test_group_listing_and_describing_answer_per_group(acl_node, orders):
    """ListGroups shows only the groups the principal may describe;
    DescribeGroups and DeleteGroups answer each group on its own."""
    admin_consumer = Consumer({**_sec(acl_node, "admin"), "group.id": "admins-group", "enable.auto.commit": False})
    admin_consumer.commit(offsets=[TopicPartition("orders", 0, 1)], asynchronous=False)
    admin_consumer.close()
    alice = AdminClient(_sec(acl_node, "alice"))
    everyone = {g.group_id for g in orders.list_consumer_groups().result(10).valid}
    assert "admins-group" in everyone
    assert {g.group_id for g in alice.list_consumer_groups().result(10).valid} <= {"readers"}
    described = alice.describe_consumer_groups(["readers", "admins-group"])
    assert described["readers"].result(10).group_id == "readers"
    with pytest.raises(KafkaException) as refused:
        described["admins-group"].result(10)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as deleted:
        _wait(alice.delete_consumer_groups(["admins-group"], request_timeout=10))
    assert deleted.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert "admins-group" in {g.group_id for g in orders.list_consumer_groups().result(10).valid}


def test_transactions_need_write_on_the_transactional_id_and_the_topics(acl_node, orders):
    """InitProducerId and AddPartitionsToTxn need WRITE on the transactional
    id; AddPartitionsToTxn WRITE on each topic, AddOffsetsToTxn READ on the group."""
    def producer(txn_id):
        return Producer({**_sec(acl_node, "alice"), "transactional.id": txn_id, "transaction.timeout.ms": 10000})

    with pytest.raises(KafkaException) as no_id:
        producer("alice-tx").init_transactions(10)
    assert no_id.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    _wait(orders.create_acls([_acl("alice-tx", AclOperation.WRITE, resource=ResourceType.TRANSACTIONAL_ID),
                              _acl("alice-tx", AclOperation.DESCRIBE, resource=ResourceType.TRANSACTIONAL_ID)]))
    p = producer("alice-tx")
    p.init_transactions(10)
    # orders: alice may read (so describe) but not write it.
    p.begin_transaction()
    p.produce("orders", value=b"x")
    with pytest.raises(KafkaException) as no_topic:
        p.commit_transaction(10)
    assert no_topic.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Offsets of a group alice may not read (a new producer instance: the old one's state is fatal).
    p = producer("alice-tx")
    p.init_transactions(10)
    p.begin_transaction()
    consumer = Consumer({**_sec(acl_node, "alice"), "group.id": "someone-elses"})
    with pytest.raises(KafkaException) as no_group:
        p.send_offsets_to_transaction([TopicPartition("orders", 0, 1)], consumer.consumer_group_metadata(), 10)
    assert no_group.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    consumer.close()


def test_delete_records_and_log_dirs_need_their_own_acls(acl_node, orders):
    """DeleteRecords needs DELETE on the topic; DescribeLogDirs DESCRIBE and
    AlterReplicaLogDirs ALTER on the cluster."""
    from confluent_kafka import TopicPartition as TP

    alice = AdminClient(_sec(acl_node, "alice"))
    with pytest.raises(KafkaException) as trimmed:
        _wait(alice.delete_records([TP("orders", 0, 1)], request_timeout=10))
    assert trimmed.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    from kafka import KafkaAdminClient

    def kafka_python(user):
        return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{acl_node.ports['SASL_PLAINTEXT']}",
                                security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                sasl_plain_username=user, sasl_plain_password=f"{user}-secret")

    # kafka-python does not surface the answer's CLUSTER_AUTHORIZATION_FAILED: alice sees no directories.
    admin = kafka_python("admin")
    try:
        assert admin.describe_log_dirs()[0]["log_dirs"]
    finally:
        admin.close()
    client = kafka_python("alice")
    try:
        assert client.describe_log_dirs()[0]["log_dirs"] == []
        # Moving a replica between dirs needs ALTER on the cluster.
        from kafka.errors import ClusterAuthorizationFailedError

        moved = client.alter_replica_log_dirs({("orders", 0, 1): "/elsewhere"})
        assert list(moved.values()) == [ClusterAuthorizationFailedError], moved
    finally:
        client.close()
    assert "Principal = User:alice is Denied operation = DESCRIBE" in acl_node.log()
    assert "on resource = CLUSTER:LITERAL:kafka-cluster" in acl_node.log()


def test_consumer_protocol_groups_are_checked(acl_node, orders):
    """KIP-848's ConsumerGroupHeartbeat needs READ on the group and DESCRIBE
    on each subscribed topic."""
    def consume(group, topic):
        consumer = Consumer({**_sec(acl_node, "alice"), "group.id": group, "group.protocol": "consumer",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic])
        deadline = time.monotonic() + 15
        try:
            while time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None:
                    return message.error() or message.value()
        except KafkaException as exc:
            return exc.args[0]
        finally:
            consumer.close()
        return None

    assert consume("readers", "orders") in VALUES  # from the group's committed offset, if any
    # DESCRIBE on a group lets alice find its coordinator, not join it.
    _wait(orders.create_acls([_acl("watchers", AclOperation.DESCRIBE, resource=ResourceType.GROUP)]))
    refused = consume("watchers", "orders")
    # librdkafka makes a refused heartbeat a fatal error carrying the broker's error.
    assert isinstance(refused, KafkaError) and "Group authorization failed" in refused.str(), refused


def test_a_brokers_configs_need_the_cluster_and_hide_their_secrets(acl_node, orders):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    alice = AdminClient(_sec(acl_node, "alice"))
    broker = ConfigResource("broker", "1")
    with pytest.raises(KafkaException) as described:
        _wait(alice.describe_configs([broker]))
    assert described.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    change = ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as altered:
        _wait(alice.incremental_alter_configs([change]))
    assert altered.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # A super user reads them, with the JAAS text (passwords) left out.
    (future,) = orders.describe_configs([broker]).values()
    entries = future.result(30)
    jaas = entries["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    assert jaas.is_sensitive and jaas.value is None
    assert entries["log.dirs"].value
