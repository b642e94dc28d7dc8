"""The broker's lifecycle core against the real controller decisions.

`BrokerLifecycle` (what the broker sends when) is driven against
`quorum.controller.QuorumController` (what the active controller decides),
with records applied to an image at the next offsets, so the tests see the
same registration, unfencing and controlled shutdown a cluster goes through.
"""

import random
import uuid

from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatResponse
from kio.schema.errors import ErrorCode

from broker.core.lifecycle import BrokerLifecycle, BrokerState, ListenerSpec
from quorum.controller import ControllerConfig, QuorumController
from quorum.metadata import LoggedRecord, MetadataImage

CLUSTER = "lifecycle-test-cluster"


class Cluster:
    """The controller's decisions applied to a committed image (no Raft)."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.config = ControllerConfig(cluster_id=CLUSTER, broker_session_timeout_ms=9000)
        self.controller = QuorumController(self.image, 0, self.config, random.Random(7))

    def send(self, request, now_ms):
        result = self.controller.handle(request, self.image, now_ms)
        base = self.image.offset + 1
        if result.records:
            self.image = self.image.apply(LoggedRecord(base + i, 1, r) for i, r in enumerate(result.records))
        return result.respond(base if result.records else None)

    def create_topic(self, name, partitions, now_ms):
        import datetime

        from kio.schema.create_topics.v7 import request as ct
        response = self.send(ct.CreateTopicsRequest(
            topics=(ct.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                      assignments=(), configs=()),),
            timeout=datetime.timedelta(seconds=5), validate_only=False), now_ms)
        assert response.topics[0].error_code == ErrorCode.none


def lifecycle(broker_id=1, now_ms=0, heartbeat_interval_ms=2000):
    return BrokerLifecycle(broker_id=broker_id, cluster_id=CLUSTER, incarnation_id=uuid.uuid4(),
                           listeners=(ListenerSpec("PLAINTEXT", "127.0.0.1", 9092 + broker_id),), rack=None,
                           heartbeat_interval_ms=heartbeat_interval_ms, now_ms=now_ms)


def step(lc, cluster, now_ms, *, applied=None, ready=True):
    """Send what the lifecycle wants now (if anything) and feed the answer back."""
    offset = cluster.image.offset if applied is None else applied
    request = lc.poll(now_ms, offset, ready)
    if request is None:
        return None
    response = cluster.send(request, now_ms)
    lc.on_response(response, now_ms)
    return response


def test_broker_stays_fenced_until_ready_and_caught_up_then_runs():
    cluster, lc = Cluster(), lifecycle()
    step(lc, cluster, 0)
    assert lc.state is BrokerState.RECOVERY
    epoch = lc.broker_epoch
    assert cluster.image.brokers[1].epoch == epoch and cluster.image.brokers[1].fenced
    # Caught up but not ready (first image not published yet): stays fenced.
    step(lc, cluster, 200, ready=False)
    assert lc.state is BrokerState.RECOVERY and cluster.image.brokers[1].fenced
    # Ready but behind its own registration record: stays fenced.
    step(lc, cluster, 400, applied=epoch - 1)
    assert lc.state is BrokerState.RECOVERY and cluster.image.brokers[1].fenced
    step(lc, cluster, 600)
    assert lc.state is BrokerState.RUNNING and not cluster.image.brokers[1].fenced


def test_running_broker_heartbeats_at_the_interval_and_fast_while_recovering():
    cluster, lc = Cluster(), lifecycle(heartbeat_interval_ms=2000)
    step(lc, cluster, 0)
    assert lc.wake_at_ms() == 0  # the first heartbeat goes out at once
    step(lc, cluster, 0, ready=False)
    assert lc.wake_at_ms() == 100
    assert lc.poll(50, cluster.image.offset, True) is None
    lc.poll_now()  # the shell: a new image arrived
    step(lc, cluster, 60)
    assert lc.state is BrokerState.RUNNING
    assert lc.wake_at_ms() == 60 + 2000


def test_controlled_shutdown_moves_leadership_before_letting_go():
    cluster, a, b = Cluster(), lifecycle(1), lifecycle(2)
    for lc in (a, b):
        step(lc, cluster, 0)
        step(lc, cluster, 0)
    assert a.state is b.state is BrokerState.RUNNING
    cluster.create_topic("t", 4, 10)
    led_by_a = [p for p in cluster.image.topic("t").partitions.values() if p.leader == 1]
    assert led_by_a
    a.begin_controlled_shutdown(100)
    assert a.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN
    now = 100
    while not a.done:
        response = step(a, cluster, now)
        now += 100
        assert now < 2000, "the controller never let the broker go"
        if a.done:
            assert response.should_shut_down
    # RF=1: partitions it led are offline now, none is led by the leaving broker.
    assert all(p.leader != 1 for p in cluster.image.topic("t").partitions.values())
    assert cluster.image.brokers[1].fenced
    step(b, cluster, now)
    assert b.state is BrokerState.RUNNING


def test_shutdown_before_registering_needs_no_hand_over():
    lc = lifecycle()
    lc.begin_controlled_shutdown(0)
    assert lc.done and lc.poll(0, -1, True) is None


def test_restarted_process_registers_anew_after_the_old_session_expires():
    cluster, first = Cluster(), lifecycle(1)
    step(first, cluster, 0)
    step(first, cluster, 0)
    old_epoch = first.broker_epoch
    second = lifecycle(1, now_ms=1000)  # a new incarnation while the old session lives
    step(second, cluster, 1000)
    assert second.state is BrokerState.STARTING
    assert second.last_error == "BrokerRegistration: DUPLICATE_BROKER_REGISTRATION"
    assert second.wake_at_ms() == 1100  # retried with backoff
    fencing = cluster.controller.tick(cluster.image, 20_000)  # the old session expired
    cluster.image = cluster.image.apply(LoggedRecord(cluster.image.offset + 1 + i, 1, r)
                                        for i, r in enumerate(fencing))
    assert cluster.image.brokers[1].fenced
    step(second, cluster, 20_000)
    assert second.state is BrokerState.RECOVERY and second.broker_epoch > old_epoch
    step(second, cluster, 20_100)
    assert second.state is BrokerState.RUNNING


def test_forgotten_registration_registers_again_and_failures_back_off():
    cluster, lc = Cluster(), lifecycle(heartbeat_interval_ms=1000)
    step(lc, cluster, 0)
    step(lc, cluster, 0)
    assert lc.state is BrokerState.RUNNING
    request = lc.poll(1000, cluster.image.offset, True)
    lc.on_response(BrokerHeartbeatResponse(throttle_time=0, error_code=ErrorCode.stale_broker_epoch,
                                           should_shut_down=False), 1000)
    assert lc.state is BrokerState.STARTING and request is not None
    waits = []
    now = 1000
    for _ in range(6):
        now = lc.wake_at_ms()
        assert lc.poll(now, 0, True) is not None
        lc.on_failure("no controller", now)
        waits.append(lc.wake_at_ms() - now)
    assert waits == [200, 400, 800, 1000, 1000, 1000]  # doubling, capped at the heartbeat interval


def test_lifecycle_core_does_no_io():
    import ast
    import pathlib

    import broker.core.lifecycle

    tree = ast.parse(pathlib.Path(broker.core.lifecycle.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"trio", "socket", "time", "os", "random", "asyncio"}


def test_broker_registers_the_advertised_endpoint_clients_can_reach():
    import socket

    from broker.shell.process import advertised_listener
    from common.config import NodeConfig

    base = {"node.id": "4", "process.roles": "broker", "controller.quorum.voters": "1@10.0.0.1:9093",
            "log.dirs": "/data"}
    wildcard = NodeConfig.from_properties({**base, "listeners": "PLAINTEXT://0.0.0.0:9092"})
    assert advertised_listener(wildcard, 9092) == ListenerSpec("PLAINTEXT", socket.getfqdn(), 9092)
    advertised = NodeConfig.from_properties({**base, "listeners": "PLAINTEXT://0.0.0.0:9092",
                                             "advertised.listeners": "PLAINTEXT://kafka-4.example:19092"})
    assert advertised_listener(advertised, 9092) == ListenerSpec("PLAINTEXT", "kafka-4.example", 19092)
    ephemeral = NodeConfig.from_properties({**base, "listeners": "PLAINTEXT://127.0.0.1:0"})
    assert advertised_listener(ephemeral, 41234) == ListenerSpec("PLAINTEXT", "127.0.0.1", 41234)


def test_a_broker_with_an_offline_log_dir_lists_it_in_every_heartbeat_and_stays_unfenced():
    cluster, lc = Cluster(), lifecycle(heartbeat_interval_ms=2000)
    step(lc, cluster, 0)
    step(lc, cluster, 100)
    assert lc.state is BrokerState.RUNNING
    dead = uuid.uuid4()
    lc.offline_log_dirs = (dead,)
    lc.poll_now()  # the shell: a log dir failed, tell the controller at once
    request = lc.poll(150, cluster.image.offset, True)
    assert request.offline_log_dirs == (dead,)
    lc.on_response(cluster.send(request, 150), 150)
    assert lc.state is BrokerState.RUNNING and not cluster.image.brokers[1].fenced
    assert lc.poll(150 + 2000, cluster.image.offset, True).offline_log_dirs == (dead,)
