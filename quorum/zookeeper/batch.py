"""Collecting the controller's requests to brokers (Kafka's `ControllerBrokerRequestBatch`).

Theory of operation
-------------------
While the core handles one event it notes, per broker, which partitions
need a LeaderAndIsr, which an UpdateMetadata, and which replicas a
StopReplica. `build()` turns the notes into at most one request of each
kind per live broker, in Kafka's order: LeaderAndIsr, then UpdateMetadata,
then StopReplica. The partition states in them are read from the context
at `build()` time, i.e. after ZooKeeper confirmed the writes.

Every UpdateMetadata lists all live brokers (a broker's metadata cache
replaces its broker list with it), even when it carries no partitions.
A partition of a topic being deleted is sent with leader -2 (Kafka's
`LeaderDuringDelete`), which tells the broker to forget the topic. Requests
carry the receiving broker's epoch (the czxid of its registration znode),
so a broker that re-registered since refuses requests meant for its
previous life.
"""

from __future__ import annotations

from collections.abc import Iterable

from quorum.zookeeper import messages as m
from quorum.zookeeper.context import BrokerRequest, ControllerContext
from quorum.zookeeper.znodes import LEADER_DURING_DELETE, BrokerInfo, NamedPartition, PartitionState


def _endpoint_for(info: BrokerInfo, listener: str):
    return info.endpoint(listener) or (info.endpoints[0] if info.endpoints else None)


