"""The controller model of test_controller_model, plus reassignments and automatic
leader rebalancing: random broker lives, ISR changes, moves, cancels and
rebalance checks, with the reassignment invariants checked after every step."""

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule
from kio.schema.alter_partition_reassignments.v0 import request as apr_req
from kio.schema.errors import ErrorCode

from controller_testing import Cluster
from quorum.controller import ControllerConfig
from quorum.controller.reassignment import original_replicas, reassigning, target_replicas
from test_controller_model import BROKERS, ControllerMachine


class ReassignMachine(ControllerMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(ControllerConfig(leader_imbalance_check_interval_ms=3000))
        #: (topic id, partition) -> the target of the last accepted reassignment.
        self.targets: dict[tuple, tuple[int, ...]] = {}

    def _pick(self, data):
        name = data.draw(st.sampled_from(sorted(self.c.image.topic_ids_by_name)))
        topic = self.c.image.topic(name)
        index = data.draw(st.sampled_from(sorted(topic.partitions)))
        return name, topic, index

    @precondition(lambda self: len(self.c.image.topics_by_id) > 0)
    @rule(data=st.data(), replicas=st.lists(st.sampled_from(BROKERS), min_size=1, max_size=3, unique=True))
    def reassign(self, data, replicas):
        target = tuple(replicas)
        name, topic, index = self._pick(data)
        before = topic.partitions[index]
        error = self._send(name, index, tuple(target))
        registered = all(b in self.c.image.brokers for b in target)
        if not registered:
            assert error == ErrorCode.invalid_replica_assignment
            return
        after = self.c.partition(name, index)
        if error == ErrorCode.none:
            self.targets[(topic.topic_id, index)] = tuple(target)
            assert target_replicas(after) == tuple(target)
            # (As in Kafka, the originals keep their set, not their order: target first.)
            assert set(original_replicas(after)) == set(original_replicas(before)) or not reassigning(after)
        else:
            # Refused only when no in-sync replica would stay.
            assert error == ErrorCode.invalid_replica_assignment
            assert not set(before.isr) & (set(target) | set(original_replicas(before)))
            assert after == before

    @precondition(lambda self: len(self.c.image.topics_by_id) > 0)
    @rule(data=st.data())
    def cancel(self, data):
        name, topic, index = self._pick(data)
        before = topic.partitions[index]
        error = self._send(name, index, None)
        after = self.c.partition(name, index)
        if not reassigning(before):
            assert error == ErrorCode.no_reassignment_in_progress
        elif error == ErrorCode.none:
            self.targets.pop((topic.topic_id, index), None)
            assert set(after.replicas) == set(original_replicas(before)) and not reassigning(after)
        else:
            assert not set(before.isr) & set(original_replicas(before))

    def _send(self, name, index, replicas):
        r = self.c.send(apr_req.AlterPartitionReassignmentsRequest(topics=(apr_req.ReassignableTopic(
            name=name, partitions=(apr_req.ReassignablePartition(partition_index=index, replicas=replicas),)),)))
        return r.responses[0].partitions[0].error_code

    @precondition(lambda self: len(self.c.image.topics_by_id) > 0)
    @rule(data=st.data())
    def leader_changes_isr(self, data):
        name, topic, index = self._pick(data)
        p = topic.partitions[index]
        if p.leader == -1 or p.leader not in self.alive:
            return
        isr = [p.leader] + [b for b in p.replicas if b != p.leader and data.draw(st.booleans())]
        r = self.c.alter_isr(name, index, isr)
        error = r.topics[0].partitions[0].error_code if r.topics else r.error_code
        eligible = all(self.c.image.is_usable(b) for b in isr)
        assert error == (ErrorCode.none if eligible else ErrorCode.ineligible_replica), (error, isr)
        after = self.c.partition(name, index)
        if eligible and reassigning(p) and set(p.adding_replicas) <= set(isr):
            # Every added replica in sync: the move is complete.
            assert after.replicas == target_replicas(p) and not reassigning(after)
            assert after.isr == tuple(b for b in isr if b in after.replicas)
        elif eligible:
            assert after.isr == tuple(isr)

    @invariant()
    def reassignment_state_is_consistent(self):
        for topic in self.c.image.topics_by_id.values():
            for index, p in topic.partitions.items():
                adding, removing = set(p.adding_replicas), set(p.removing_replicas)
                assert adding <= set(p.replicas) and removing <= set(p.replicas) and not adding & removing, p
                assert len(set(p.replicas)) == len(p.replicas), p
                assert target_replicas(p) and original_replicas(p), p
                # The replica list is the target first, then the replicas leaving.
                assert p.replicas == target_replicas(p) + p.removing_replicas, p
                target = self.targets.get((topic.topic_id, index))
                if target is not None and not reassigning(p):
                    assert p.replicas == target, (p, target)


TestReassignModel = ReassignMachine.TestCase
