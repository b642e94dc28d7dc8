"""MetadataImage replay, structural sharing, derived indexes and snapshot round trips."""

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum.metadata import (
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    Endpoint,
    LoggedRecord,
    MetadataImage,
    MetadataReplayError,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    image_delta,
    image_from_records,
    image_to_records,
)
from quorum.metadata.image import ConfigResource, TopicPartition
from quorum.metadata.records import UNASSIGNED_DIR

EP = (Endpoint("PLAINTEXT", "127.0.0.1", 9092, 0),)


def logged(records, start=0, epoch=1):
    return [LoggedRecord(start + i, epoch, r) for i, r in enumerate(records)]


@st.composite
def histories(draw, max_ops=40):
    """A valid metadata log: every record makes sense against the ones before it."""
    records = []
    brokers: dict[int, int] = {}  # id -> epoch (offset of its registration)
    topics: dict[uuid.UUID, tuple[str, dict[int, tuple[int, ...]]]] = {}
    leaders: dict[tuple[uuid.UUID, int], int] = {}
    next_pid = 0
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(
            ["register", "register", "topic", "topic", "change", "change", "fence", "config",
             "remove", "pids", "unregister", "noop"]))
        if op == "register":
            b = draw(st.integers(0, 5))
            brokers[b] = len(records)
            records.append(RegisterBrokerRecord(b, uuid.UUID(int=draw(st.integers(1, 2**64))), EP,
                                                draw(st.sampled_from([None, "r1", "r2"])), draw(st.booleans())))
        elif op == "topic" and brokers:
            tid = uuid.UUID(int=len(records) + 1)
            name = f"t{len(records)}"
            records.append(TopicRecord(name, tid))
            parts = {}
            # A few partitions drawn one by one, or many (past a PMap leaf) laid out round-robin.
            many = draw(st.integers(0, 3)) == 0
            rf = draw(st.integers(1, len(brokers)))
            ring = sorted(brokers)
            for p in range(70 if many else draw(st.integers(1, 6))):
                if many:
                    replicas = tuple((ring[p % len(ring):] + ring[: p % len(ring)])[:rf])
                    isr = replicas
                else:
                    replicas = tuple(draw(st.permutations(ring))[: draw(st.integers(1, len(brokers)))])
                    isr = tuple(replicas[: draw(st.integers(1, len(replicas)))])
                records.append(PartitionRecord(tid, p, replicas, isr, isr[0]))
                leaders[(tid, p)] = isr[0]
                parts[p] = replicas
            topics[tid] = (name, parts)
        elif op == "change" and topics:
            tid = draw(st.sampled_from(sorted(topics)))
            p = draw(st.sampled_from(sorted(topics[tid][1])))
            replicas, new_replicas = topics[tid][1][p], None
            if draw(st.booleans()) and brokers:
                replicas = new_replicas = tuple(
                    draw(st.permutations(sorted(brokers)))[: draw(st.integers(1, len(brokers)))])
                topics[tid][1][p] = replicas
                isr = replicas[:1]
            else:
                isr = tuple(x for x in replicas if draw(st.booleans())) or replicas[:1]
            current_leader = leaders[(tid, p)]
            choices = [-1, *isr] + ([None] if current_leader == -1 or current_leader in isr else [])
            leader = draw(st.sampled_from(choices))
            if leader is not None:
                leaders[(tid, p)] = leader
            # Now and then a replica assigned to a log dir (KIP-858), with or without a new replica list.
            directories = None
            if draw(st.integers(0, 3)) == 0:
                directories = tuple(uuid.UUID(int=draw(st.integers(0, 3))) for _ in replicas)
            records.append(PartitionChangeRecord(tid, p, isr=isr, leader=leader, replicas=new_replicas,
                                                 directories=directories))
        elif op == "fence" and brokers:
            b = draw(st.sampled_from(sorted(brokers)))
            records.append(BrokerRegistrationChangeRecord(b, brokers[b], draw(st.sampled_from([None, True, False])),
                                                          draw(st.sampled_from([None, True, False])),
                                                          draw(st.sampled_from([None, (), (uuid.UUID(int=1),)]))))
        elif op == "config":
            name = draw(st.sampled_from([t[0] for t in topics.values()] + ["other", ""]))
            records.append(ConfigRecord(draw(st.sampled_from(ConfigResourceType)), name,
                                        draw(st.sampled_from(["retention.ms", "segment.bytes"])),
                                        draw(st.sampled_from([None, "1", "2"]))))
        elif op == "remove" and topics:
            tid = draw(st.sampled_from(sorted(topics)))
            del topics[tid]
            records.append(RemoveTopicRecord(tid))
        elif op == "pids":
            next_pid += draw(st.integers(1, 5000))
            records.append(ProducerIdsRecord(0, 0, next_pid))
        elif op == "unregister" and brokers:
            b = draw(st.sampled_from(sorted(brokers)))
            records.append(UnregisterBrokerRecord(b, brokers.pop(b)))
        elif op == "noop":
            records.append(NoOpRecord())
    return records


