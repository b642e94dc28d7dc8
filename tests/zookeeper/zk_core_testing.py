"""Drive the pure ZooKeeper-mode controller core without ZooKeeper.

`CoreHarness` plays the shell: it keeps the znodes the core writes in a dict
(with zkVersions, so conditional writes can lose), answers each decision's
writes, and delivers every request to a `ZkMetadataCache` per broker, so a
test can check what brokers end up believing.
"""

from __future__ import annotations

import uuid

from quorum.metadata.records import Endpoint
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_metadata import ZkMetadataCache
from quorum.zookeeper.context import (
    BrokersChanged,
    ClusterSnapshot,
    CreateZNode,
    Decision,
    DeleteZNode,
    Failover,
    SetZNode,
    TopicConfigsLoaded,
    WriteOutcome,
)
from quorum.zookeeper.decisions import ZkControllerConfig, ZkControllerCore
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment


def broker(b: int, epoch: int | None = None) -> BrokerInfo:
    return BrokerInfo(b, (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + b, 0),), broker_epoch=epoch or 100 + b)


def topic(partitions: dict[int, tuple[int, ...]], n: int = 1) -> TopicAssignment:
    return TopicAssignment(partitions, uuid.UUID(int=n))


class CoreHarness:
    def __init__(self, controller_id: int = 1, epoch: int = 5, unclean: bool = False,
                 configs: dict[str, dict[str, str]] | None = None) -> None:
        self.core = ZkControllerCore(ZkControllerConfig(controller_id, unclean_leader_election_enable=unclean))
        self.epoch = epoch
        #: path -> (data, version): the znodes the core wrote or the test planted
        self.znodes: dict[str, tuple[bytes, int]] = {}
        self.caches: dict[int, ZkMetadataCache] = {}
        self.sent: list = []
        self.configs = configs or {}
        self.config_reads: list[frozenset[str]] = []
        self.resigned = False

    def state(self, topic_name: str, p: int) -> PartitionState:
        data, version = self.znodes[z.partition_state_path(topic_name, p)]
        return z.decode_partition_state(topic_name, p, data, version)

    def plant_state(self, tp: NamedPartition, s: PartitionState) -> PartitionState:
        path = z.partition_state_path(*tp)
        version = self.znodes[path][1] + 1 if path in self.znodes else 0
        self.znodes[path] = (z.encode_partition_state(s), version)
        return PartitionState(s.leader, s.leader_epoch, s.isr, s.controller_epoch, version)

    def failover(self, brokers, topics, states=None, **kw) -> None:
        states = {tp: self.plant_state(tp, s) for tp, s in (states or {}).items()}
        for b in brokers:
            self.caches.setdefault(b, ZkMetadataCache(b))
            self.caches[b].broker_epoch = brokers[b].broker_epoch
        self.run(Failover(ClusterSnapshot(self.epoch, 0, brokers, topics, states, **kw)))

    def brokers_changed(self, brokers) -> None:
        for b in brokers:
            self.caches.setdefault(b, ZkMetadataCache(b))
            self.caches[b].broker_epoch = brokers[b].broker_epoch
        self.run(BrokersChanged(brokers))

    def run(self, event, conflicts=None) -> None:
        """Handle `event` to the end; `conflicts` maps a partition to a state that beats our first write."""
        conflicts = dict(conflicts or {})
        decision = self.core.handle(event)
        while True:
            self._take(decision)
            if decision.resign:
                self.resigned = True
                return
            if not decision.writes:
                break
            outcomes = []
            for t in decision.writes:
                if t.partition in conflicts:
                    fresh = self.plant_state(t.partition, conflicts.pop(t.partition))
                    outcomes.append(WriteOutcome(t, ok=False, fresh=fresh))
                else:
                    outcomes.append(self._apply(t))
            decision = self.core.writes_applied(outcomes)
        reads = set().union(*self.config_reads) if self.config_reads else set()
        self.config_reads.clear()
        if reads:
            self.run(TopicConfigsLoaded({t: self.configs.get(t, {}) for t in sorted(reads)}))

    def _take(self, decision: Decision) -> None:
        if decision.read_topic_configs:
            self.config_reads.append(decision.read_topic_configs)
        for r in decision.requests:
            self.sent.append(r)
            if r.broker_id in self.caches:
                self.caches[r.broker_id].handle(r.request)

    def _apply(self, t) -> WriteOutcome:
        for op in t.ops:
            if isinstance(op, CreateZNode):
                if op.path in self.znodes:
                    data, version = self.znodes[op.path]
                    return WriteOutcome(t, False, z.decode_partition_state(*t.partition, data, version))
                self.znodes[op.path] = (op.data, 0)
            elif isinstance(op, SetZNode):
                data, version = self.znodes[op.path]
                if version != op.version:
                    return WriteOutcome(t, False, z.decode_partition_state(*t.partition, data, version))
                self.znodes[op.path] = (op.data, version + 1)
            else:
                assert isinstance(op, DeleteZNode)
                self.znodes.pop(op.path, None)
        return WriteOutcome(t, ok=True)

    def requests_to(self, b: int, kind: type) -> list:
        return [r.request for r in self.sent if r.broker_id == b and isinstance(r.request, kind)]

    def leader_seen_by(self, b: int, topic_name: str, p: int) -> int:
        image = self.caches[b].image
        topic_image = image.topic(topic_name)
        return topic_image.partitions[p].leader
