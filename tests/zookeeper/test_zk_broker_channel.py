"""A ZooKeeper-mode broker's controller-bound requests as znode writes, against a real ZooKeeper.

The leaders' ISR changes (AlterPartition) are conditional writes of the
partition state: what a stale leader may not overwrite is what these tests
check, together with topic creation racing another broker and producer-id
blocks shared by several brokers.
"""

import datetime

import trio
from kio.schema.allocate_producer_ids.v0.request import AllocateProducerIdsRequest
from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from quorum.controller.config import ControllerConfig
from quorum.metadata.image import MetadataImage
from quorum.zookeeper import admin
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_channel import PRODUCER_ID_BLOCK_SIZE, ZkBrokerChannel

from zk_testing import eventually, kill_session, start_broker


def _channel(broker, image=None) -> ZkBrokerChannel:
    return ZkBrokerChannel(broker.zk, broker.broker_id, (lambda: image) if image else (lambda: broker.cache.image),
                           ControllerConfig())


def _alter(topic_id, leader_epoch, partition_epoch, isr) -> ap_req.AlterPartitionRequest:
    return ap_req.AlterPartitionRequest(broker_id=2, broker_epoch=-1, topics=(ap_req.TopicData(
        topic_id=topic_id, partitions=(ap_req.PartitionData(
            partition_index=0, leader_epoch=leader_epoch, partition_epoch=partition_epoch,
            new_isr_with_epochs=tuple(ap_req.BrokerState(broker_id=b, broker_epoch=-1) for b in isr)),),),))


async def _state(zk):
    data, stat = await trio.to_thread.run_sync(zk.get, z.partition_state_path("t", 0))
    return z.decode_partition_state("t", 0, data, stat.version)


async def test_leader_isr_change_is_written_conditionally_and_reaches_every_broker(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    b2 = await start_broker(nursery, zk_hosts, 2, caches)
    await eventually(lambda: b1.controller.active, what="controller")
    created = await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (2, 1)}))
    await eventually(lambda: b1.cache.image.topic("t") is not None, what="topic online")
    before = await _state(b2.zk)
    channel = _channel(b2)

    # Shrink: written at the next zkVersion, answered with it as the partition epoch.
    answer = await channel.send(_alter(created.topic_id, before.leader_epoch, before.zk_version, (2,)))
    (p,) = answer.topics[0].partitions
    assert (p.error_code, tuple(p.isr), p.partition_epoch) == (ErrorCode.none, (2,), before.zk_version + 1)
    assert (await _state(b2.zk)).isr == (2,)
    # The notification makes the controller tell every broker.
    await eventually(lambda: all(c.image.topic("t").partitions[0].isr == (2,) for c in caches.values()),
                     what="every broker sees the shrunk ISR")

    # The same proposal again, from the old partition epoch: refused, nothing written.
    answer = await channel.send(_alter(created.topic_id, before.leader_epoch, before.zk_version, (2, 1)))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.invalid_update_version
    assert (await _state(b2.zk)).isr == (2,)
    # A broker that is not the leader (or an old leader epoch) cannot write the ISR.
    answer = await _channel(b1).send(_alter(created.topic_id, before.leader_epoch, before.zk_version + 1, (1, 2)))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.fenced_leader_epoch
    answer = await channel.send(_alter(created.topic_id, before.leader_epoch - 1, before.zk_version + 1, (2, 1)))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.fenced_leader_epoch
    assert (await _state(b2.zk)).isr == (2,)
    for b in (b1, b2):
        await kill_session(b)


async def test_a_topic_created_meanwhile_by_another_broker_is_refused_as_existing(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    await eventually(lambda: b1.controller.active and 1 in b1.cache.image.brokers, what="controller")
    stale_image: MetadataImage = b1.cache.image  # before the topic exists
    request = ct_req.CreateTopicsRequest(topics=(ct_req.CreatableTopic(
        name="t", num_partitions=2, replication_factor=1, assignments=(), configs=(
            ct_req.CreatableTopicConfig(name="cleanup.policy", value="compact"),)),),
        timeout=datetime.timedelta(seconds=30), validate_only=False)
    (first,) = (await _channel(b1).send(request)).topics
    assert first.error_code == ErrorCode.none and first.num_partitions == 2
    assignment = z.decode_topic_assignment("t", (await trio.to_thread.run_sync(b1.zk.get, z.topic_path("t")))[0])
    assert assignment.topic_id == first.topic_id and sorted(assignment.partitions) == [0, 1]
    config = (await trio.to_thread.run_sync(b1.zk.get, z.topic_config_path("t")))[0]
    assert z.decode_entity_config(z.topic_config_path("t"), config) == {"cleanup.policy": "compact"}
    # A broker whose image does not show it yet tries the same: ZooKeeper says no.
    (second,) = (await _channel(b1, stale_image).send(request)).topics
    assert second.error_code == ErrorCode.topic_already_exists
    await kill_session(b1)


async def test_producer_id_blocks_never_overlap_between_brokers(zk_hosts, nursery):
    caches = {}
    brokers = [await start_broker(nursery, zk_hosts, b, caches) for b in (1, 2)]
    starts = []

    async def take(broker):
        answer = await _channel(broker).send(AllocateProducerIdsRequest(broker_id=broker.broker_id, broker_epoch=0))
        assert answer.error_code == ErrorCode.none and answer.producer_id_len == PRODUCER_ID_BLOCK_SIZE
        starts.append(answer.producer_id_start)

    async with trio.open_nursery() as n:
        for _ in range(3):
            for b in brokers:
                n.start_soon(take, b)
    assert sorted(starts) == [i * PRODUCER_ID_BLOCK_SIZE for i in range(6)]
    for b in brokers:
        await kill_session(b)
