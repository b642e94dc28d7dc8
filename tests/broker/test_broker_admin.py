"""Admin requests forwarded to the (in-process, real) controller; Metadata,
auto-creation, DescribeCluster, InitProducerId and ListOffsets edge cases."""

import datetime
import os

from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kio.schema.create_topics.v4 import request as ct4
from kio.schema.delete_topics.v4 import request as dt4
from kio.schema.describe_configs.v1 import request as dc1
from kio.schema.describe_configs.v4 import request as dc4
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v0 import request as iac0
from kio.schema.init_producer_id.v4 import request as ip4
from kio.schema.metadata.v8 import request as md8
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest

from broker.shell.cleaner_runtime import compaction_config
from broker_testing import (CLUSTER_ID, batch, in_thread, list_offsets_request, only_partition, produce_request,
                            start_broker)


def metadata_request(*names, auto_create=True):
    topics = None if names == (None,) else tuple(md8.MetadataRequestTopic(name=n) for n in names)
    return md8.MetadataRequest(topics=topics, allow_auto_topic_creation=auto_create,
                               include_cluster_authorized_operations=False,
                               include_topic_authorized_operations=False)


async def test_changes_are_in_this_brokers_image_when_answered(nursery, tmp_path):
    # The controller's images reach the broker 0.15 s after it answers; the
    # broker must hold its own answer until it sees them.
    rb = await start_broker(nursery, tmp_path, publish_lag_s=0.15)
    conn = await rb.connect(nursery)
    created = await conn.request(ct4.CreateTopicsRequest(topics=(ct4.CreatableTopic(
        name="t", num_partitions=2, replication_factor=1, assignments=(),
        configs=(ct4.CreatableTopicConfig(name="retention.ms", value="1000"),)),),
        timeout=datetime.timedelta(seconds=5), validate_only=False))
    assert [(t.name, t.error_code) for t in created.topics] == [("t", ErrorCode.none)]
    assert len(rb.broker.image.topic("t").partitions) == 2
    assert os.path.isdir(tmp_path / "t-1")
    produced = only_partition(await conn.request(produce_request("t", 1, batch(3))))
    assert produced.error_code == ErrorCode.none

    altered = await conn.request(iac0.IncrementalAlterConfigsRequest(resources=(iac0.AlterConfigsResource(
        resource_type=2, resource_name="t", configs=(
            iac0.AlterableConfig(name="retention.ms", config_operation=0, value="5000"),)),), validate_only=False))
    assert altered.responses[0].error_code == ErrorCode.none
    assert rb.broker.image.topic_config("t").get("retention.ms") == "5000"
    described = await conn.request(dc1.DescribeConfigsRequest(resources=(dc1.DescribeConfigsResource(
        resource_type=2, resource_name="t", configuration_keys=("retention.ms", "cleanup.policy")),),
        include_synonyms=False))
    (result,) = described.results
    assert {c.name: c.value for c in result.configs} == {"retention.ms": "5000", "cleanup.policy": "delete"}

    deleted = await conn.request(dt4.DeleteTopicsRequest(topic_names=("t",), timeout=datetime.timedelta(seconds=5)))
    assert [(r.name, r.error_code) for r in deleted.responses] == [("t", ErrorCode.none)]
    assert rb.broker.image.topic("t") is None
    assert not any(name.startswith("t-") for name in os.listdir(tmp_path))
    gone = only_partition(await conn.request(produce_request("t", 1, batch(1))))
    assert gone.error_code == ErrorCode.unknown_topic_or_partition


async def test_kafka_python_admin(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)

    def admin_calls():
        admin = KafkaAdminClient(bootstrap_servers=rb.bootstrap)
        try:
            admin.create_topics([NewTopic("a", 1, 1, topic_configs={"retention.ms": "123456"}), NewTopic("b", 1, 1)])
            admin.create_partitions({"a": NewPartitions(total_count=4)})
            configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "a")])
            admin.delete_topics(["b"])
            cluster = admin.describe_cluster()
            return configs, cluster, sorted(admin.list_topics())
        finally:
            admin.close()

    configs, cluster, topics = await in_thread(admin_calls)
    assert topics == ["a"]
    assert len(rb.broker.image.topic("a").partitions) == 4 and os.path.isdir(tmp_path / "a-3")
    assert cluster["cluster_id"] == rb.broker.config.cluster_id
    assert [b["broker_id"] for b in cluster["brokers"]] == [1] and cluster["controller_id"] == 1
    # kafka-python lists the configs set on the topic (not the defaults).
    assert "123456" in str(configs["topic"]["a"])


