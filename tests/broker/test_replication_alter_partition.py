"""AlterPartition end to end against the real controller decisions: the
leader's proposals go through `build_request` into `QuorumController`, the
answers come back through `split_response`, and the metadata image the
controller produces feeds the leader again."""

from __future__ import annotations

import random
import uuid

from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from broker.core.replication import (
    Partition,
    TopicIdPartition,
    build_request,
    eligible_brokers,
    failed,
    split_response,
)
from quorum.controller import ControllerConfig, QuorumController
from quorum.metadata import LoggedRecord, MetadataImage
from replication_testing import CONFIG, LAG_MS, EpochLog, fetch


class Controller:
    """The controller's decisions applied at once (no quorum, no network)."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.controller = QuorumController(self.image, 0, ControllerConfig(), random.Random(1))
        self.epochs: dict[int, int] = {}

    def send(self, request):
        result = self.controller.handle(request, self.image, 0)
        base = None
        if result.records:
            base = self.image.offset + 1
            self.image = self.image.apply([LoggedRecord(base + i, 1, r) for i, r in enumerate(result.records)])
        return result.respond(base)

    def start_broker(self, b: int) -> None:
        response = self.send(BrokerRegistrationRequest(
            broker_id=b, cluster_id="c", incarnation_id=uuid.UUID(int=b),
            listeners=(Listener(name="PLAINTEXT", host="h", port=9000 + b, security_protocol=0),), features=(),
            rack=None))
        self.epochs[b] = response.broker_epoch
        self.heartbeat(b)

    def heartbeat(self, b: int, want_fence: bool = False):
        return self.send(BrokerHeartbeatRequest(broker_id=b, broker_epoch=self.epochs[b],
                                                current_metadata_offset=self.image.offset,
                                                want_fence=want_fence, want_shut_down=False))

    def partition(self):
        return self.image.topic("t").partitions[0]


def setup():
    """Brokers 1-3, topic t with replicas (1, 2, 3) and min.insync.replicas=2;
    broker 1's partition as leader over a 10-record log."""
    c = Controller()
    for b in (1, 2, 3):
        c.start_broker(b)
    topic = ct_req.CreatableTopic(
        name="t", num_partitions=-1, replication_factor=-1,
        assignments=(ct_req.CreatableReplicaAssignment(partition_index=0, broker_ids=(1, 2, 3)),),
        configs=(ct_req.CreatableTopicConfig(name="min.insync.replicas", value="2"),))
    assert c.send(ct_req.CreateTopicsRequest(topics=(topic,), validate_only=False)).topics[0].error_code == 0
    topic_id = c.image.topic("t").topic_id
    log = EpochLog.of(*[0] * 10)
    p = Partition("t", 0, topic_id, 1, CONFIG, min_insync_replicas=2)
    p.apply_registration(c.partition(), log, 0, eligible=eligible_brokers(c.image))
    return c, p, log


def round_trip(c: Controller, p: Partition, proposal, now_ms: int):
    response = c.send(build_request(1, c.epochs[1], [proposal]))
    result = split_response(response, [proposal])[TopicIdPartition(proposal.topic_id, 0)]
    return result, p.on_alter_partition_result(proposal, result, now_ms)


def test_a_shrink_and_an_expansion_are_applied_and_confirmed():
    c, p, log = setup()
    p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=0), log, 0)
    shrink = p.tick(LAG_MS + 1).alter_partition
    assert shrink.isr == (1, 2)
    result, update = round_trip(c, p, shrink, LAG_MS + 2)
    assert result.error == ErrorCode.none and c.partition().isr == (1, 2)
    assert p.leader.isr == (1, 2) and p.leader.partition_epoch == c.partition().partition_epoch
    assert update.high_watermark_moved and p.high_watermark == 10

    expand = p.handle_replica_fetch(fetch(3, 10, log, leader_epoch=0, broker_epoch=c.epochs[3]), log,
                                    LAG_MS + 3).update.alter_partition
    result, _ = round_trip(c, p, expand, LAG_MS + 4)
    assert result.error == ErrorCode.none and c.partition().isr == (1, 2, 3) and p.leader.isr == (1, 2, 3)


def test_a_fenced_broker_is_refused_and_the_leader_forgets_the_expansion():
    c, p, log = setup()
    p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=0), log, 0)
    shrink = p.tick(LAG_MS + 1).alter_partition
    round_trip(c, p, shrink, LAG_MS + 2)
    c.heartbeat(3, want_fence=True)  # broker 3 fenced; the leader's image does not know yet
    expand = p.handle_replica_fetch(fetch(3, 10, log, leader_epoch=0), log, LAG_MS + 3).update.alter_partition
    assert expand is not None
    result, _ = round_trip(c, p, expand, LAG_MS + 4)
    assert result.error == ErrorCode.ineligible_replica
    assert p.leader.maximal_isr == (1, 2) and c.partition().isr == (1, 2)


def test_a_retry_of_an_applied_change_waits_for_the_metadata_and_then_adopts_it():
    c, p, log = setup()
    p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=0), log, 0)
    shrink = p.tick(LAG_MS + 1).alter_partition
    c.send(build_request(1, c.epochs[1], [shrink]))  # applied, but the answer is lost
    p.on_alter_partition_result(shrink, failed([shrink])[TopicIdPartition(shrink.topic_id, 0)], LAG_MS + 2)
    resent = p.tick(LAG_MS + 2 + CONFIG.alter_partition_retry_backoff_ms).alter_partition
    assert resent == shrink
    result, _ = round_trip(c, p, resent, LAG_MS + 50)
    assert result.error == ErrorCode.invalid_update_version
    assert p.leader.isr_state.in_flight and p.leader.maximal_isr == (1, 2, 3)
    p.apply_registration(c.partition(), log, LAG_MS + 60, eligible=eligible_brokers(c.image))
    assert p.leader.isr == (1, 2) and not p.leader.isr_state.in_flight


def test_a_deposed_leader_is_fenced_by_leader_epoch():
    c, p, log = setup()
    p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=0), log, 0)
    shrink = p.tick(LAG_MS + 1).alter_partition
    c.heartbeat(1, want_fence=True)  # leadership moves to 2 (epoch 1)
    assert c.partition().leader == 2
    result, update = round_trip(c, p, shrink, LAG_MS + 2)
    assert result.error == ErrorCode.fenced_leader_epoch and update.alter_partition is None
    assert p.tick(10 * LAG_MS).alter_partition is None, "no resend: the metadata will demote it"
