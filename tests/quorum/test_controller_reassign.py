"""Partition reassignment in the controller (KIP-455): AlterPartitionReassignments,
ListPartitionReassignments, completion on AlterPartition, cancel, and what brokers see."""

from controller_testing import Cluster
from kio.schema.alter_partition_reassignments.v0 import request as apr_req
from kio.schema.errors import ErrorCode
from kio.schema.list_partition_reassignments.v0 import request as lpr_req

from quorum.metadata.delta import image_delta


def reassign(c: Cluster, moves: dict[tuple[str, int], list[int] | None]):
    by_topic: dict[str, list] = {}
    for (name, index), replicas in moves.items():
        by_topic.setdefault(name, []).append(apr_req.ReassignablePartition(
            partition_index=index, replicas=None if replicas is None else tuple(replicas)))
    response = c.send(apr_req.AlterPartitionReassignmentsRequest(topics=tuple(
        apr_req.ReassignableTopic(name=name, partitions=tuple(ps)) for name, ps in by_topic.items())))
    assert response.error_code == ErrorCode.none
    return {(t.name, p.partition_index): p.error_code for t in response.responses for p in t.partitions}


def listed(c: Cluster, topics: dict[str, list[int]] | None = None):
    request = lpr_req.ListPartitionReassignmentsRequest(topics=None if topics is None else tuple(
        lpr_req.ListPartitionReassignmentsTopics(name=n, partition_indexes=tuple(ps)) for n, ps in topics.items()))
    response = c.send(request)
    assert response.error_code == ErrorCode.none
    return {(t.name, p.partition_index): (p.replicas, p.adding_replicas, p.removing_replicas)
            for t in response.topics for p in t.partitions}


def started(n: int = 4) -> Cluster:
    c = Cluster()
    c.start_brokers(*range(1, n + 1))
    return c


def test_a_move_adds_the_new_replicas_first_and_switches_once_they_are_in_sync():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    before = c.image
    assert reassign(c, {("t", 0): [2, 3]}) == {("t", 0): ErrorCode.none}
    p = c.partition("t")
    # Target first (its first broker is the preferred leader), then the ones leaving.
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.isr, p.leader) == ((2, 3, 1), (3,), (1,), (1, 2), 1)
    assert listed(c) == {("t", 0): ((2, 3, 1), (3,), (1,))}
    # Broker 3 becomes a follower (it creates the log and fetches); 1 still leads.
    delta3 = image_delta(before, c.image, 3)
    assert [(f.topic_name, f.partition, f.leader_id) for f in delta3.followers] == [("t", 0, 1)]
    # The leader adds 3 to the ISR once it caught up: the reassignment completes.
    mid = c.image
    response = c.alter_isr("t", 0, [1, 2, 3])
    assert response.topics[0].partitions[0].error_code == ErrorCode.none
    p = c.partition("t")
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.isr) == ((2, 3), (), (), (2, 3))
    assert p.leader == 2  # the old leader was removed: the first target replica in sync leads
    assert listed(c) == {}
    # Broker 1 stops its replica and deletes the log; 3 now follows 2.
    stopped = image_delta(mid, c.image, 1).stopped
    assert [(s.topic_name, s.partition, s.delete) for s in stopped] == [("t", 0, True)]
    assert [f.leader_id for f in image_delta(mid, c.image, 3).followers] == [2]


def test_the_leader_stays_when_it_is_in_the_target_and_the_leader_epoch_is_bumped():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    reassign(c, {("t", 0): [1, 3]})
    epoch = c.partition("t").leader_epoch
    c.alter_isr("t", 0, [1, 2, 3])
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((1, 3), (1, 3), 1)
    # Broker 2's fetches at the old epoch are fenced.
    assert p.leader_epoch == epoch + 1


def test_an_isr_expansion_that_leaves_an_adding_replica_out_does_not_complete():
    c = started()
    c.create_topic("t", assignments={0: [1]})
    reassign(c, {("t", 0): [2, 3]})
    c.alter_isr("t", 0, [1, 2])
    p = c.partition("t")
    assert (p.replicas, p.adding_replicas, p.isr) == ((2, 3, 1), (2, 3), (1, 2))
    c.alter_isr("t", 0, [1, 2, 3])
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.adding_replicas) == ((2, 3), (2, 3), 2, ())


def test_shrinking_the_replica_set_completes_at_once():
    c = started()
    c.create_topic("t", assignments={0: [1, 2, 3]})
    assert reassign(c, {("t", 0): [2, 3]}) == {("t", 0): ErrorCode.none}
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.removing_replicas) == ((2, 3), (2, 3), 2, ())


def test_reordering_the_replicas_changes_the_preferred_leader_only():
    c = started()
    c.create_topic("t", assignments={0: [1, 2, 3]})
    reassign(c, {("t", 0): [3, 1, 2]})
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((3, 1, 2), (1, 2, 3), 1)


def test_cancel_goes_back_to_the_original_replicas():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    reassign(c, {("t", 0): [3, 4]})
    c.alter_isr("t", 0, [1, 2, 3])  # 3 caught up, 4 not yet
    assert reassign(c, {("t", 0): None}) == {("t", 0): ErrorCode.none}
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == ((1, 2), (1, 2), 1, (), ())
    assert listed(c) == {}
    assert reassign(c, {("t", 0): None}) == {("t", 0): ErrorCode.no_reassignment_in_progress}


