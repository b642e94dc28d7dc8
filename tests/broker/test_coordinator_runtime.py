"""The broker's group coordinator wiring, on the wire of a live in-process broker.

FindCoordinator creates `__consumer_offsets` on first use (compacted,
internal, `offsets.topic.num.partitions`), answers every key of a batched
v4 request, and refuses what raftka cannot coordinate. A group write is
answered only once its records are committed (the partition's high
watermark passed them), or COORDINATOR_NOT_AVAILABLE after
`offsets.commit.timeout.ms`; a parked JoinGroup gets NOT_COORDINATOR when
leadership moves away.

A second broker (id 2) is registered but never started: partitions it
replicates keep their high watermark until a Fetch "from" replica 2 says
how far it got, which is how these tests hold and release commits.
"""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v0 import request as fc0
from kio.schema.find_coordinator.v3 import request as fc3
from kio.schema.find_coordinator.v4 import request as fc4
from kio.schema.metadata.v12 import request as md

from broker.core.group import OFFSETS_TOPIC_NAME, GroupCoordinatorConfig, offsets_topic_configs
from broker_testing import fetch_request, start_broker
from group_testing import commit_request, heartbeat_request, join_request

FAST = dict(group_initial_rebalance_delay_ms=60_000, offsets_topic_num_partitions=4,
            offsets_topic_replication_factor=1)


async def test_find_coordinator_creates_the_offsets_topic_and_answers_each_key(nursery, tmp_path) -> None:
    running = await start_broker(nursery, tmp_path, group_coordinator=GroupCoordinatorConfig(**FAST))
    conn = await running.connect(nursery)
    answer = await conn.request(fc4.FindCoordinatorRequest(key_type=0, coordinator_keys=("orders", "billing")))
    assert [(c.key, c.error_code, c.node_id, c.port) for c in answer.coordinators] == [
        ("orders", ErrorCode.none, 1, running.port), ("billing", ErrorCode.none, 1, running.port)]
    topic = running.broker.image.topic(OFFSETS_TOPIC_NAME)
    assert len(topic.partitions) == 4
    assert running.broker.image.topic_config(OFFSETS_TOPIC_NAME)["cleanup.policy"] == "compact"
    assert dict(running.broker.image.topic_config(OFFSETS_TOPIC_NAME)).items() >= offsets_topic_configs().items()
    metadata = await conn.request(md.MetadataRequest(topics=(md.MetadataRequestTopic(name=OFFSETS_TOPIC_NAME,
                                                                                     topic_id=None),),
                                                     allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False))
    assert metadata.topics[0].is_internal

    old = await conn.request(fc0.FindCoordinatorRequest(key="orders"))
    assert (old.error_code, old.node_id, old.port) == (ErrorCode.none, 1, running.port)
    with trio.fail_after(5):
        while len(running.broker.coordinator.shards) < 4 or not all(
                r.shard.loaded for r in running.broker.coordinator.shards.values()):
            await trio.sleep(0.01)

    transactional = await conn.request(fc3.FindCoordinatorRequest(key="tx-1", key_type=1))
    assert transactional.error_code == ErrorCode.coordinator_not_available
    # The transaction coordinator's topic wants three brokers by default; this cluster has one.
    assert "transaction.state.log.replication.factor" in transactional.error_message
    share = await conn.request(fc4.FindCoordinatorRequest(key_type=2, coordinator_keys=("s",)))
    assert share.coordinators[0].error_code == ErrorCode.invalid_request


async def test_offsets_topic_wider_than_the_cluster_is_refused_as_kafka_does(nursery, tmp_path) -> None:
    config = GroupCoordinatorConfig(**{**FAST, "offsets_topic_replication_factor": 3})
    running = await start_broker(nursery, tmp_path, group_coordinator=config)
    conn = await running.connect(nursery)
    answer = await conn.request(fc0.FindCoordinatorRequest(key="orders"))
    assert answer.error_code == ErrorCode.coordinator_not_available
    assert running.broker.image.topic(OFFSETS_TOPIC_NAME) is None
    batched = await conn.request(fc4.FindCoordinatorRequest(key_type=0, coordinator_keys=("orders",)))
    assert batched.coordinators[0].error_code == ErrorCode.coordinator_not_available
    assert "offsets.topic.replication.factor=3" in batched.coordinators[0].error_message

    # Once enough brokers are live, the next FindCoordinator creates the topic.
    await running.controller.register_broker(2, "127.0.0.1", 1)
    await running.controller.register_broker(3, "127.0.0.1", 1)
    await conn.request(fc0.FindCoordinatorRequest(key="orders"))
    topic = running.broker.image.topic(OFFSETS_TOPIC_NAME)
    assert topic is not None
    assert all(len(p.replicas) == 3 for p in topic.partitions.values())