async def test_metadata_auto_creation(nursery, tmp_path):
    off = await start_broker(nursery, tmp_path / "off")
    conn = await off.connect(nursery)
    (topic,) = (await conn.request(metadata_request("new"))).topics
    assert topic.error_code == ErrorCode.unknown_topic_or_partition and off.broker.image.topic("new") is None

    on = await start_broker(nursery, tmp_path / "on", auto_create_topics_enable=True, num_partitions=2)
    conn = await on.connect(nursery)
    response = await conn.request(metadata_request("new", "bad name!"))
    by_name = {t.name: t for t in response.topics}
    assert by_name["new"].error_code == ErrorCode.none and len(by_name["new"].partitions) == 2
    assert by_name["bad name!"].error_code == ErrorCode.invalid_topic_exception
    assert on.broker.image.topic("bad name!") is None
    (not_allowed,) = (await conn.request(metadata_request("other", auto_create=False))).topics
    assert not_allowed.error_code == ErrorCode.unknown_topic_or_partition


async def test_metadata_reports_offline_leaders(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    epoch = await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic("theirs", assignments=[(2, 1)])
    conn = await rb.connect(nursery)
    (topic,) = (await conn.request(metadata_request("theirs"))).topics
    (p,) = topic.partitions
    assert (p.error_code, p.leader_id, p.replica_nodes, p.offline_replicas) == (ErrorCode.none, 2, (2, 1), ())
    # Broker 2 asks to be fenced: leadership moves to us, it becomes offline.
    await rb.controller.send(BrokerHeartbeatRequest(broker_id=2, broker_epoch=epoch,
                                                    current_metadata_offset=rb.controller.image.offset,
                                                    want_fence=True, want_shut_down=False))
    response = await conn.request(metadata_request(None))
    assert [b.node_id for b in response.brokers] == [1]
    (p,) = response.topics[0].partitions
    assert (p.leader_id, p.offline_replicas, p.leader_epoch) == (1, (2,), 1)
    assert rb.partition("theirs").state.is_leader


async def test_init_producer_id_hands_out_distinct_ids(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    conn = await rb.connect(nursery)
    request = ip4.InitProducerIdRequest(transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60))
    ids = [(await conn.request(request)).producer_id for _ in range(5)]
    assert len(set(ids)) == 5 and all(i >= 0 for i in ids)
    assert rb.controller.requests_seen.count("AllocateProducerIdsRequest") == 1
    transactional = await conn.request(ip4.InitProducerIdRequest(
        transactional_id="tx", transaction_timeout=datetime.timedelta(seconds=60)))
    assert transactional.error_code != ErrorCode.none


async def test_list_offsets_edge_cases(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    conn = await rb.connect(nursery)
    await conn.request(produce_request("t", 0, batch(3, base_timestamp=5000)))  # offsets 0..2, ts 5000..5002
    await conn.request(produce_request("t", 0, batch(2, base_timestamp=1000)))  # offsets 3..4, ts 1000..1001

    async def list_offset(timestamp, **kw):
        p = only_partition(await conn.request(list_offsets_request("t", 0, timestamp, **kw)))
        return p.error_code, p.offset, p.timestamp

    assert await list_offset(-2) == (ErrorCode.none, 0, -1)
    assert await list_offset(-1) == (ErrorCode.none, 5, -1)
    assert await list_offset(-3) == (ErrorCode.none, 2, 5002)
    assert await list_offset(5001) == (ErrorCode.none, 1, 5001)
    assert await list_offset(1001) == (ErrorCode.none, 0, 5000)
    assert await list_offset(9999) == (ErrorCode.none, -1, -1)
    assert (await list_offset(-1, current_leader_epoch=3))[0] == ErrorCode.unknown_leader_epoch
    p = only_partition(await conn.request(list_offsets_request("nope", 0, -1)))
    assert p.error_code == ErrorCode.unknown_topic_or_partition


def test_broker_sends_the_versions_the_controller_decides():
    from broker.shell.controller_channel import CONTROLLER_VERSIONS
    from quorum.node.handler import controller_apis
    # What a controller listener serves: the active controller's requests
    # and those its node answers itself (DescribeQuorum, voter changes).
    served = controller_apis(with_controller=True)
    for api_key, version in CONTROLLER_VERSIONS.items():
        assert served.supports(api_key, version), (api_key, version)


class NoController:
    """A ControllerChannel with no controller behind it (none elected)."""

    async def send(self, request):
        from broker import ControllerUnavailableError
        raise ControllerUnavailableError("no active controller")


async def test_a_client_is_refused_partitions_past_max_partitions_per_broker(nursery, tmp_path):
    """`max.partitions.per.broker` on the controller: a real client's
    CreateTopics and CreatePartitions that would put more replicas on a
    broker fail with POLICY_VIOLATION and a message naming the limit, and
    create nothing."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewPartitions as CkNewPartitions
    from confluent_kafka.admin import NewTopic as CkNewTopic

    from quorum.controller import ControllerConfig

    rb = await start_broker(nursery, tmp_path,
                            controller_config=ControllerConfig(cluster_id=CLUSTER_ID, max_partitions_per_broker=10))

    def client_calls() -> list:
        admin = AdminClient({"bootstrap.servers": rb.bootstrap})
        admin.create_topics([CkNewTopic("fits", 8, 1)])["fits"].result(10)
        refused = []
        for future in (admin.create_topics([CkNewTopic("too-big", 3, 1)])["too-big"],
                       admin.create_partitions([CkNewPartitions("fits", 11)])["fits"]):
            try:
                future.result(10)
                refused.append(None)
            except KafkaException as e:
                refused.append(e.args[0])
        return refused

    for error in await in_thread(client_calls):
        assert error is not None and error.code() == KafkaError.POLICY_VIOLATION, error
        assert "max.partitions.per.broker=10" in error.str(), error.str()
    assert rb.broker.image.topic("too-big") is None
    assert len(rb.broker.image.topic("fits").partitions) == 8


async def test_admin_requests_without_a_controller_answer_retriably(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    rb.broker.controller = NoController()
    conn = await rb.connect(nursery)
    created = await conn.request(ct4.CreateTopicsRequest(topics=(ct4.CreatableTopic(
        name="t", num_partitions=1, replication_factor=1, assignments=(), configs=()),),
        timeout=datetime.timedelta(seconds=1), validate_only=False))
    assert created.topics[0].error_code == ErrorCode.request_timed_out
    pid = await conn.request(ip4.InitProducerIdRequest(transactional_id=None,
                                                       transaction_timeout=datetime.timedelta(seconds=1)))
    assert pid.error_code == ErrorCode.coordinator_not_available


def confluent_alter(bootstrap: str, topic: str, key: str, value: str) -> None:
    """IncrementalAlterConfigs SET of one topic config, by confluent-kafka."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry
    from confluent_kafka.admin import ConfigResource as CkResource
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = CkResource("TOPIC", topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)


async def test_a_changed_max_message_bytes_applies_to_the_next_produce(nursery, tmp_path):
    """Raised on a live topic (IncrementalAlterConfigs, confluent-kafka),
    then lowered and raised again (the older AlterConfigs): each produce is
    held to the value in force; the other log configs (retention) reach the
    open log too, and AlterConfigs makes the given set the whole set."""
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t", configs={"max.message.bytes": "2000"})
    conn = await rb.connect(nursery)

    async def produce_5000_bytes():
        return only_partition(await conn.request(produce_request("t", 0, batch(1, value_bytes=5000))))

    assert (await produce_5000_bytes()).error_code == ErrorCode.message_too_large
    await in_thread(confluent_alter, rb.bootstrap, "t", "max.message.bytes", "10000")
    produced = await produce_5000_bytes()
    assert (produced.error_code, produced.base_offset) == (ErrorCode.none, 0)
    await in_thread(confluent_alter, rb.bootstrap, "t", "retention.ms", "5000")
    assert rb.partition("t").log.config.retention_ms == 5000

    def legacy_alter(configs):
        admin = KafkaAdminClient(bootstrap_servers=rb.bootstrap)
        try:
            return admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "t", configs=configs)],
                                       incremental=False, raise_on_unknown=False)
        finally:
            admin.close()

    # kafka-python reads the topic's set keys and sends them with the change.
    await in_thread(legacy_alter, {"max.message.bytes": "2000"})
    assert rb.broker.image.topic_config("t") == {"max.message.bytes": "2000", "retention.ms": "5000"}
    assert (await produce_5000_bytes()).error_code == ErrorCode.message_too_large
    assert rb.partition("t").log.log_end_offset == 1
    # A key left out of AlterConfigs goes back to its default.
    (answer,) = (await conn.request(legacy_alter_raw(2, "t", max_message_bytes="10000"))).responses
    assert answer.error_code == ErrorCode.none
    assert rb.broker.image.topic_config("t") == {"max.message.bytes": "10000"}
    assert rb.partition("t").log.config.retention_ms == 7 * 24 * 3600 * 1000
    assert (await produce_5000_bytes()).error_code == ErrorCode.none


