"""DescribeConfigs / IncrementalAlterConfigs for topics, and AllocateProducerIds."""

from controller_testing import Cluster
from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
from kio.schema.describe_configs.v4 import request as dc_req
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac_req

from quorum.metadata import image_from_records, image_to_records
from quorum.metadata.topic_configs import TOPIC_CONFIGS

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def describe(c: Cluster, name: str, keys=None, synonyms=False, resource_type=TOPIC):
    r = c.send(dc_req.DescribeConfigsRequest(resources=(dc_req.DescribeConfigsResource(
        resource_type=resource_type, resource_name=name, configuration_keys=keys),), include_synonyms=synonyms))
    return r.results[0]


def alter(c: Cluster, name: str, *ops, validate_only=False, resource_type=TOPIC):
    r = c.send(iac_req.IncrementalAlterConfigsRequest(resources=(iac_req.AlterConfigsResource(
        resource_type=resource_type, resource_name=name,
        configs=tuple(iac_req.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops)),),
        validate_only=validate_only))
    return r.responses[0]


def values(c: Cluster, name: str) -> dict[str, tuple[str, int]]:
    return {e.name: (e.value, e.config_source) for e in describe(c, name).configs}


def test_describe_lists_every_known_key_with_kafka_defaults():
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("t", configs={"retention.ms": "1000"})
    v = values(c, "t")
    assert set(v) == set(TOPIC_CONFIGS) and len(v) == 23
    assert v["retention.ms"] == ("1000", 1)
    assert v["segment.bytes"] == ("1073741824", 5)
    assert v["unclean.leader.election.enable"] == ("false", 5)
    assert v["compression.type"] == ("producer", 5)
    assert v["max.message.bytes"] == ("1048588", 5)
    # Kafka 4.0's window for CreateTime records: any age, at most an hour ahead.
    assert v["message.timestamp.before.max.ms"] == ("9223372036854775807", 5)
    assert v["message.timestamp.after.max.ms"] == ("3600000", 5)
    assert v["min.cleanable.dirty.ratio"] == ("0.5", 5)
    assert v["leader.replication.throttled.replicas"] == ("", 5)
    only = describe(c, "t", keys=("min.insync.replicas", "no.such.key"))
    assert [e.name for e in only.configs] == ["min.insync.replicas"]
    syn = describe(c, "t", keys=("retention.ms",), synonyms=True).configs[0].synonyms
    assert [(s.value, s.source) for s in syn] == [("1000", 1), ("604800000", 5)]
    assert describe(c, "nope").error_code == ErrorCode.unknown_topic_or_partition
    assert describe(c, "1", resource_type=BROKER).error_code == ErrorCode.invalid_request


def test_set_and_delete_take_effect_and_survive_a_snapshot():
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("t")
    assert alter(c, "t", ("retention.ms", SET, "5000"), ("segment.ms", SET, "60000")).error_code == ErrorCode.none
    assert values(c, "t")["retention.ms"] == ("5000", 1)
    assert alter(c, "t", ("retention.ms", DELETE, None)).error_code == ErrorCode.none
    v = values(c, "t")
    assert v["retention.ms"] == ("604800000", 5) and v["segment.ms"] == ("60000", 1)
    rebuilt = image_from_records(image_to_records(c.image), c.image.offset, c.image.epoch)
    assert dict(rebuilt.topic_config("t").items()) == {"segment.ms": "60000"}


def test_append_and_subtract_work_on_list_configs_only():
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("t")
    assert alter(c, "t", ("cleanup.policy", APPEND, "compact")).error_code == ErrorCode.none
    assert values(c, "t")["cleanup.policy"] == ("delete,compact", 1)
    assert alter(c, "t", ("cleanup.policy", SUBTRACT, "delete")).error_code == ErrorCode.none
    assert values(c, "t")["cleanup.policy"] == ("compact", 1)
    # As Kafka 4.1: subtracting the last policy leaves it empty (keep everything).
    assert alter(c, "t", ("cleanup.policy", SUBTRACT, "compact")).error_code == ErrorCode.none
    assert values(c, "t")["cleanup.policy"] == ("", 1)
    r = alter(c, "t", ("cleanup.policy", APPEND, "shred"))
    assert r.error_code == ErrorCode.invalid_config
    r = alter(c, "t", ("retention.ms", APPEND, "5"))
    assert r.error_code == ErrorCode.invalid_config and "retention.ms" in r.error_message


def test_bad_alterations_change_nothing():
    c = Cluster()
    c.start_brokers(1)
    c.create_topic("t")
    before = len(c.log)
    cases = [
        (ErrorCode.invalid_config, [("retention.ms", SET, "1"), ("no.such.key", SET, "1")]),
        (ErrorCode.invalid_config, [("unclean.leader.election.enable", SET, "maybe")]),
        (ErrorCode.invalid_config, [("compression.type", SET, "brotli")]),
        (ErrorCode.invalid_config, [("segment.bytes", SET, "99999999999")]),
        (ErrorCode.invalid_request, [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)]),
        (ErrorCode.invalid_request, [("retention.ms", SET, None)]),
    ]
    for expected, ops in cases:
        r = alter(c, "t", *ops)
        assert r.error_code == expected and r.error_message, ops
    assert alter(c, "nope", ("retention.ms", SET, "1")).error_code == ErrorCode.unknown_topic_or_partition
    assert alter(c, "t", ("retention.ms", SET, "1"), validate_only=True).error_code == ErrorCode.none
    assert len(c.log) == before


def test_unclean_election_can_be_switched_on_for_a_live_topic():
    c = Cluster()
    c.start_brokers(1, 2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.alter_isr("t", 0, [1])
    alter(c, "t", ("unclean.leader.election.enable", SET, "TRUE"))
    c.heartbeat(1, want_fence=True)
    assert c.partition("t").leader == 2


def allocate(c: Cluster, broker_id: int, epoch: int | None = None):
    reg = c.image.brokers.get(broker_id)
    return c.send(AllocateProducerIdsRequest(broker_id=broker_id,
                                             broker_epoch=epoch if epoch is not None else reg.epoch))


def test_producer_id_blocks_are_disjoint_and_survive_failover():
    c = Cluster()
    c.start_brokers(1, 2)
    a = allocate(c, 1)
    b = allocate(c, 2)
    c.failover()
    d = allocate(c, 1)
    starts = [(x.producer_id_start, x.producer_id_len) for x in (a, b, d)]
    assert starts == [(0, 1000), (1000, 1000), (2000, 1000)]
    assert c.image.next_producer_id == 3000
    assert allocate(c, 1, epoch=c.image.brokers[1].epoch + 1).error_code == ErrorCode.stale_broker_epoch
    assert allocate(c, 9, epoch=0).error_code == ErrorCode.broker_id_not_registered
    assert c.image.next_producer_id == 3000
