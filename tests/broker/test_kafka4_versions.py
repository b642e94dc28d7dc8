"""Kafka 4 protocol versions over the wire, with a raw-protocol client on one
broker: the features ApiVersions reports, Fetch v17 and Produce v13 by topic
id (and UNKNOWN_TOPIC_ID for an id the broker does not know, leader
endpoints on NOT_LEADER_OR_FOLLOWER), ListOffsets v9's special timestamps, Metadata v13
and DescribeTopicPartitions' pages."""

from __future__ import annotations

import datetime
import time
import uuid

import trio
from broker_testing import only_partition, produce_request, start_broker
from kio.schema.api_versions.v4 import request as av4
from kio.schema.describe_topic_partitions.v0 import request as dtp
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v17 import request as f17
from kio.schema.list_offsets.v9 import request as lo9
from kio.schema.metadata.v13 import request as md13
from kio.schema.produce.v10 import request as p10
from kio.schema.produce.v13 import request as p13

from broker.api.describe_topic_partitions import page
from broker.core.group import GroupCoordinatorConfig
from storage.batch import build_batch

MS = datetime.timedelta(milliseconds=1)


def fetch_v17(topic_id: uuid.UUID, partition: int, offset: int, *, leader_epoch: int = -1):
    return f17.FetchRequest(max_wait=0 * MS, min_bytes=1, topics=(f17.FetchTopic(topic_id=topic_id, partitions=(
        f17.FetchPartition(partition=partition, current_leader_epoch=leader_epoch, fetch_offset=offset,
                           partition_max_bytes=1 << 20),)),), forgotten_topics_data=())


def produce_v13(topic_id: uuid.UUID, partition: int, records, *, acks: int = 1):
    return p13.ProduceRequest(acks=acks, timeout=5000 * MS, topic_data=(p13.TopicProduceData(
        topic_id=topic_id, partition_data=(p13.PartitionProduceData(index=partition, records=records),)),))


def produce_v10(topic: str, partition: int, records):
    return p10.ProduceRequest(acks=1, timeout=5000 * MS, topic_data=(p10.TopicProduceData(
        name=topic, partition_data=(p10.PartitionProduceData(index=partition, records=records),)),))


def list_offsets_v9(topic: str, timestamp: int):
    return lo9.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(lo9.ListOffsetsTopic(
        name=topic, partitions=(lo9.ListOffsetsPartition(partition_index=0, timestamp=timestamp),)),))