def brute_force_indexes(image):
    replicas: dict[int, dict[TopicPartition, int]] = {}
    preferred: dict[int, int] = {}
    for tid, topic in image.topics_by_id.items():
        for p, reg in topic.partitions.items():
            for pos, b in enumerate(reg.replicas):
                replicas.setdefault(b, {})[TopicPartition(tid, p)] = pos
            preferred[reg.replicas[0]] = preferred.get(reg.replicas[0], 0) + 1
    return replicas, preferred


@given(histories(), st.data())
def test_batching_does_not_change_the_result(records, data):
    one_batch = MetadataImage().apply(logged(records))
    image = MetadataImage()
    entries = logged(records)
    while entries:
        n = data.draw(st.integers(1, len(entries)))
        image, entries = image.apply(entries[:n]), entries[n:]
    assert image == one_batch
    assert image.offset == len(records) - 1


@given(histories())
def test_derived_indexes_match_a_full_scan(records):
    image = MetadataImage().apply(logged(records))
    replicas, preferred = brute_force_indexes(image)
    assert {b: dict(m.items()) for b, m in image.broker_replicas.items()} == replicas
    assert dict(image.preferred_leader_counts.items()) == preferred


@given(histories())
def test_snapshot_rebuilds_an_equal_image(records):
    image = MetadataImage().apply(logged(records, epoch=3))
    rebuilt = image_from_records(image_to_records(image), image.offset, image.epoch)
    assert rebuilt == image
    assert image_to_records(rebuilt) == image_to_records(image)


def test_broker_epoch_is_the_registration_offset():
    image = MetadataImage().apply(logged([NoOpRecord(), RegisterBrokerRecord(7, uuid.uuid4(), EP, "r1", True)],
                                         start=41, epoch=2))
    b = image.brokers[7]
    assert (b.epoch, b.fenced, b.rack) == (42, True, "r1")
    assert (image.offset, image.epoch) == (42, 2)
    image = image.apply([LoggedRecord(43, 2, BrokerRegistrationChangeRecord(7, 42, fenced=False))])
    assert image.brokers[7].usable


def test_partition_change_bumps_epochs_as_kafka():
    tid = uuid.uuid4()
    image = MetadataImage().apply(logged([TopicRecord("a", tid), PartitionRecord(tid, 0, (1, 2, 3), (1, 2, 3), 1)]))
    image = image.apply([LoggedRecord(2, 1, PartitionChangeRecord(tid, 0, isr=(1, 2)))])
    p = image.partition(tid, 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 2), 1, 0, 1)
    image = image.apply([LoggedRecord(3, 1, PartitionChangeRecord(tid, 0, leader=2, isr=(2,)))])
    p = image.partition(tid, 0)
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((2,), 2, 1, 2)


def test_applying_to_one_topic_shares_every_other_topic():
    records = []
    ids = [uuid.UUID(int=i + 1) for i in range(200)]
    for i, tid in enumerate(ids):
        records.append(TopicRecord(f"t{i}", tid))
        records += [PartitionRecord(tid, p, (1, 2), (1, 2), 1) for p in range(50)]
    image = MetadataImage().apply(logged(records))
    after = image.apply([LoggedRecord(image.offset + 1, 1, PartitionChangeRecord(ids[5], 7, isr=(1,)))])
    assert after.topics_by_id[ids[5]].partitions[7].isr == (1,)
    assert image.topics_by_id[ids[5]].partitions[7].isr == (1, 2)  # the old image is untouched
    assert all(after.topics_by_id[t] is image.topics_by_id[t] for t in ids if t != ids[5])
    old_parts, new_parts = image.topics_by_id[ids[5]].partitions, after.topics_by_id[ids[5]].partitions
    assert all(new_parts[p] is old_parts[p] for p in range(50) if p != 7)
    assert after.brokers is image.brokers


def test_remove_topic_drops_partitions_configs_and_index_entries():
    tid = uuid.uuid4()
    image = MetadataImage().apply(logged([
        TopicRecord("a", tid), PartitionRecord(tid, 0, (1, 2), (1, 2), 1),
        ConfigRecord(ConfigResourceType.TOPIC, "a", "retention.ms", "5"),
        RemoveTopicRecord(tid),
    ]))
    assert image.topic("a") is None and image.partition(tid, 0) is None
    assert ConfigResource(ConfigResourceType.TOPIC, "a") not in image.configs
    assert image.replica_count(1) == 0 and image.preferred_leader_count(1) == 0