def legacy_alter_raw(resource_type: int, name: str, **configs):
    from kio.schema.alter_configs.v0 import request as ac0
    return ac0.AlterConfigsRequest(resources=(ac0.AlterConfigsResource(
        resource_type=resource_type, resource_name=name,
        configs=tuple(ac0.AlterableConfig(name=k.replace("_", "."), value=v) for k, v in configs.items())),),
        validate_only=False)


async def test_alter_configs_answers_per_resource_with_the_controllers_errors(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    conn = await rb.connect(nursery)
    (bad,) = (await conn.request(legacy_alter_raw(2, "t", retention_ms="soon"))).responses
    assert bad.error_code == ErrorCode.invalid_config and "retention.ms" in bad.error_message
    (missing,) = (await conn.request(legacy_alter_raw(2, "nope", retention_ms="1000"))).responses
    assert missing.error_code == ErrorCode.unknown_topic_or_partition
    # A broker's dynamic config is stored; a key Kafka reads only at start-up is refused by name.
    (broker,) = (await conn.request(legacy_alter_raw(4, "1", log_retention_ms="1000"))).responses
    assert broker.error_code == ErrorCode.none
    (static,) = (await conn.request(legacy_alter_raw(4, "1", log_dirs="/elsewhere"))).responses
    assert static.error_code == ErrorCode.invalid_config and "log.dirs" in static.error_message
    (ok,) = (await conn.request(legacy_alter_raw(2, "t", retention_ms="1000"))).responses
    assert ok.error_code == ErrorCode.none and rb.broker.image.topic_config("t") == {"retention.ms": "1000"}


async def test_min_cleanable_dirty_ratio_is_a_topic_config_the_cleaner_reads(nursery, tmp_path):
    """Kafka's compaction keys are accepted at creation and by
    IncrementalAlterConfigs, refused out of range, described with Kafka's
    DOUBLE type, and the cleaner reads the topic's value."""
    rb = await start_broker(nursery, tmp_path)
    conn = await rb.connect(nursery)
    created = await conn.request(ct4.CreateTopicsRequest(topics=(ct4.CreatableTopic(
        name="c", num_partitions=1, replication_factor=1, assignments=(),
        configs=(ct4.CreatableTopicConfig(name="cleanup.policy", value="compact"),
                 ct4.CreatableTopicConfig(name="min.cleanable.dirty.ratio", value="0.1"),
                 ct4.CreatableTopicConfig(name="max.compaction.lag.ms", value="60000"))),),
        timeout=datetime.timedelta(seconds=5), validate_only=False))
    assert [(t.name, t.error_code, t.error_message) for t in created.topics] == [("c", ErrorCode.none, None)]
    config = compaction_config(rb.broker, "c")
    assert (config.min_cleanable_dirty_ratio, config.max_compaction_lag_ms) == (0.1, 60000)

    await in_thread(confluent_alter, rb.bootstrap, "c", "min.cleanable.dirty.ratio", "0.25")
    assert compaction_config(rb.broker, "c").min_cleanable_dirty_ratio == 0.25
    refused = await conn.request(iac0.IncrementalAlterConfigsRequest(resources=(iac0.AlterConfigsResource(
        resource_type=2, resource_name="c", configs=(
            iac0.AlterableConfig(name="min.cleanable.dirty.ratio", config_operation=0, value="1.5"),)),),
        validate_only=False))
    (response,) = refused.responses
    assert response.error_code == ErrorCode.invalid_config
    assert "min.cleanable.dirty.ratio" in response.error_message and "no more than 1.0" in response.error_message
    described = await conn.request(dc4.DescribeConfigsRequest(resources=(dc4.DescribeConfigsResource(
        resource_type=2, resource_name="c", configuration_keys=("min.cleanable.dirty.ratio",)),),
        include_synonyms=False, include_documentation=False))
    (entry,) = described.results[0].configs
    assert (entry.value, entry.config_type) == ("0.25", 6)  # Kafka's ConfigType DOUBLE
