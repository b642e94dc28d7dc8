"""Kafka's znode JSON: what a real Kafka 3.x writes decodes, and what raftka writes is Kafka's JSON."""

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.metadata.records import Endpoint
from quorum.zookeeper import znodes as z
from quorum.zookeeper.errors import MalformedZNodeError

# Bytes as Kafka 3.x writes them (captured from `zkCli.sh get`), key order and all.
KAFKA_BROKER = (b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT","SSL":"SSL"},'
                b'"endpoints":["PLAINTEXT://kafka-1:9092","SSL://kafka-1:9093"],"jmx_port":-1,"port":9092,'
                b'"host":"kafka-1","version":5,"timestamp":"1700000000123","rack":"r1"}')
KAFKA_TOPIC = (b'{"partitions":{"0":[1,2],"1":[2,3]},"topic_id":"Xs8lqSUVQ4ieo7cU0Zn2rQ",'
               b'"adding_replicas":{},"removing_replicas":{},"version":3}')
KAFKA_STATE = b'{"controller_epoch":4,"leader":2,"version":1,"leader_epoch":7,"isr":[2,1]}'
KAFKA_CONTROLLER = b'{"version":2,"brokerid":3,"timestamp":"1700000000999","kraftControllerEpoch":-1}'


def test_kafka_broker_registration_decodes():
    info = z.decode_broker_info(1, KAFKA_BROKER, czxid=77)
    assert info.endpoints == (Endpoint("PLAINTEXT", "kafka-1", 9092, 0), Endpoint("SSL", "kafka-1", 9093, 1))
    assert (info.rack, info.jmx_port, info.timestamp_ms, info.broker_epoch) == ("r1", -1, 1700000000123, 77)


def test_broker_registration_is_kafka_json():
    info = z.BrokerInfo(4, (Endpoint("PLAINTEXT", "127.0.0.1", 9092, 0), Endpoint("REPL", "::1", 9093, 0)),
                        rack=None, timestamp_ms=5)
    obj = json.loads(z.encode_broker_info(info))
    assert obj == {"features": {}, "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT", "REPL": "PLAINTEXT"},
                   "endpoints": ["PLAINTEXT://127.0.0.1:9092", "REPL://[::1]:9093"], "jmx_port": -1,
                   "port": 9092, "host": "127.0.0.1", "version": 5, "timestamp": "5"}
    assert z.decode_broker_info(4, z.encode_broker_info(info)) == info


def test_kafka_topic_assignment_decodes_with_kafka_uuid():
    a = z.decode_topic_assignment("orders", KAFKA_TOPIC)
    assert a.partitions == {0: (1, 2), 1: (2, 3)}
    assert z.kafka_uuid_str(a.topic_id) == "Xs8lqSUVQ4ieo7cU0Zn2rQ"
    assert json.loads(z.encode_topic_assignment(a)) == json.loads(KAFKA_TOPIC)


def test_kafka_partition_state_and_controller_decode():
    s = z.decode_partition_state("orders", 0, KAFKA_STATE, zk_version=9)
    assert s == z.PartitionState(leader=2, leader_epoch=7, isr=(2, 1), controller_epoch=4, zk_version=9)
    assert z.encode_partition_state(s) == KAFKA_STATE
    c = z.decode_controller(KAFKA_CONTROLLER)
    assert c == z.ControllerRegistration(3, 1700000000999, -1)
    assert z.encode_controller(c) == KAFKA_CONTROLLER
    assert z.decode_controller_epoch(z.encode_controller_epoch(12)) == 12 and z.encode_controller_epoch(12) == b"12"


def test_small_znodes_are_kafka_json():
    assert json.loads(z.encode_cluster_id("abc")) == {"version": "1", "id": "abc"}
    assert json.loads(z.encode_entity_config({"retention.ms": "1000"})) == {
        "version": 1, "config": {"retention.ms": "1000"}}
    assert json.loads(z.encode_config_change("topics/t")) == {"version": 2, "entity_path": "topics/t"}
    assert json.loads(z.encode_isr_change_notification([z.NamedPartition("t", 1), z.NamedPartition("t", 0)])) == {
        "version": 1, "partitions": [{"topic": "t", "partition": 0}, {"topic": "t", "partition": 1}]}
    assert json.loads(z.encode_producer_id_block(z.ProducerIdBlock(1, 0, 999))) == {
        "version": 1, "broker": 1, "block_start": "0", "block_end": "999"}
    assert json.loads(z.encode_reassignment({z.NamedPartition("t", 0): (3, 1)})) == {
        "version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [3, 1]}]}
    # A config znode Kafka created empty reads as no overrides.
    assert z.decode_entity_config("/config/topics/t", b"") == {}


def test_paths_are_kafkas():
    assert z.partition_state_path("orders", 3) == "/brokers/topics/orders/partitions/3/state"
    assert z.broker_path(2) == "/brokers/ids/2"
    assert z.delete_topic_path("orders") == "/admin/delete_topics/orders"
    assert z.topic_config_path("orders") == "/config/topics/orders"


@pytest.mark.parametrize("path,decode,data", [
    ("state", lambda d: z.decode_partition_state("t", 0, d, 0), b'{"leader":1}'),
    ("state", lambda d: z.decode_partition_state("t", 0, d, 0), b'{"leader":1,"leader_epoch":0,"isr":[1,"2"],'
                                                               b'"controller_epoch":1}'),
    ("broker", lambda d: z.decode_broker_info(1, d), b'{"version":5,"jmx_port":-1,"endpoints":["nonsense"]}'),
    ("topic", lambda d: z.decode_topic_assignment("t", d), b'{"partitions":{"0":[1]},"topic_id":"short"}'),
    ("controller", z.decode_controller, b"not json"),
    ("epoch", z.decode_controller_epoch, b"x1"),
])
def test_malformed_znodes_are_refused_with_the_path(path, decode, data):
    with pytest.raises(MalformedZNodeError):
        decode(data)


ints = st.integers(0, 2**31 - 1)
replicas = st.lists(st.integers(0, 100), min_size=1, max_size=5, unique=True).map(tuple)


@given(st.uuids(), st.dictionaries(st.integers(0, 1000), replicas, min_size=1, max_size=20))
def test_topic_assignment_round_trips(topic_id, partitions):
    a = z.TopicAssignment(partitions, topic_id)
    assert z.decode_topic_assignment("t", z.encode_topic_assignment(a)) == a


@given(st.integers(-2, 100), ints, replicas, ints, st.integers(0, 1))
def test_partition_state_round_trips(leader, leader_epoch, isr, controller_epoch, recovery):
    s = z.PartitionState(leader, leader_epoch, isr, controller_epoch, zk_version=3, leader_recovery_state=recovery)
    assert z.decode_partition_state("t", 0, z.encode_partition_state(s), 3) == s


@given(st.uuids())
def test_kafka_uuid_round_trips_as_22_characters(u):
    text = z.kafka_uuid_str(u)
    assert len(text) == 22 and "=" not in text and z.parse_kafka_uuid(text) == u


def test_topic_names_follow_kafkas_rule():
    assert z.is_legal_topic_name("a.b_c-D9")
    assert not z.is_legal_topic_name("a/b") and not z.is_legal_topic_name("..") and not z.is_legal_topic_name("x" * 250)
    assert uuid.UUID(int=0) == z.parse_kafka_uuid("AAAAAAAAAAAAAAAAAAAAAA")
