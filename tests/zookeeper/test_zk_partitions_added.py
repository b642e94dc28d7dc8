"""CreatePartitions in ZooKeeper mode: a grown `/brokers/topics/<t>` brings new partitions online.

In-process brokers (their ZooKeeper-mode metadata path only, see
zk_testing.py) against a real ZooKeeper; what they are told is what a
broker would act on.
"""

import pytest
import trio

from quorum.zookeeper import admin
from quorum.zookeeper.znodes import NamedPartition as TP

from zk_testing import active, eventually, kill_session, start_broker


def _partitions_seen(broker, topic):
    t = broker.cache.image.topic(topic)
    return {} if t is None else {p: (r.leader, r.replicas) for p, r in t.partitions.items()}


async def test_added_partitions_go_online_and_reach_every_broker_while_old_ones_stay(zk_hosts, nursery):
    caches = {}
    brokers = [await start_broker(nursery, zk_hosts, b, caches) for b in (1, 2)]
    await eventually(lambda: len(active(brokers)) == 1, what="a controller")
    zk = brokers[0].zk
    created = await trio.to_thread.run_sync(lambda: admin.create_topic(zk, "t", {0: (1, 2), 1: (2, 1)}))
    await eventually(lambda: all(len(_partitions_seen(b, "t")) == 2 for b in brokers), what="topic online")
    before = _partitions_seen(brokers[1], "t")

    await trio.to_thread.run_sync(admin.add_partitions, zk, "t", created.topic_id, {2: (2, 1), 3: (1, 2)})
    await eventually(lambda: all(len(_partitions_seen(b, "t")) == 4 for b in brokers), what="new partitions seen")
    seen = _partitions_seen(brokers[0], "t")
    assert seen[2] == (2, (2, 1)) and seen[3] == (1, (1, 2))
    assert {p: seen[p] for p in (0, 1)} == before
    for b in brokers:
        await kill_session(b)


async def test_adding_partitions_from_a_stale_view_is_refused(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    await eventually(lambda: b1.controller.active, what="controller")
    created = await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (1,)}))
    await trio.to_thread.run_sync(admin.add_partitions, b1.zk, "t", created.topic_id, {1: (1,)})
    # A second broker that still saw one partition adds "partition 1" again: refused.
    with pytest.raises(admin.TopicAdminError, match="has 2 partitions now"):
        await trio.to_thread.run_sync(admin.add_partitions, b1.zk, "t", created.topic_id, {1: (1,)})
    await eventually(lambda: len(_partitions_seen(b1, "t")) == 2, what="two partitions")
    assert TP("t", 1) in b1.controller.core.ctx.states
    await kill_session(b1)
