"""The ZooKeeper-mode controller against a real ZooKeeper.

Each "broker" here is its ZooKeeper-mode metadata path only: a kazoo
session, its `/brokers/ids/<id>` registration, a `ZkController` campaigning
for `/controller`, and a `ZkMetadataCache` receiving the controller's
requests. What the tests assert is what brokers would act on: who leads
which partition, at which epoch.
"""

import json
import signal

import pytest
import trio

from quorum.zookeeper import admin, store
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_side import BrokerIdInUseError, notify_isr_changes, register_broker, write_isr_change
from quorum.zookeeper.context import SetZNode, ZkTransaction
from quorum.zookeeper.errors import ControllerMovedError, StaleZNodeVersionError
from quorum.zookeeper.znodes import NamedPartition as TP

from zk_testing import active, broker_info, close, connect, eventually, kill_session, spawn_registered_broker, \
    start_broker

SESSION_TIMEOUT_S = 2.0


async def _get(zk, path):
    return await trio.to_thread.run_sync(zk.get, path)


async def _state(zk, topic, p):
    data, stat = await _get(zk, z.partition_state_path(topic, p))
    return z.decode_partition_state(topic, p, data, stat.version)


def _leader_seen(broker, topic, p):
    t = broker.cache.image.topic(topic)
    return None if t is None or p not in t.partitions else t.partitions[p].leader


async def test_znodes_written_are_kafkas_layout(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    await eventually(lambda: b1.controller.active, what="broker 1 elected")
    zk = b1.zk
    broker_json = json.loads((await _get(zk, "/brokers/ids/1"))[0])
    assert broker_json["version"] == 5 and broker_json["endpoints"] == ["PLAINTEXT://127.0.0.1:19001"]
    assert broker_json["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT"}
    assert json.loads((await _get(zk, "/controller"))[0])["brokerid"] == 1
    assert (await _get(zk, "/controller_epoch"))[0] == b"1"
    await trio.to_thread.run_sync(lambda: admin.create_topic(zk, "orders", {0: (1,), 1: (1,)}, {"retention.ms": "5"}))
    await eventually(lambda: _leader_seen(b1, "orders", 1) == 1, what="topic initialized")
    topic_json = json.loads((await _get(zk, "/brokers/topics/orders"))[0])
    assert topic_json["version"] == 3 and topic_json["partitions"] == {"0": [1], "1": [1]}
    assert len(topic_json["topic_id"]) == 22
    assert json.loads((await _get(zk, "/brokers/topics/orders/partitions/0/state"))[0]) == {
        "controller_epoch": 1, "leader": 1, "version": 1, "leader_epoch": 0, "isr": [1]}
    assert json.loads((await _get(zk, "/config/topics/orders"))[0]) == {"version": 1, "config": {"retention.ms": "5"}}
    # A second registration of the same id from another session is refused.
    other = await connect(zk_hosts)
    with pytest.raises(BrokerIdInUseError):
        await trio.to_thread.run_sync(register_broker, other, broker_info(1))
    await close(other)
    await kill_session(b1)


async def test_one_controller_is_elected_and_a_new_one_takes_over_with_a_higher_epoch(zk_hosts, nursery):
    caches = {}
    brokers = [await start_broker(nursery, zk_hosts, b, caches) for b in (1, 2, 3)]
    await eventually(lambda: len(active(brokers)) == 1, what="one controller")
    (first,) = active(brokers)
    assert first.broker_id == 1 and first.controller.epoch == 1
    await trio.to_thread.run_sync(lambda: admin.create_topic(first.zk, "t", {0: (2, 3)}))
    await eventually(lambda: _leader_seen(brokers[2], "t", 0) == 2, what="topic online")

    await kill_session(first)
    rest = brokers[1:]
    took = await eventually(lambda: len(active(rest)) == 1, what="a new controller")
    (second,) = active(rest)
    assert second.controller.epoch == 2 and second.controller.elections_won == 1
    assert (await _get(second.zk, "/controller_epoch"))[0] == b"2"
    # Closing a session deletes its ephemeral znodes at once: no session timeout to wait for.
    assert took < SESSION_TIMEOUT_S
    # The new controller loaded the state and told the brokers with its epoch.
    await eventually(lambda: all(b.cache.controller_epoch == 2 for b in rest), what="brokers see epoch 2")
    assert _leader_seen(brokers[2], "t", 0) == 2
    for b in rest:
        await kill_session(b)


async def test_broker_crash_moves_its_leaders_within_the_session_timeout(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    b3 = await start_broker(nursery, zk_hosts, 3, caches)
    crashed = await trio.to_thread.run_sync(spawn_registered_broker, zk_hosts, 2, SESSION_TIMEOUT_S)
    try:
        await eventually(lambda: b1.controller.active, what="controller")
        await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (2, 3, 1), 1: (3, 2), 2: (1, 2)}))
        await eventually(lambda: _leader_seen(b3, "t", 0) == 2 and _leader_seen(b3, "t", 2) == 1, what="online")
        before = await _state(b1.zk, "t", 0)
        assert before.leader == 2 and before.isr == (2, 3, 1)

        crashed.send_signal(signal.SIGKILL)
        took = await eventually(lambda: _leader_seen(b3, "t", 0) == 3 and _leader_seen(b1, "t", 0) == 3,
                                timeout_s=SESSION_TIMEOUT_S + 5, what="leadership moved")
        # The session must expire first; then the controller reacts within a fraction of a second.
        assert took <= SESSION_TIMEOUT_S + 1.5, f"leader moved {took:.2f}s after the crash"
        after = await _state(b1.zk, "t", 0)
        assert after.leader == 3 and after.isr == (3, 1) and after.leader_epoch == before.leader_epoch + 1
        # Partition 1 (leader 3, follower 2): leader stays, 2 leaves the ISR.
        assert (await _state(b1.zk, "t", 1)).isr == (3,)
        assert b3.cache.image.brokers[2].fenced
    finally:
        crashed.kill()
        crashed.wait()
    for b in (b1, b3):
        await kill_session(b)