def test_config_delete_removes_the_key():
    image = MetadataImage().apply(logged([
        ConfigRecord(ConfigResourceType.TOPIC, "a", "retention.ms", "5"),
        ConfigRecord(ConfigResourceType.TOPIC, "a", "segment.ms", "6"),
    ]))
    assert dict(image.topic_config("a").items()) == {"retention.ms": "5", "segment.ms": "6"}
    image = image.apply([LoggedRecord(2, 1, ConfigRecord(ConfigResourceType.TOPIC, "a", "retention.ms", None))])
    assert dict(image.topic_config("a").items()) == {"segment.ms": "6"}


@pytest.mark.parametrize("bad", [
    PartitionChangeRecord(uuid.UUID(int=9), 0, isr=(1,)),
    BrokerRegistrationChangeRecord(1, 999, fenced=False),
    UnregisterBrokerRecord(2, 0),
    TopicRecord("existing", uuid.UUID(int=5)),
    ProducerIdsRecord(1, 0, 0),
])
def test_contradicting_records_are_refused_and_leave_the_image_alone(bad):
    base = MetadataImage().apply(logged([RegisterBrokerRecord(1, uuid.uuid4(), EP),
                                         TopicRecord("existing", uuid.UUID(int=4))]))
    with pytest.raises(MetadataReplayError, match="cannot be applied"):
        base.apply([LoggedRecord(2, 1, NoOpRecord()), LoggedRecord(3, 1, bad)])
    assert base.offset == 1 and base.topic("existing") is not None


def test_offsets_must_advance():
    image = MetadataImage().apply(logged([NoOpRecord()], start=10))
    with pytest.raises(MetadataReplayError, match="not above"):
        image.apply([LoggedRecord(10, 1, NoOpRecord())])


@given(histories(), st.data())
def test_delta_matches_a_full_scan_for_every_broker(records, data):
    k = data.draw(st.integers(0, len(records)))
    old = MetadataImage().apply(logged(records[:k]))
    new = old.apply(logged(records[k:], start=k))
    for broker in range(6):
        delta = image_delta(old, new, broker)
        leaders, followers, stopped = set(), set(), set()
        for tid, topic in new.topics_by_id.items():
            for p, reg in topic.partitions.items():
                if broker in reg.replicas and old.partition(tid, p) != reg:
                    (leaders if reg.leader == broker else followers).add((tid, p))
        for tid, topic in old.topics_by_id.items():
            for p, reg in topic.partitions.items():
                now = new.partition(tid, p)
                if broker in reg.replicas and (now is None or broker not in now.replicas):
                    stopped.add((tid, p))
        assert {(x.topic_id, x.partition) for x in delta.leaders} == leaders
        assert {(x.topic_id, x.partition) for x in delta.followers} == followers
        assert {(x.topic_id, x.partition) for x in delta.stopped} == stopped


def test_a_replica_keeps_its_log_dir_through_a_reassignment_and_a_new_registration_brings_its_dirs_online():
    """KIP-858: each replica's log dir follows the replica when the replica
    list changes; the dirs a broker reported offline are online again once
    it registers anew (a restart with the disk replaced)."""
    tid, d1, d2, dead = uuid.UUID(int=99), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    image = MetadataImage().apply(logged([
        RegisterBrokerRecord(1, uuid.uuid4(), EP, None, False),
        RegisterBrokerRecord(2, uuid.uuid4(), EP, None, False),
        TopicRecord("t", tid),
        PartitionRecord(tid, 0, (1, 2), (1, 2), 1),
        PartitionChangeRecord(tid, 0, directories=(dead, d2)),
        PartitionChangeRecord(tid, 0, replicas=(2, 3, 1), isr=(2, 1)),
    ]))
    p = image.partition(tid, 0)
    assert p.directories == (d2, UNASSIGNED_DIR, dead)
    assert p.partition_epoch == 2 and p.leader_epoch == 0  # a dir's assignment is no leader change
    assert p.offline_replicas({1, 2, 3}, image.offline_log_dirs()) == []
    image = image.apply(logged([BrokerRegistrationChangeRecord(1, 0, offline_log_dirs=(dead, d1))], start=6))
    assert p.offline_replicas({1, 2, 3}, image.offline_log_dirs()) == [1]
    assert p.offline_replicas({1, 2}, image.offline_log_dirs()) == [3, 1]
    rebuilt = image_from_records(image_to_records(image), image.offset, image.epoch)
    assert rebuilt == image
    image = image.apply(logged([RegisterBrokerRecord(1, uuid.uuid4(), EP, None, True)], start=7))
    assert image.offline_log_dirs() == {}
