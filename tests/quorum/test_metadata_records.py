"""Metadata record codec: round trips for every type; unknown types and versions refused."""

import uuid

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.metadata.records import (
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    Endpoint,
    MalformedRecordError,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UnsupportedRecordError,
    decode_record,
    encode_record,
)
from common.errors import RaftkaError

ints = st.integers(-(2**63), 2**63 - 1)
ids = st.integers(-1, 2**31 - 1)
uuids = st.uuids()
names = st.text(max_size=20)
id_lists = st.lists(ids, max_size=6).map(tuple)
uuid_lists = st.lists(uuids, max_size=4).map(tuple)


def opt(strategy):
    return st.none() | strategy


endpoints = st.builds(Endpoint, names, names, st.integers(0, 65535), st.integers(0, 3))

records = st.one_of(
    st.builds(RegisterBrokerRecord, broker_id=ids, incarnation_id=uuids,
              endpoints=st.lists(endpoints, max_size=3).map(tuple), rack=opt(names),
              fenced=st.booleans(), in_controlled_shutdown=st.booleans(), broker_epoch=opt(ints),
              offline_log_dirs=uuid_lists),
    st.builds(UnregisterBrokerRecord, broker_id=ids, broker_epoch=ints),
    st.builds(BrokerRegistrationChangeRecord, broker_id=ids, broker_epoch=ints,
              fenced=opt(st.booleans()), in_controlled_shutdown=opt(st.booleans()),
              offline_log_dirs=opt(uuid_lists)),
    st.builds(TopicRecord, name=names, topic_id=uuids),
    st.builds(PartitionRecord, topic_id=uuids, partition=ids, replicas=id_lists, isr=id_lists, leader=ids,
              leader_epoch=ids, partition_epoch=ids, removing_replicas=id_lists, adding_replicas=id_lists,
              directories=uuid_lists),
    st.builds(PartitionChangeRecord, topic_id=uuids, partition=ids, isr=opt(id_lists), leader=opt(ids),
              replicas=opt(id_lists), removing_replicas=opt(id_lists), adding_replicas=opt(id_lists),
              directories=opt(uuid_lists)),
    st.builds(RemoveTopicRecord, topic_id=uuids),
    st.builds(ConfigRecord, resource_type=st.sampled_from(ConfigResourceType), resource_name=names,
              key=names, value=opt(names)),
    st.builds(ProducerIdsRecord, broker_id=ids, broker_epoch=ints, next_producer_id=ints),
    st.just(NoOpRecord()),
)


@given(records)
def test_every_record_type_round_trips(record):
    data = encode_record(record)
    assert decode_record(data) == record
    raw = cbor2.loads(data)
    assert raw["t"] == record.TYPE and raw["v"] == 1


def test_partition_change_carries_only_changed_fields():
    tid = uuid.uuid4()
    raw = cbor2.loads(encode_record(PartitionChangeRecord(topic_id=tid, partition=3, isr=(1, 2))))
    assert set(raw) == {"t", "v", "topic_id", "partition", "isr"}


def test_a_record_written_before_log_dirs_were_recorded_reads_with_none_assigned():
    """A log written before replicas had log dirs in the metadata stays
    readable: no `directories` is none assigned, no `offline_log_dirs` none offline."""
    tid = uuid.uuid4()
    old = cbor2.dumps({"t": "Partition", "v": 1, "topic_id": tid.bytes, "partition": 0, "replicas": [1, 2],
                       "isr": [1, 2], "leader": 1, "leader_epoch": 0, "partition_epoch": 0,
                       "removing_replicas": [], "adding_replicas": []})
    assert decode_record(old).directories == ()
    assert decode_record(cbor2.dumps({"t": "BrokerRegistrationChange", "v": 1, "broker_id": 1, "broker_epoch": 5,
                                      "fenced": False})).offline_log_dirs is None
    # And a record with none assigned is written as before (no empty list).
    assert "directories" not in cbor2.loads(encode_record(decode_record(old)))