async def test_api_versions_reports_the_features_raftka_serves(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        conn = await running.connect(nursery)
        request = av4.ApiVersionsRequest(client_software_name="raw", client_software_version="1")
        versions = await conn.request(request)
        assert {(f.name, f.min_version, f.max_version) for f in versions.supported_features} == {
            ("metadata.version", 25, 25), ("kraft.version", 0, 1), ("group.version", 0, 1),
            ("transaction.version", 0, 2)}
        # Levels at 0 (a static quorum) are not finalized, as Kafka reports them.
        assert {(f.name, f.min_version_level, f.max_version_level) for f in versions.finalized_features} == {
            ("metadata.version", 25, 25), ("group.version", 1, 1), ("transaction.version", 2, 2)}
        assert versions.finalized_features_epoch == running.broker.image.offset >= 0
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[1] == (4, 17) and served[2] == (1, 9) and served[3] == (1, 13) and served[75] == (0, 0)
        assert served[68] == (0, 1) and served[69] == (0, 1)
        # The epoch follows the metadata: a new topic moves it.
        await running.create_topic("later")
        again = await conn.request(request)
        assert again.finalized_features_epoch == running.broker.image.offset > versions.finalized_features_epoch
        running.stop()


async def test_fetch_v17_by_topic_id(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic("ids", partitions=1)
        # A partition led by broker 2, registered but not this broker: the
        # answer names it and, in v16+, where to reach it.
        await running.controller.register_broker(2, "127.0.0.9", 19092, rack="r2")
        await running.create_topic("elsewhere", assignments=[(2,)])
        conn = await running.connect(nursery)
        batch = build_batch([(b"k", b"by id", (), int(time.time() * 1000))])
        assert only_partition(await conn.request(produce_request("ids", 0, batch))).error_code == ErrorCode.none
        topic_id = running.broker.image.topic_ids_by_name["ids"]

        response = await conn.request(fetch_v17(topic_id, 0, 0))
        (topic,) = response.responses
        assert topic.topic_id == topic_id
        (p,) = topic.partitions
        assert p.error_code == ErrorCode.none and p.high_watermark == 1 and bytes(p.records).endswith(b"by id\x00")
        assert response.node_endpoints == ()

        unknown = uuid.uuid4()
        (topic,) = (await conn.request(fetch_v17(unknown, 0, 0))).responses
        assert topic.topic_id == unknown
        assert only_partition(type("R", (), {"topics": (topic,)})).error_code == ErrorCode.unknown_topic_id

        # The zero id (null) is no topic either.
        (topic,) = (await conn.request(fetch_v17(uuid.UUID(int=0), 0, 0))).responses
        assert topic.partitions[0].error_code == ErrorCode.unknown_topic_id

        elsewhere = running.broker.image.topic_ids_by_name["elsewhere"]
        response = await conn.request(fetch_v17(elsewhere, 0, 0))
        (p,) = response.responses[0].partitions
        assert p.error_code == ErrorCode.not_leader_or_follower and p.current_leader.leader_id == 2
        assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
            (2, "127.0.0.9", 19092, "r2")]
        running.stop()


async def test_produce_v13_by_topic_id(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic("ids", partitions=1)
        await running.controller.register_broker(2, "127.0.0.9", 19092, rack="r2")
        await running.create_topic("elsewhere", assignments=[(2,)])
        conn = await running.connect(nursery)
        served = {k.api_key: (k.min_version, k.max_version) for k in (await conn.request(
            av4.ApiVersionsRequest(client_software_name="raw", client_software_version="1"))).api_keys}
        assert served[0] == (3, 13)
        topic_id = running.broker.image.topic_ids_by_name["ids"]
        batch = build_batch([(b"k", b"sent by id", (), int(time.time() * 1000))])

        response = await conn.request(produce_v13(topic_id, 0, batch))
        (topic,) = response.responses
        assert topic.topic_id == topic_id
        (p,) = topic.partition_responses
        assert p.error_code == ErrorCode.none and p.base_offset == 0 and response.node_endpoints == ()
        (fetched,) = (await conn.request(fetch_v17(topic_id, 0, 0))).responses[0].partitions
        assert bytes(fetched.records).endswith(b"sent by id\x00")

        # An id the broker does not know, and the zero id: UNKNOWN_TOPIC_ID, nothing appended.
        stranger = uuid.uuid4()
        for unknown in (stranger, uuid.UUID(int=0)):
            (topic,) = (await conn.request(produce_v13(unknown, 0, batch))).responses
            assert topic.topic_id == (unknown if unknown.int else None)
            assert [q.error_code for q in topic.partition_responses] == [ErrorCode.unknown_topic_id]
        assert running.broker.replicas.partitions[("ids", 0)].log.log_end_offset == 1

        # A partition led elsewhere: the answer names the leader and its endpoint
        # (KIP-951), by id in v13 and by name from v10.
        elsewhere = running.broker.image.topic_ids_by_name["elsewhere"]
        for request in (produce_v13(elsewhere, 0, batch), produce_v10("elsewhere", 0, batch)):
            response = await conn.request(request)
            p = only_partition(response)
            assert p.error_code == ErrorCode.not_leader_or_follower
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (2, 0)
            assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
                (2, "127.0.0.9", 19092, "r2")]
        running.stop()


async def test_list_offsets_v9_earliest_local_and_latest_tiered(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic("lo")
        conn = await running.connect(nursery)
        for i in range(3):
            batch = build_batch([(None, b"v%d" % i, (), int(time.time() * 1000))])
            await conn.request(produce_request("lo", 0, batch))
        answers = {}
        for timestamp in (-1, -2, -4, -5):
            p = only_partition(await conn.request(list_offsets_v9("lo", timestamp)))
            assert p.error_code == ErrorCode.none
            answers[timestamp] = (p.offset, p.leader_epoch)
        # No remote storage: the local log starts where the log does, and nothing is tiered.
        assert answers[-1] == (3, 0) and answers[-2] == answers[-4] == (0, 0) and answers[-5] == (-1, -1)
        running.stop()


async def test_metadata_v13(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic("m", partitions=2)
        conn = await running.connect(nursery)
        response = await conn.request(md13.MetadataRequest(
            topics=(md13.MetadataRequestTopic(topic_id=None, name="m"),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        assert response.error_code == ErrorCode.none
        (topic,) = response.topics
        assert topic.topic_id == running.broker.image.topic_ids_by_name["m"] and len(topic.partitions) == 2
        running.stop()


def test_pages_follow_kafka_cursor_rules():
    counts = {"a": 3, "b": 2, "c": 4}
    names = ["a", "b", "c"]
    assert page(names, counts, 100, None) == ([("a", 0, 3), ("b", 0, 2), ("c", 0, 4)], None)
    # A page ending inside a topic points at its next partition.
    assert page(names, counts, 4, None) == ([("a", 0, 3), ("b", 0, 1)], ("b", 1))
    # A page ending exactly at a topic's end points at the next topic.
    assert page(names, counts, 5, None) == ([("a", 0, 3), ("b", 0, 2)], ("c", 0))
    assert page(names, counts, 5, ("b", 1)) == ([("b", 1, 1), ("c", 0, 4)], None)
    # A topic that does not exist is listed (with no partitions) and uses none of the limit.
    assert page(["a", "nope"], counts, 4, None) == ([("a", 0, 3), ("nope", 0, 0)], None)
    # Once the limit is used up, the next topic is the cursor, whether it exists or not (as Kafka).
    assert page(["a", "nope"], counts, 3, None) == ([("a", 0, 3)], ("nope", 0))


async def test_describe_topic_partitions_in_pages(tmp_path):
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.create_topic("t1", partitions=3)
        await running.create_topic("t2", partitions=4)
        conn = await running.connect(nursery)
        seen = []
        cursor = None
        with trio.fail_after(10):
            while True:
                response = await conn.request(dtp.DescribeTopicPartitionsRequest(
                    topics=(), response_partition_limit=2, cursor=cursor))
                for topic in response.topics:
                    assert topic.error_code == ErrorCode.none
                    assert topic.topic_id == running.broker.image.topic_ids_by_name[topic.name]
                    for p in topic.partitions:
                        assert p.leader_id == 1 and p.isr_nodes == (1,) and p.error_code == ErrorCode.none
                        seen.append((topic.name, p.partition_index))
                    assert len(topic.partitions) <= 2
                if response.next_cursor is None:
                    break
                cursor = dtp.Cursor(topic_name=response.next_cursor.topic_name,
                                    partition_index=response.next_cursor.partition_index)
        assert seen == [("t1", i) for i in range(3)] + [("t2", i) for i in range(4)]

        asked = await conn.request(dtp.DescribeTopicPartitionsRequest(
            topics=(dtp.TopicRequest(name="t2"), dtp.TopicRequest(name="missing")), response_partition_limit=10))
        assert [(t.name, t.error_code, len(t.partitions)) for t in asked.topics] == [
            ("missing", ErrorCode.unknown_topic_or_partition, 0), ("t2", ErrorCode.none, 4)]
        # The cursor must name a topic asked for.
        refused = await conn.request(dtp.DescribeTopicPartitionsRequest(
            topics=(dtp.TopicRequest(name="t2"),), response_partition_limit=10,
            cursor=dtp.Cursor(topic_name="t1", partition_index=0)))
        assert [t.error_code for t in refused.topics] == [ErrorCode.invalid_request]
        running.stop()


async def test_a_fetch_v15_follower_is_known_by_its_replica_state(tmp_path):
    """From v15 the follower's id travels in `replica_state`: a fetch naming
    replica 2 reads past the high watermark (up to the log end) and moves
    it, as a follower's fetch does; a consumer's stops at the HW."""
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path)
        await running.controller.register_broker(2, "127.0.0.9", 19092)
        await running.create_topic("rf2", assignments=[(1, 2)])
        conn = await running.connect(nursery)
        batch = build_batch([(None, b"replicated", (), int(time.time() * 1000))])
        assert only_partition(await conn.request(produce_request("rf2", 0, batch))).error_code == ErrorCode.none
        topic_id = running.broker.image.topic_ids_by_name["rf2"]

        def fetch(offset: int, replica_id: int):
            request = fetch_v17(topic_id, 0, offset)
            return f17.FetchRequest(
                replica_state=f17.ReplicaState(replica_id=replica_id, replica_epoch=-1), max_wait=request.max_wait,
                min_bytes=request.min_bytes, topics=request.topics, forgotten_topics_data=())

        consumer = (await conn.request(fetch(0, -1))).responses[0].partitions[0]
        assert consumer.high_watermark == 0 and not consumer.records
        follower = (await conn.request(fetch(0, 2))).responses[0].partitions[0]
        assert follower.error_code == ErrorCode.none and bytes(follower.records).endswith(b"replicated\x00")
        # The follower's next fetch says it has offset 0: the HW moves to 1.
        follower = (await conn.request(fetch(1, 2))).responses[0].partitions[0]
        assert follower.high_watermark == 1
        running.stop()


async def test_offset_commit_and_fetch_v10_by_topic_id(tmp_path):
    from kio.schema.find_coordinator.v4 import request as fc4
    from kio.schema.offset_commit.v10 import request as oc10
    from kio.schema.offset_fetch.v9 import request as of9
    from kio.schema.offset_fetch.v10 import request as of10

    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, tmp_path, group_coordinator=GroupCoordinatorConfig(
            offsets_topic_num_partitions=1, offsets_topic_replication_factor=1))
        await running.create_topic("ids", partitions=2)
        conn = await running.connect(nursery)
        await conn.request(fc4.FindCoordinatorRequest(key_type=0, coordinator_keys=("g10",)))  # creates __consumer_offsets
        versions = await conn.request(av4.ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert served[8] == (2, 10) and served[9] == (1, 10)
        topic_id = next(t.topic_id for t in running.broker.image.topics_by_id.values() if t.name == "ids")
        stranger = uuid.uuid4()
        commit = oc10.OffsetCommitRequest(
            group_id="g10", generation_id_or_member_epoch=-1, member_id="", topics=(
                oc10.OffsetCommitRequestTopic(topic_id=topic_id, partitions=(oc10.OffsetCommitRequestPartition(
                    partition_index=1, committed_offset=42, committed_leader_epoch=-1, committed_metadata="m"),)),
                oc10.OffsetCommitRequestTopic(topic_id=stranger, partitions=(oc10.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=7, committed_leader_epoch=-1, committed_metadata=None),))))
        with trio.fail_after(30):  # until the coordinator has loaded __consumer_offsets
            while (committed := await conn.request(commit)).topics[0].partitions[0].error_code \
                    == ErrorCode.not_coordinator:
                await trio.sleep(0.1)
        assert {(t.topic_id, p.partition_index, p.error_code) for t in committed.topics for p in t.partitions} == {
            (topic_id, 1, ErrorCode.none), (stranger, 0, ErrorCode.unknown_topic_id)}
        fetched = await conn.request(of10.OffsetFetchRequest(groups=(of10.OffsetFetchRequestGroup(
            group_id="g10", topics=(of10.OffsetFetchRequestTopics(topic_id=topic_id, partition_indexes=(0, 1)),
                                    of10.OffsetFetchRequestTopics(topic_id=stranger, partition_indexes=(0,)))),)))
        got = {(t.topic_id, p.partition_index): (p.committed_offset, p.error_code)
               for g in fetched.groups for t in g.topics for p in t.partitions}
        assert got == {(topic_id, 0): (-1, ErrorCode.none), (topic_id, 1): (42, ErrorCode.none),
                       (stranger, 0): (-1, ErrorCode.unknown_topic_id)}
        # The same offset by name (v9), and all of a group's offsets by id (null topics).
        by_name = await conn.request(of9.OffsetFetchRequest(groups=(of9.OffsetFetchRequestGroup(
            group_id="g10", topics=(of9.OffsetFetchRequestTopics(name="ids", partition_indexes=(1,)),)),)))
        assert by_name.groups[0].topics[0].partitions[0].committed_offset == 42
        every = await conn.request(of10.OffsetFetchRequest(groups=(of10.OffsetFetchRequestGroup(
            group_id="g10", topics=None),)))
        assert [(t.topic_id, [p.committed_offset for p in t.partitions]) for t in every.groups[0].topics] == [
            (topic_id, [42])]
        running.stop()
