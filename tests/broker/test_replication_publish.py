"""Publishing a metadata delta of many partitions in slices (`Broker.publish_metadata`).

A broker following the metadata log applies a delta of thousands of
partitions (a topic created, a broker fenced) while its heartbeats and its
metadata fetch must keep running on the same event loop: if they stall past
`broker.session.timeout.ms` the controller fences the broker.
"""

from __future__ import annotations

import datetime

import trio
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from broker import Broker, BrokerConfig
from local_controller import LocalController
from broker.core.replication.partition import Role
from broker_testing import CLUSTER_ID

PARTITIONS = 40


async def _broker(nursery: trio.Nursery, data_dir, controller: LocalController, node_id: int) -> Broker:
    broker = Broker(BrokerConfig(node_id=node_id, log_dirs=(str(data_dir),), cluster_id=CLUSTER_ID, port=0),
                    controller)
    server = await nursery.start(broker.run)
    await broker.publish_metadata(controller.image)
    await controller.register_broker(node_id, "127.0.0.1", server.port)
    return broker


async def _create_topic(controller: LocalController, name: str, replicas: list[list[int]]) -> None:
    response = await controller.send(ct_req.CreateTopicsRequest(
        topics=(ct_req.CreatableTopic(
            name=name, num_partitions=-1, replication_factor=-1, configs=(),
            assignments=tuple(ct_req.CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(r))
                              for i, r in enumerate(replicas))),),
        timeout=datetime.timedelta(seconds=5), validate_only=False))
    assert response.topics[0].error_code == ErrorCode.none, response


async def test_a_big_delta_lets_other_tasks_run_and_ends_like_a_publish_at_once(tmp_path, nursery):
    controller = LocalController(cluster_id=CLUSTER_ID)
    sliced = await _broker(nursery, tmp_path / "sliced", controller, 1)
    at_once = await _broker(nursery, tmp_path / "at-once", controller, 2)
    await sliced.publish_metadata(controller.image)
    at_once.on_metadata_update(controller.image)
    # Broker 1 leads the even partitions and follows broker 2 on the odd ones.
    await _create_topic(controller, "many", [[1, 2] if p % 2 == 0 else [2, 1] for p in range(PARTITIONS)])

    turns = 0
    publishing = True

    async def heartbeat_stand_in() -> None:
        nonlocal turns
        while publishing:
            turns += 1
            await trio.sleep(0)

    nursery.start_soon(heartbeat_stand_in)
    await trio.sleep(0)
    await sliced.publish_metadata(controller.image, slice_s=0)
    publishing = False
    at_once.on_metadata_update(controller.image)

    # Another task ran between the partitions, not only before and after.
    assert turns >= PARTITIONS // 2
    for broker in (sliced, at_once):
        roles = {p: broker.replicas.partitions[("many", p)].state.role for p in range(PARTITIONS)}
        assert roles == {p: Role.LEADER if (p % 2 == 0) == (broker is sliced) else Role.FOLLOWER
                         for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        a = sliced.replicas.partitions[("many", p)].state
        b = at_once.replicas.partitions[("many", p)].state
        assert (a.leader_epoch, a.leader_id, tuple(a.isr)) == (b.leader_epoch, b.leader_id, tuple(b.isr))
    # A leader published in slices takes writes.
    from storage.batch import build_batch

    result, _hp, _end = sliced.replicas.append_to_leader(
        sliced.image, "many", 0, build_batch([(None, b"v", (), 0)]), acks=1, now_ms=0)
    assert result.error_code == ErrorCode.none


async def test_a_delta_that_only_fences_or_unfences_a_broker_reaches_the_leaders_it_does_not_touch(tmp_path, nursery):
    """KIP-841: a fenced broker may not join an ISR, an unfenced one may.
    Fencing or unfencing changes only the brokers' registrations, not the
    partition: the broker must still hand the new set of eligible brokers to
    the leaders the delta did not name (it skips that walk over every hosted
    partition only when the set did not change)."""
    from types import SimpleNamespace

    from quorum.metadata.records import BrokerRegistrationChangeRecord, PartitionChangeRecord

    controller = LocalController(cluster_id=CLUSTER_ID)
    broker = await _broker(nursery, tmp_path / "b1", controller, 1)
    epoch_2 = await controller.register_broker(2, "127.0.0.1", 1)  # only its registration is used
    await _create_topic(controller, "t", [[1, 2]])
    topic_id = controller.image.topic("t").topic_id
    controller.append([PartitionChangeRecord(topic_id, 0, isr=(1,))])  # broker 2 fell out of the ISR
    await broker.publish_metadata(controller.image)
    hp = broker.replicas.partitions[("t", 0)]
    assert hp.state.role is Role.LEADER and tuple(hp.state.isr) == (1,)

    def caught_up_fetch_by_2():
        """Broker 2 fetches at the leader's log end: the ISR change the leader proposes, if any."""
        fp = SimpleNamespace(fetch_offset=hp.log.log_end_offset, last_fetched_epoch=hp.log.latest_epoch,
                             current_leader_epoch=hp.state.leader_epoch)
        return broker.replicas.serve_replica_fetch(hp, 2, fp, broker.clock_ms()).update.alter_partition

    for fenced in (True, False):
        controller.append([BrokerRegistrationChangeRecord(2, epoch_2, fenced=fenced)])
        await broker.publish_metadata(controller.image)
        assert controller.image.partition(topic_id, 0).isr == (1,)  # the delta did not touch the partition
        proposal = caught_up_fetch_by_2()
        if fenced:
            assert proposal is None
        else:
            assert proposal is not None and [m.broker_id for m in proposal.new_isr] == [1, 2]