def test_unknown_type_is_refused_with_upgrade_advice():
    data = cbor2.dumps({"t": "DelegationToken", "v": 1, "x": 1})
    with pytest.raises(UnsupportedRecordError, match="DelegationToken.*upgrade this node") as e:
        decode_record(data)
    assert isinstance(e.value, RaftkaError)


def test_newer_version_is_refused_with_both_versions_named():
    data = cbor2.dumps({"t": "Topic", "v": 2, "name": "a", "topic_id": uuid.uuid4().bytes})
    with pytest.raises(UnsupportedRecordError, match=r"'Topic' version 2 is newer than the version 1.*upgrade"):
        decode_record(data)


def test_unknown_extra_fields_are_ignored_for_a_known_version():
    tid = uuid.uuid4()
    data = cbor2.dumps({"t": "Topic", "v": 1, "name": "a", "topic_id": tid.bytes, "future": [1, 2]})
    assert decode_record(data) == TopicRecord(name="a", topic_id=tid)


@pytest.mark.parametrize("raw", [
    b"\xff\xff",
    cbor2.dumps([1, 2]),
    cbor2.dumps({"v": 1}),
    cbor2.dumps({"t": "Topic", "v": 1, "name": "a"}),
    cbor2.dumps({"t": "Topic", "v": 1, "name": 7, "topic_id": uuid.uuid4().bytes}),
    cbor2.dumps({"t": "Topic", "v": 1, "name": "a", "topic_id": b"short"}),
    cbor2.dumps({"t": "Partition", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": 0,
                 "replicas": [1, True], "isr": [], "leader": 1}),
    cbor2.dumps({"t": "Partition", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": True,
                 "replicas": [1], "isr": [1], "leader": 1}),
    cbor2.dumps({"t": "Config", "v": 1, "resource_type": 2, "resource_name": None, "key": "k"}),
    cbor2.dumps({"t": "Config", "v": 1, "resource_type": 3, "resource_name": "t", "key": "k"}),
    cbor2.dumps({"t": "BrokerRegistrationChange", "v": 1, "broker_id": 1, "broker_epoch": 5, "fenced": 1}),
    # PartitionChange has a decoder of its own for the common shape: what
    # does not fit it must still be refused.
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": 0, "isr": [1, True]}),
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": 0, "leader": True}),
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": 0, "replicas": 3}),
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": uuid.uuid4().bytes, "partition": 0,
                 "adding_replicas": [2.5]}),
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": uuid.uuid4().bytes, "isr": [1]}),
    cbor2.dumps({"t": "PartitionChange", "v": 1, "topic_id": b"short", "partition": 0}),
])
def test_malformed_bytes_raise_malformed_record_error(raw):
    with pytest.raises(MalformedRecordError):
        decode_record(raw)


def test_client_quota_record_round_trips_through_log_image_and_snapshot():
    from quorum.metadata.image import LoggedRecord, MetadataImage
    from quorum.metadata.records import ClientQuotaRecord, decode_record, encode_record
    from quorum.metadata.snapshot import image_from_records, image_to_records

    set_client = ClientQuotaRecord((("client-id", "c1"),), "producer_byte_rate", 1048576.0)
    set_default_user = ClientQuotaRecord((("user", None),), "consumer_byte_rate", 5.0)
    assert decode_record(encode_record(set_client)) == set_client
    assert decode_record(encode_record(set_default_user)) == set_default_user
    image = MetadataImage().apply([LoggedRecord(1, 1, set_client), LoggedRecord(2, 1, set_default_user)])
    assert image.client_quotas[(("client-id", "c1"),)]["producer_byte_rate"] == 1048576.0
    assert image_from_records(image_to_records(image), 2, 1).client_quotas == image.client_quotas
    removed = image.apply([LoggedRecord(3, 1, ClientQuotaRecord(set_client.entity, set_client.key, None))])
    assert (("client-id", "c1"),) not in removed.client_quotas
    assert (("user", None),) in removed.client_quotas