async def test_a_stale_controllers_write_is_fenced_and_it_resigns(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    b2 = await start_broker(nursery, zk_hosts, 2, caches)
    await eventually(lambda: b1.controller.active, what="controller")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (2, 1)}))
    await eventually(lambda: _leader_seen(b1, "t", 0) == 2, what="online")
    stale_epoch_version = b1.controller.epoch_zk_version
    state = await _state(b1.zk, "t", 0)

    # A newer controller's election bumps /controller_epoch behind broker 1's back
    # (say broker 1 was paused long enough for that to happen).
    other = await connect(zk_hosts)
    epoch, version = await trio.to_thread.run_sync(store.read_controller_epoch, other)
    await trio.to_thread.run_sync(lambda: other.set(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(epoch + 1),
                                                    version=version))
    # Its write, even with the partition's current zkVersion, is rejected as a whole.
    write = ZkTransaction((SetZNode(z.partition_state_path("t", 0), z.encode_partition_state(
        z.PartitionState(1, 99, (1,), 1)), state.zk_version),), TP("t", 0))
    with pytest.raises(ControllerMovedError):
        await trio.to_thread.run_sync(store.apply_transactions, b1.zk, stale_epoch_version, [write])
    assert await _state(b1.zk, "t", 0) == state

    # The controller finds out on its next write (broker 2 dies): it resigns without writing,
    # campaigns again and wins a higher epoch, then makes the election.
    await kill_session(b2)
    await eventually(lambda: b1.controller.elections_won == 2 and b1.controller.active, what="re-elected")
    assert b1.controller.epoch == epoch + 2
    await eventually(lambda: _leader_seen(b1, "t", 0) == 1, what="broker 1 leads")
    final = await _state(b1.zk, "t", 0)
    assert (final.leader, final.isr, final.controller_epoch) == (1, (1,), epoch + 2)
    assert final.leader_epoch == state.leader_epoch + 1
    await close(other)
    await kill_session(b1)


