"""The controller APIs on a quorum: decided by the active controller only,
answered after commit, NOT_CONTROLLER elsewhere; state survives a change
of active controller."""

from __future__ import annotations

import trio
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.describe_configs.v4 import request as dc_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig
from quorum.metadata.records import RegisterBrokerRecord
from quorum.node.applier import committed_records
from quorum.node.controller_client import ControllerClient
from quorum.node.workload import BrokerStandIn, alter_config_request, create_topics_request
from common.wire import open_connection_pool

from node_testing import CLUSTER_ID, InProcessQuorum


async def started(tmp_path, nursery, **kwargs) -> tuple[InProcessQuorum, ControllerClient]:
    quorum = InProcessQuorum(tmp_path, nursery, **kwargs)
    await quorum.start_all()
    await quorum.active_leader()
    pool = await nursery.start(_pool)
    return quorum, ControllerClient(pool, quorum.voters, request_timeout_ms=2000, retry_backoff_ms=10)


async def _pool(*, task_status) -> None:
    async with open_connection_pool(connect_timeout_ms=1000) as pool:
        task_status.started(pool)
        await trio.sleep_forever()


async def registered_broker(client: ControllerClient, nursery) -> BrokerStandIn:
    broker = BrokerStandIn(client, CLUSTER_ID, broker_id=7, heartbeat_interval_s=0.1)
    with trio.fail_after(10):
        await nursery.start(broker.run)
    return broker


async def test_registration_gets_the_offset_of_its_record_as_broker_epoch(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    broker = await registered_broker(client, nursery)
    leader = quorum.node(await quorum.active_leader())
    records, _ = committed_records(leader.log.read(broker.epoch, 10**6))
    first = records[0]
    assert isinstance(first.record, RegisterBrokerRecord) and first.offset == broker.epoch
    assert first.record.broker_id == 7
    assert leader.image.brokers[7].epoch == broker.epoch and not leader.image.brokers[7].fenced


async def test_only_the_active_controller_decides(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    await registered_broker(client, nursery)
    leader_id = await quorum.active_leader()
    for node_id in quorum.voters:
        answer = await client.send_to(node_id, create_topics_request([f"from-{node_id}"]))
        expected = ErrorCode.none if node_id == leader_id else ErrorCode.not_controller
        assert answer.topics[0].error_code == expected, node_id
    await quorum.wait_applied_everywhere(quorum.node(leader_id).high_watermark)
    for node_id in quorum.voters:
        assert set(quorum.node(node_id).image.topic_ids_by_name) == {f"from-{leader_id}"}


async def test_an_answer_means_committed_and_reads_see_earlier_writes(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    await registered_broker(client, nursery)
    _, created = await client.send(create_topics_request(["orders"], partitions=3))
    assert created.topics[0].error_code == ErrorCode.none and created.topics[0].num_partitions == 3
    leader = quorum.node(await quorum.active_leader())
    assert leader.image.topic("orders") is not None, "answered only once committed and applied"
    _, altered = await client.send(alter_config_request(["orders"], "retention.ms", "1234"))
    assert altered.responses[0].error_code == ErrorCode.none
    _, described = await client.send(dc_req.DescribeConfigsRequest(resources=(dc_req.DescribeConfigsResource(
        resource_type=2, resource_name="orders", configuration_keys=("retention.ms",)),),
        include_synonyms=False, include_documentation=False))
    assert [(c.name, c.value) for c in described.results[0].configs] == [("retention.ms", "1234")]


async def test_concurrent_decisions_see_each_other_before_they_commit(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    await registered_broker(client, nursery)
    codes = []

    async def create() -> None:
        _, answer = await client.send(create_topics_request(["same-name"]))
        codes.append(answer.topics[0].error_code)

    async with trio.open_nursery() as creators:
        for _ in range(5):
            creators.start_soon(create)
    assert sorted(codes) == sorted([ErrorCode.none] + [ErrorCode.topic_already_exists] * 4)


async def test_a_new_active_controller_continues_from_the_committed_state(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    broker = await registered_broker(client, nursery)
    await client.send(create_topics_request(["kept"]))
    old = await quorum.active_leader()
    old_epoch = quorum.node(old).leader.epoch
    await quorum.node(old).resign()
    with trio.fail_after(10):
        while (new := await quorum.active_leader()) == old:
            await trio.sleep(0.01)
    _, again = await client.send(create_topics_request(["kept", "fresh"]))
    assert [t.error_code for t in again.topics] == [ErrorCode.topic_already_exists, ErrorCode.none]
    _, heartbeat = await client.send(BrokerHeartbeatRequest(
        broker_id=7, broker_epoch=broker.epoch, current_metadata_offset=2**40, want_fence=False,
        want_shut_down=False))
    assert heartbeat.error_code == ErrorCode.none and not heartbeat.is_fenced
    assert quorum.node(new).leader.epoch > old_epoch


async def test_a_broker_that_stops_heartbeating_is_fenced(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery,
                                   controller_config=ControllerConfig(cluster_id=CLUSTER_ID,
                                                                      broker_session_timeout_ms=300))
    with trio.CancelScope() as heartbeats:
        async with trio.open_nursery() as inner:
            await registered_broker(client, inner)
            heartbeats.cancel()
    leader = quorum.node(await quorum.active_leader())
    assert not leader.image.brokers[7].fenced
    with trio.fail_after(5):
        while not leader.image.brokers[7].fenced:
            await leader.wait_for_change()


async def test_a_registration_for_another_cluster_is_refused(tmp_path, nursery):
    quorum, client = await started(tmp_path, nursery)
    stranger = BrokerStandIn(client, "another-cluster", broker_id=9)
    try:
        await stranger.register()
    except Exception as exc:  # noqa: BLE001 - the message is what the operator sees
        assert "INCONSISTENT_CLUSTER_ID" in str(exc).upper()
    else:
        raise AssertionError("a broker of another cluster registered")
    assert 9 not in quorum.node(await quorum.active_leader()).image.brokers