async def test_group_timers_fire_on_time_without_a_periodic_tick(nursery, tmp_path) -> None:
    # The timer task sleeps until the earliest deadline: the initial
    # rebalance delay ends the join, then the silent member's session expires.
    config = GroupCoordinatorConfig(**{**FAST, "group_initial_rebalance_delay_ms": 300,
                                       "group_min_session_timeout_ms": 1000})
    running = await start_broker(nursery, tmp_path, group_coordinator=config)
    conn = await running.connect(nursery)
    await conn.request(fc0.FindCoordinatorRequest(key="g"))
    with trio.fail_after(5):
        while len(running.broker.coordinator.shards) < 4 or not all(
                r.shard.loaded for r in running.broker.coordinator.shards.values()):
            await trio.sleep(0.01)
    first = await conn.request(join_request("g", session_ms=1000))
    assert first.error_code == ErrorCode.member_id_required
    start = trio.current_time()
    with trio.fail_after(5):
        joined = await conn.request(join_request("g", first.member_id, session_ms=1000), timeout_ms=None)
    assert joined.error_code == ErrorCode.none and joined.generation_id == 1
    assert trio.current_time() - start >= 0.3, "answered before group.initial.rebalance.delay.ms"
    alive = await conn.request(heartbeat_request("g", first.member_id, 1))
    assert alive.error_code in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    await trio.sleep(1.6)
    expired = await conn.request(heartbeat_request("g", first.member_id, 1))
    assert expired.error_code == ErrorCode.unknown_member_id


async def replicated_offsets_topic(nursery, tmp_path, **config):
    """A broker leading a one-partition `__consumer_offsets` with absent
    broker 2 in its ISR, its shard loaded."""
    group_config = GroupCoordinatorConfig(**{**FAST, "offsets_topic_num_partitions": 1, **config})
    running = await start_broker(nursery, tmp_path, group_coordinator=group_config)
    await running.controller.register_broker(2, "127.0.0.1", 1)
    await running.create_topic(OFFSETS_TOPIC_NAME, configs=offsets_topic_configs(), assignments=[(1, 2)])
    with trio.fail_after(5):
        while 0 not in running.broker.coordinator.shards or not running.broker.coordinator.shards[0].shard.loaded:
            await trio.sleep(0.01)
    return running


async def follower_fetches(running, conn) -> None:
    """Replica 2 fetches up to the leader's log end: the HW follows."""
    leo = running.partition(OFFSETS_TOPIC_NAME).log.log_end_offset
    await conn.request(fetch_request([(OFFSETS_TOPIC_NAME, 0, leo, 1 << 20, -1)], replica_id=2))


async def replicated(running, follower, request):
    """`request`'s answer, with replica 2 fetching until it comes."""
    answers = []

    async def ask() -> None:
        answers.append(await request)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.fail_after(5):
            while not answers:
                await follower_fetches(running, follower)
                await trio.sleep(0.05)
    return answers[0]


async def test_offset_commit_is_answered_once_its_records_are_committed(nursery, tmp_path) -> None:
    running = await replicated_offsets_topic(nursery, tmp_path)
    client = await running.connect(nursery)
    follower = await running.connect(nursery)
    answers = []

    async def commit() -> None:
        answers.append(await client.request(commit_request("g", {("t", 0): 42})))

    hp = running.partition(OFFSETS_TOPIC_NAME)
    nursery.start_soon(commit)
    with trio.fail_after(5):
        while hp.log.log_end_offset == 0:
            await trio.sleep(0.01)
    await trio.sleep(0.3)
    assert answers == [] and hp.state.high_watermark == 0, "answered before the commit record was replicated"
    await follower_fetches(running, follower)
    with trio.fail_after(5):
        while not answers:
            await trio.sleep(0.01)
    assert answers[0].topics[0].partitions[0].error_code == ErrorCode.none


async def test_offset_commit_not_committed_in_time_is_coordinator_not_available(nursery, tmp_path) -> None:
    running = await replicated_offsets_topic(nursery, tmp_path, offsets_commit_timeout_ms=300)
    client = await running.connect(nursery)
    with trio.fail_after(5):
        answer = await client.request(commit_request("g", {("t", 0): 42}))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.coordinator_not_available


async def test_a_parked_join_is_answered_not_coordinator_when_leadership_moves(nursery, tmp_path) -> None:
    running = await replicated_offsets_topic(nursery, tmp_path)
    client = await running.connect(nursery)
    follower = await running.connect(nursery)
    first = await replicated(running, follower, client.request(join_request("g")))  # creates the group
    assert first.error_code == ErrorCode.member_id_required
    answers = []

    async def join() -> None:
        answers.append(await client.request(join_request("g", first.member_id), timeout_ms=None))

    nursery.start_soon(join)
    await trio.sleep(0.3)
    assert answers == [], "the join should wait for the initial rebalance delay"
    await follower_fetches(running, follower)  # replica 2 in sync: it may lead
    await running.controller.controlled_shutdown(1)
    with trio.fail_after(5):
        while not answers:
            await trio.sleep(0.01)
    assert answers[0].error_code == ErrorCode.not_coordinator
    assert running.broker.coordinator.shards == {}
    found = await client.request(fc0.FindCoordinatorRequest(key="g"))
    assert (found.error_code, found.node_id) == (ErrorCode.none, 2)