async def test_leader_isr_change_is_conditional_and_reaches_every_broker(zk_hosts, nursery):
    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    b2 = await start_broker(nursery, zk_hosts, 2, caches)
    await eventually(lambda: b1.controller.active, what="controller")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (2, 1)}))
    await eventually(lambda: _leader_seen(b1, "t", 0) == 2, what="online")
    state = await _state(b2.zk, "t", 0)

    # Leader 2 shrinks the ISR to itself, then notifies.
    shrunk = await trio.to_thread.run_sync(write_isr_change, b2.zk, TP("t", 0), state, (2,))
    assert shrunk.zk_version == state.zk_version + 1
    # A second write from the stale view loses.
    with pytest.raises(StaleZNodeVersionError):
        await trio.to_thread.run_sync(write_isr_change, b2.zk, TP("t", 0), state, (2, 1))
    await trio.to_thread.run_sync(notify_isr_changes, b2.zk, [TP("t", 0)])
    await eventually(lambda: b1.cache.image.topic("t").partitions[0].isr == (2,), what="broker 1 sees the ISR")
    reg = b1.cache.image.topic("t").partitions[0]
    assert (reg.leader_epoch, reg.partition_epoch) == (shrunk.leader_epoch, shrunk.zk_version)
    await eventually(lambda: not b1.zk.get_children(z.ISR_CHANGE_NOTIFICATION_PATH), what="notification deleted")
    for b in (b1, b2):
        await kill_session(b)


async def test_topic_creation_and_deletion_through_the_znodes(zk_hosts, nursery):
    caches = {}
    brokers = [await start_broker(nursery, zk_hosts, b, caches) for b in (1, 2, 3)]
    b1 = brokers[0]
    await eventually(lambda: b1.controller.active, what="controller")
    assignment = admin.assign_replicas([1, 2, 3], 6, 2, "events")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "events", assignment))
    await eventually(lambda: all(len(b.cache.image.topic("events").partitions) == 6 for b in brokers
                                 if b.cache.image.topic("events")), what="created")
    await eventually(lambda: all(b.cache.image.topic("events") is not None for b in brokers), what="everyone")
    leaders = [_leader_seen(brokers[0], "events", p) for p in range(6)]
    assert leaders == [assignment[p][0] for p in range(6)]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]  # preferred leaders spread over the brokers

    await trio.to_thread.run_sync(admin.delete_topic, b1.zk, "events")
    await eventually(lambda: all(b.cache.image.topic("events") is None for b in brokers), what="deleted")
    for path in ("/brokers/topics/events", "/config/topics/events", "/admin/delete_topics/events"):
        await eventually(lambda: b1.zk.exists(path) is None, what=f"{path} gone")
    for b in brokers:
        await kill_session(b)


async def _serve_controller_requests(cache, task_status=trio.TASK_STATUS_IGNORED):
    """A broker's controller-request listener: Kafka frames in, ZkMetadataCache, Kafka frames out."""
    from quorum.zookeeper import messages as m
    from common.wire.framing import FrameBuffer

    async def connection(stream):
        frames = FrameBuffer()
        async for data in stream:
            for frame in frames.feed(data):
                header, request = m.decode_request(frame)
                await stream.send_all(m.encode_response(header.correlation_id, cache.handle(request)))

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as n:
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(connection, listeners, handler_nursery=n)