def test_a_new_target_replaces_the_one_under_way_from_the_original_replicas():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    reassign(c, {("t", 0): [3, 4]})
    reassign(c, {("t", 0): [1, 4]})
    p = c.partition("t")
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ((1, 4, 2), (4,), (2,))
    # Asking for the original replicas again cancels.
    reassign(c, {("t", 0): [1, 2]})
    p = c.partition("t")
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ((1, 2), (), ())


def test_reassigning_to_the_current_replicas_changes_nothing():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    offset = c.image.offset
    assert reassign(c, {("t", 0): [1, 2]}) == {("t", 0): ErrorCode.none}
    assert c.image.offset == offset


def test_invalid_reassignments_are_refused_per_partition():
    c = started(3)
    c.create_topic("t", assignments={0: [1, 2], 1: [2, 3]})
    offset = c.image.offset
    codes = reassign(c, {("t", 0): [], ("t", 1): [1, 1], ("t", 7): [1], ("nope", 0): [1]})
    assert codes == {("t", 0): ErrorCode.invalid_replica_assignment, ("t", 1): ErrorCode.invalid_replica_assignment,
                     ("t", 7): ErrorCode.unknown_topic_or_partition, ("nope", 0): ErrorCode.unknown_topic_or_partition}
    assert reassign(c, {("t", 0): [1, 9]}) == {("t", 0): ErrorCode.invalid_replica_assignment}
    assert c.image.offset == offset


def test_list_filters_by_topic_and_partition():
    c = started()
    c.create_topic("a", assignments={0: [1, 2], 1: [1, 2]})
    c.create_topic("b", assignments={0: [1, 2]})
    reassign(c, {("a", 0): [3, 4], ("a", 1): [1, 3], ("b", 0): [2, 3]})
    assert set(listed(c)) == {("a", 0), ("a", 1), ("b", 0)}
    assert set(listed(c, {"a": [1, 5]})) == {("a", 1)}
    assert set(listed(c, {"b": [], "missing": [0]})) == set()


def test_a_fenced_leader_during_a_reassignment_hands_over_to_an_original_isr_member():
    c = started()
    c.create_topic("t", assignments={0: [1, 2]})
    reassign(c, {("t", 0): [3, 4]})
    c.now_ms = 19_000
    for b in (2, 3, 4):
        c.heartbeat(b)
    c.tick(20_000)  # broker 1 fenced
    p = c.partition("t")
    assert (p.leader, p.isr, p.adding_replicas) == (2, (2,), (3, 4))
    c.alter_isr("t", 0, [2, 3, 4])
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader) == ((3, 4), (3, 4), 3)


def test_an_unclean_election_onto_the_only_target_replica_finishes_the_move():
    # Found by test_controller_reassign_model: the fence elected the adding
    # replica (unclean, ISR = [it]), and the move was left half done.
    c = started(2)
    c.create_topic("t", assignments={0: [1]}, configs={"unclean.leader.election.enable": "true"})
    assert reassign(c, {("t", 0): [2]}) == {("t", 0): ErrorCode.none}
    assert c.partition("t").adding_replicas == (2,)
    c.now_ms = 19_000
    c.heartbeat(2)
    c.tick(20_000)  # broker 1 fenced: 2 is elected uncleanly
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == ((2,), (2,), 2, (), ())


def test_a_move_that_waits_for_its_only_in_sync_target_to_return_completes_when_it_does():
    c = started(2)
    c.create_topic("t", assignments={0: [1, 2]})
    c.now_ms = 19_000
    c.heartbeat(1)
    c.tick(20_000)  # broker 2 fenced: ISR [1]
    c.now_ms = 21_000
    c.register(2)
    c.heartbeat(2)
    c.alter_isr("t", 0, [1, 2])
    c.now_ms = 30_000
    c.heartbeat(2)
    c.tick(30_001)  # broker 1 fenced: ISR [2], leader 2
    c.now_ms = 31_000
    c.heartbeat(2, want_fence=True)  # and 2 goes too, staying the last ISR member
    assert (c.partition("t").leader, c.partition("t").isr) == (-1, (2,))
    # Move to [2]: 2 is in sync but not live, so the switch waits (no leader to name).
    assert reassign(c, {("t", 0): [2]}) == {("t", 0): ErrorCode.none}
    p = c.partition("t")
    assert (p.replicas, p.removing_replicas, p.leader) == ((2, 1), (1,), -1)
    c.heartbeat(2)  # unfenced: leads again, and the reassignment finishes
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.removing_replicas) == ((2,), (2,), 2, ())


def test_a_change_that_would_leave_no_in_sync_replica_is_refused():
    c = started()
    c.create_topic("t", assignments={0: [1]})
    reassign(c, {("t", 0): [2, 3]})
    c.alter_isr("t", 0, [1, 2])  # 2 caught up; 3 not yet
    # Broker 1 (the only original) fails: only the added 2 is in sync now.
    c.now_ms = 19_000
    for b in (2, 3, 4):
        c.heartbeat(b)
    c.tick(20_000)
    p = c.partition("t")
    assert (p.leader, p.isr) == (2, (2,))
    # A new target [3, 4] is planned from the original [1]: 2 would leave, no ISR member stays.
    assert reassign(c, {("t", 0): [3, 4]}) == {("t", 0): ErrorCode.invalid_replica_assignment}
    # Cancelling would make 1 -- out of sync -- the only replica: refused, the move goes on.
    assert reassign(c, {("t", 0): None}) == {("t", 0): ErrorCode.invalid_replica_assignment}
    assert c.partition("t") == p
    c.alter_isr("t", 0, [2, 3])
    p = c.partition("t")
    assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == ((2, 3), (2, 3), 2, (), ())