class RequestBatch:
    def __init__(self, ctx: ControllerContext, inter_broker_listener: str) -> None:
        self._ctx = ctx
        self._listener = inter_broker_listener
        self._leader_and_isr: dict[int, dict[NamedPartition, bool]] = {}
        self._full_leader_and_isr: set[int] = set()
        self._update_metadata: dict[int, set[NamedPartition]] = {}
        self._stop_replica: dict[int, dict[NamedPartition, tuple[int, bool]]] = {}
        #: partitions of deleted topics: (topic id, replicas, last state), captured before removal
        self._deleted: dict[NamedPartition, tuple] = {}

    @property
    def empty(self) -> bool:
        return not (self._leader_and_isr or self._update_metadata or self._stop_replica)

    def leader_and_isr(self, broker_ids: Iterable[int], tp: NamedPartition, *, is_new: bool = False) -> None:
        for b in broker_ids:
            entries = self._leader_and_isr.setdefault(b, {})
            entries[tp] = entries.get(tp, False) or is_new

    def full_leader_and_isr(self, broker_id: int) -> None:
        """A LeaderAndIsr with every partition `broker_id` hosts (failover, broker start-up)."""
        self._full_leader_and_isr.add(broker_id)
        for tp in self._ctx.partitions_on((broker_id,)):
            if tp in self._ctx.states:
                self.leader_and_isr((broker_id,), tp)

    def update_metadata(self, broker_ids: Iterable[int], tps: Iterable[NamedPartition] = ()) -> None:
        tps = list(tps)
        for b in broker_ids:
            self._update_metadata.setdefault(b, set()).update(tps)

    def topic_deleted(self, topic: str) -> None:
        """Capture a topic's partitions before the context forgets it: UpdateMetadata with leader -2
        to every live broker, StopReplica(delete) to every live replica."""
        ctx = self._ctx
        assignment = ctx.topics[topic]
        for p, replicas in sorted(assignment.partitions.items()):
            tp = NamedPartition(topic, p)
            state = ctx.states.get(tp)
            self._deleted[tp] = (ctx.topic_id(topic), replicas, state)
            self.update_metadata(ctx.live_brokers, (tp,))
            for b in replicas:
                if ctx.is_live(b):
                    # -2: delete whatever the leader epoch (KIP-570's EpochDuringDelete).
                    self._stop_replica.setdefault(b, {})[tp] = (-2, True)

    def build(self) -> tuple[BrokerRequest, ...]:
        ctx = self._ctx
        out: list[BrokerRequest] = []
        targets = sorted(set(self._leader_and_isr) | set(self._update_metadata) | set(self._stop_replica))
        live_brokers = self._live_brokers()
        for b in targets:
            info = ctx.live_brokers.get(b)
            if info is None:
                continue
            if b in self._leader_and_isr:
                out.append(BrokerRequest(b, self._build_leader_and_isr(b, info)))
            if b in self._update_metadata:
                out.append(BrokerRequest(b, self._build_update_metadata(info, live_brokers)))
            if b in self._stop_replica:
                out.append(BrokerRequest(b, self._build_stop_replica(b, info)))
        return tuple(out)

    # --- request building ---------------------------------------------------------

    def _build_leader_and_isr(self, b: int, info: BrokerInfo) -> m.LeaderAndIsrRequest:
        ctx = self._ctx
        by_topic: dict[str, list[m.LeaderAndIsrPartitionState]] = {}
        leaders: set[int] = set()
        for tp, is_new in sorted(self._leader_and_isr[b].items()):
            state = ctx.states.get(tp)
            if state is None or tp.topic not in ctx.topics:
                continue
            assignment = ctx.topics[tp.topic]
            by_topic.setdefault(tp.topic, []).append(m.LeaderAndIsrPartitionState(
                partition_index=tp.partition, controller_epoch=state.controller_epoch, leader=state.leader,
                leader_epoch=state.leader_epoch, isr=state.isr, partition_epoch=state.zk_version,
                replicas=ctx.replicas(tp), adding_replicas=assignment.adding_replicas.get(tp.partition, ()),
                removing_replicas=assignment.removing_replicas.get(tp.partition, ()), is_new=is_new,
                leader_recovery_state=state.leader_recovery_state))
            if ctx.is_live(state.leader):
                leaders.add(state.leader)
        live_leaders = []
        for leader in sorted(leaders):
            e = _endpoint_for(ctx.live_brokers[leader], self._listener)
            if e is not None:
                live_leaders.append(m.LeaderAndIsrLiveLeader(broker_id=leader, host_name=e.host, port=e.port))
        return m.LeaderAndIsrRequest(
            controller_id=ctx.controller_id, controller_epoch=ctx.epoch, broker_epoch=info.broker_epoch,
            type=m.LEADER_AND_ISR_FULL if b in self._full_leader_and_isr else m.LEADER_AND_ISR_INCREMENTAL,
            topic_states=tuple(m.LeaderAndIsrTopicState(topic_name=t, topic_id=ctx.topic_id(t),
                                                        partition_states=tuple(ps))
                               for t, ps in by_topic.items()),
            live_leaders=tuple(live_leaders))

    def _umr_state(self, tp: NamedPartition) -> tuple | None:
        ctx = self._ctx
        if tp in self._deleted:
            topic_id, replicas, state = self._deleted[tp]
            base = state or PartitionState(-1, 0, replicas, ctx.epoch)
            return topic_id, replicas, PartitionState(LEADER_DURING_DELETE, base.leader_epoch, base.isr,
                                                      base.controller_epoch, base.zk_version)
        state = ctx.states.get(tp)
        if state is None or tp.topic not in ctx.topics:
            return None
        return ctx.topic_id(tp.topic), ctx.replicas(tp), state

    def _build_update_metadata(self, info: BrokerInfo, live_brokers) -> m.UpdateMetadataRequest:
        ctx = self._ctx
        by_topic: dict[str, tuple] = {}
        for tp in sorted(self._update_metadata[info.broker_id]):
            found = self._umr_state(tp)
            if found is None:
                continue
            topic_id, replicas, state = found
            by_topic.setdefault(tp.topic, (topic_id, []))[1].append(m.UpdateMetadataPartitionState(
                partition_index=tp.partition, controller_epoch=state.controller_epoch, leader=state.leader,
                leader_epoch=state.leader_epoch, isr=state.isr, zk_version=state.zk_version, replicas=replicas,
                offline_replicas=tuple(r for r in replicas if not ctx.is_live(r))))
        return m.UpdateMetadataRequest(
            controller_id=ctx.controller_id, controller_epoch=ctx.epoch, broker_epoch=info.broker_epoch,
            topic_states=tuple(m.UpdateMetadataTopicState(topic_name=t, topic_id=tid, partition_states=tuple(ps))
                               for t, (tid, ps) in by_topic.items()),
            live_brokers=live_brokers)

    def _live_brokers(self) -> tuple[m.UpdateMetadataBroker, ...]:
        return tuple(
            m.UpdateMetadataBroker(id=b.broker_id, rack=b.rack, endpoints=tuple(
                m.UpdateMetadataEndpoint(port=e.port, host=e.host, listener=e.name,
                                         security_protocol=e.security_protocol) for e in b.endpoints))
            for _, b in sorted(self._ctx.live_brokers.items()))

    def _build_stop_replica(self, b: int, info: BrokerInfo) -> m.StopReplicaRequest:
        by_topic: dict[str, list[m.StopReplicaPartitionState]] = {}
        for tp, (leader_epoch, delete) in sorted(self._stop_replica[b].items()):
            by_topic.setdefault(tp.topic, []).append(m.StopReplicaPartitionState(
                partition_index=tp.partition, leader_epoch=leader_epoch, delete_partition=delete))
        return m.StopReplicaRequest(
            controller_id=self._ctx.controller_id, controller_epoch=self._ctx.epoch, broker_epoch=info.broker_epoch,
            topic_states=tuple(m.StopReplicaTopicState(topic_name=t, partition_states=tuple(ps))
                               for t, ps in by_topic.items()))