async def test_controller_requests_travel_as_kafka_frames_to_brokers(zk_hosts, nursery):
    from quorum.metadata.records import Endpoint
    from quorum.zookeeper.broker_metadata import ZkMetadataCache
    from quorum.zookeeper.channel import ControllerChannelManager

    caches = {b: ZkMetadataCache(b) for b in (1, 2)}
    ports = {b: await nursery.start(_serve_controller_requests, caches[b]) for b in (1, 2)}
    responses = []
    channel = ControllerChannelManager(nursery, "PLAINTEXT", on_response=lambda b, req, resp: responses.append(resp))
    infos = {b: z.BrokerInfo(b, (Endpoint("PLAINTEXT", "127.0.0.1", ports[b], 0),)) for b in (1, 2)}
    b1 = await start_broker(nursery, zk_hosts, 1, {}, info=infos[1], sender=channel)
    b2 = await start_broker(nursery, zk_hosts, 2, {}, info=infos[2], sender=LocalNothing())
    await eventually(lambda: b1.controller.active, what="controller")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "net", {0: (2, 1), 1: (1, 2)}))

    def leaders():
        t = caches[2].image.topic("net")
        return None if t is None else [t.partitions[p].leader for p in sorted(t.partitions)]

    await eventually(lambda: leaders() == [2, 1], what="broker 2 learns the leaders over the wire")
    assert all(r.error_code == 0 for r in responses)
    channel.close()
    for b in (b1, b2):
        await kill_session(b)


class LocalNothing:
    """The sender of a controller that must not win in this test (broker 1 registered first)."""

    def update_brokers(self, live):
        pass

    def send(self, broker_id, request):
        raise AssertionError("broker 2 should not be the controller here")


async def test_unclean_election_follows_the_topic_config_read_from_zookeeper(zk_hosts, nursery):
    caches = {}
    brokers = {b: await start_broker(nursery, zk_hosts, b, caches) for b in (1, 2, 3)}
    b1 = brokers[1]
    await eventually(lambda: b1.controller.active, what="controller")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (2, 3)}))
    await eventually(lambda: _leader_seen(b1, "t", 0) == 2, what="online")
    # Leader 2 drops 3 from the ISR (3 fell behind), then dies: no live ISR member is left.
    state = await _state(b1.zk, "t", 0)
    await trio.to_thread.run_sync(write_isr_change, brokers[2].zk, TP("t", 0), state, (2,))
    await kill_session(brokers[2])
    await eventually(lambda: _leader_seen(b1, "t", 0) == -1, what="offline (clean election only)")
    assert (await _state(b1.zk, "t", 0)).isr == (2,)  # the ISR keeps its last member

    # An operator allows unclean election for the topic: broker 3 leads, alone, and may have lost data.
    await trio.to_thread.run_sync(admin.set_topic_config, b1.zk, "t", {"unclean.leader.election.enable": "true"})
    await eventually(lambda: _leader_seen(brokers[3], "t", 0) == 3, what="unclean leader")
    assert (await _state(b1.zk, "t", 0)).isr == (3,)
    for b in (1, 3):
        await kill_session(brokers[b])


async def test_expired_session_re_registers_with_a_new_epoch_and_the_controller_resigns(zk_hosts, nursery):
    from zk_testing import expire_session

    caches = {}
    b1 = await start_broker(nursery, zk_hosts, 1, caches)
    b2 = await start_broker(nursery, zk_hosts, 2, caches)
    await eventually(lambda: b1.controller.active, what="controller")
    await trio.to_thread.run_sync(lambda: admin.create_topic(b1.zk, "t", {0: (1, 2)}))
    await eventually(lambda: _leader_seen(b2, "t", 0) == 1, what="online")
    old_epoch = b1.registration.broker_epoch

    await expire_session(zk_hosts, b1.zk)
    # A new controller is elected at epoch 2 (usually broker 2, which was watching); broker 1
    # comes back in a new session with a larger broker epoch.
    await eventually(lambda: len(active([b1, b2])) == 1 and active([b1, b2])[0].controller.epoch == 2,
                     what="a controller at epoch 2")
    await eventually(lambda: b1.registration.broker_epoch > old_epoch, what="broker 1 re-registered")
    assert b1.cache.broker_epoch == b1.registration.broker_epoch
    # Both brokers converge on the controller's state, from epoch 2.
    def converged():
        return all(b.cache.controller_epoch == 2 for b in (b1, b2)) and _leader_seen(b1, "t", 0) == _leader_seen(
            b2, "t", 0) != -1

    await eventually(converged, what="brokers caught up")
    state = await _state(b2.zk, "t", 0)
    assert state.leader == _leader_seen(b1, "t", 0)
    for b in (b1, b2):
        await kill_session(b)
