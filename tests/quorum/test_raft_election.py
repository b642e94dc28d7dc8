"""Elections: role transitions, vote rules, pre-vote, restarts, resignation."""

from __future__ import annotations

import pytest

from quorum.raft import (
    BeginQuorumEpochRequest,
    ElectionState,
    EndQuorumEpochRequest,
    ErrorCode,
    MemoryLog,
    NotLeaderError,
    VoteRequest,
    VoteResponse,
)

from sim.harness import CONFIG, Harness, Node, outbound

VOTERS = (1, 2, 3)


def vote_request(
    candidate: int, epoch: int, last_epoch: int, last_offset: int, *, pre_vote: bool = False
) -> VoteRequest:
    return VoteRequest(
        cluster_id=None,
        voter_id=-1,
        replica_id=candidate,
        replica_epoch=epoch,
        last_offset_epoch=last_epoch,
        last_offset=last_offset,
        pre_vote=pre_vote,
    )


def answer(out, kind=VoteResponse):  # noqa: ANN001, ANN201
    (m,) = outbound(out, kind)
    return m.message


def log_with(epochs: list[int]) -> MemoryLog:
    """A log with one single-record batch per entry of `epochs`, all flushed."""
    log = MemoryLog()
    for epoch in epochs:
        log.append_as_leader([b"r"], epoch)
    log.flush(log.log_end_offset)
    return log


def test_election_timeout_starts_a_pre_vote_that_keeps_the_epoch() -> None:
    node = Node(1, VOTERS)
    assert node.core.role == "Unattached"
    first = node.tick(0)
    assert first.persist_election_state == ElectionState(0, None, None, frozenset(VOTERS)), "the first start"
    out = node.tick(CONFIG.controller_quorum_election_timeout_ms * 2)
    assert node.core.role == "Prospective"
    requests = [m.message for m in outbound(out, VoteRequest)]
    assert sorted(m.voter_id for m in requests) == [2, 3]
    assert all(m.pre_vote and m.replica_epoch == 0 for m in requests)
    assert out.persist_election_state is None, "a pre-vote changes nothing durable"


def test_pre_vote_majority_makes_a_candidate_that_persists_its_vote_before_asking() -> None:
    node = Node(1, VOTERS)
    node.tick(CONFIG.controller_quorum_election_timeout_ms * 2)
    (req, _) = node.take(VoteRequest)
    out = node.handle(2, VoteResponse(error_code=ErrorCode.NONE, leader_id=-1, leader_epoch=0, vote_granted=True),
                      req.correlation, 300)
    assert node.core.role == "Candidate" and node.core.epoch == 1
    assert out.persist_election_state == ElectionState(1, None, 1, frozenset(VOTERS))
    requests = [m.message for m in outbound(out, VoteRequest)]
    assert {m.voter_id for m in requests} == {2, 3}
    assert all(not m.pre_vote and m.replica_epoch == 1 for m in requests)


def test_candidate_with_a_majority_becomes_leader_and_appends_leader_change_in_its_epoch() -> None:
    h = Harness(Node(i, VOTERS, seed=1) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    (first,) = leader.log.batches(0, 1)
    assert first.control and first.epoch == epoch
    assert leader.disk_election == ElectionState(epoch, leader.node_id, leader.node_id, frozenset(VOTERS))
    for other in h.nodes.values():
        if other is not leader:
            assert other.core.role == "Follower" and other.core.leader_and_epoch.leader_id == leader.node_id
    h.advance(50)
    # Raft §5.4.2: the HW moves once the leader's own epoch has a committed record.
    assert all(n.core.high_watermark == 1 for n in h.nodes.values())


@pytest.mark.parametrize(
    ("candidate_last", "granted"),
    [
        ((2, 3), True),  # same last epoch, same end offset
        ((2, 4), True),  # same last epoch, longer
        ((3, 1), True),  # later last epoch beats a longer log
        ((2, 2), False),  # same last epoch, shorter
        ((1, 9), False),  # earlier last epoch loses even when longer (Raft §5.4.1)
    ],
)
def test_vote_goes_only_to_a_candidate_whose_log_is_at_least_as_up_to_date(
    candidate_last: tuple[int, int], granted: bool
) -> None:
    node = Node(1, VOTERS, log=log_with([1, 1, 2]), election=ElectionState(3, None, None, frozenset(VOTERS)))
    out = node.handle(2, vote_request(2, 4, *candidate_last), "c", 0)
    response = answer(out)
    assert response.vote_granted is granted and response.error_code == ErrorCode.NONE
    assert node.core.epoch == 4, "a higher epoch is adopted whatever the vote"
    assert (node.disk_election.voted_id == 2) is granted


def test_one_vote_per_epoch_and_it_survives_a_restart() -> None:
    node = Node(1, VOTERS)
    out = node.handle(2, vote_request(2, 1, 0, 0), "a", 0)
    assert answer(out).vote_granted
    # The vote is in the same Output as the answer: the driver fsyncs it first.
    assert out.persist_election_state == ElectionState(1, None, 2, frozenset(VOTERS))
    assert not answer(node.handle(3, vote_request(3, 1, 0, 0), "b", 1)).vote_granted
    assert answer(node.handle(2, vote_request(2, 1, 0, 0), "a2", 2)).vote_granted, "a retried request"
    node.restart(10)
    assert node.core.role == "Voted"
    assert not answer(node.handle(3, vote_request(3, 1, 0, 0), "b2", 11)).vote_granted


def test_a_stale_candidate_is_fenced_and_told_the_current_epoch() -> None:
    node = Node(1, VOTERS, election=ElectionState(5, 3, None, frozenset(VOTERS)))
    response = answer(node.handle(2, vote_request(2, 4, 0, 0), "c", 0))
    assert response.error_code == ErrorCode.FENCED_LEADER_EPOCH and not response.vote_granted
    assert (response.leader_id, response.leader_epoch) == (3, 5)


def test_a_follower_fetching_from_a_live_leader_rejects_pre_votes_until_the_leader_resigns() -> None:
    h = Harness(Node(i, VOTERS, seed=2) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    follower = next(n for n in h.nodes.values() if n is not leader)
    other = next(n for n in h.nodes.values() if n not in (leader, follower))
    end = other.log.log_end_offset
    pre_vote = vote_request(other.node_id, epoch, epoch, end, pre_vote=True)
    response = answer(follower.handle(other.node_id, pre_vote, "p", h.now_ms))
    assert not response.vote_granted and response.leader_id == leader.node_id
    assert follower.core.role == "Follower"
    # A real vote in the leader's epoch is refused too: it would elect a second leader.
    vote = vote_request(other.node_id, epoch, 0, 0)
    assert not answer(follower.handle(other.node_id, vote, "v", h.now_ms)).vote_granted
    out = follower.handle(
        leader.node_id,
        EndQuorumEpochRequest(cluster_id=None, leader_id=leader.node_id, leader_epoch=epoch,
                              preferred_successors=(other.node_id, follower.node_id)),
        "e",
        h.now_ms,
    )
    assert answer(out, kind=type(out.messages[0].message)).error_code == ErrorCode.NONE
    assert answer(follower.handle(other.node_id, pre_vote, "p2", h.now_ms)).vote_granted


def test_a_pre_vote_is_granted_without_binding_the_voter() -> None:
    node = Node(1, VOTERS)
    node.tick(0)
    out = node.handle(2, vote_request(2, 0, 0, 0, pre_vote=True), "p", 0)
    assert answer(out).vote_granted
    assert out.persist_election_state is None and node.core.role == "Unattached"
    assert answer(node.handle(3, vote_request(3, 1, 0, 0), "v", 1)).vote_granted, "still free to vote"


def test_an_observer_never_votes_and_never_stands() -> None:
    observer = Node(7, VOTERS)
    response = answer(observer.handle(2, vote_request(2, 1, 0, 0), "v", 0))
    assert response.error_code == ErrorCode.INCONSISTENT_VOTER_SET and not response.vote_granted
    for t in range(0, 5000, 50):
        out = observer.tick(t)
        assert not outbound(out, VoteRequest)
        assert out.persist_election_state is None
        assert observer.core.role == "Unattached"


def test_a_restarted_leader_comes_back_resigned_and_hands_over() -> None:
    h = Harness(Node(i, VOTERS, seed=3) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    leader.restart(h.now_ms)
    assert leader.core.role == "Resigned" and leader.core.epoch == epoch
    assert leader.core.leader_and_epoch.leader_id is None
    with pytest.raises(NotLeaderError):
        leader.core.propose([b"x"], h.now_ms)
    out = leader.tick(h.now_ms)
    assert {m.destination_id for m in outbound(out, EndQuorumEpochRequest)} == set(VOTERS) - {leader.node_id}
    h.advance(1000)
    (new_leader,) = h.leaders()
    assert new_leader.core.epoch > epoch
    assert leader.core.role == "Follower"


def test_graceful_resign_lets_the_first_preferred_successor_win() -> None:
    h = Harness(Node(i, VOTERS, seed=4) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    out = leader.obey(leader.core.resign(h.now_ms))
    assert leader.core.role == "Resigned"
    (request, *_) = [m.message for m in outbound(out, EndQuorumEpochRequest)]
    successor = request.preferred_successors[0]
    h.flush_messages()
    for _ in range(CONFIG.controller_quorum_election_timeout_ms):
        if h.leaders():
            break
        h.advance(1)
    (new_leader,) = h.leaders()
    assert new_leader.node_id == successor and new_leader.core.epoch == epoch + 1


def test_a_leader_that_hears_from_no_majority_resigns() -> None:
    h = Harness(Node(i, VOTERS, seed=5) for i in VOTERS)
    leader = h.elect()
    cut = leader.node_id
    h.advance(CONFIG.controller_quorum_fetch_timeout_ms + 1, drop=lambda e: cut in (e.source_id, e.destination_id))
    assert leader.core.role == "Resigned", "check-quorum: a cut-off leader stops answering as leader"
    with pytest.raises(NotLeaderError) as raised:
        leader.core.propose([b"x"], h.now_ms)
    assert raised.value.leader_id is None


def test_begin_quorum_epoch_makes_a_voter_follow_the_new_leader() -> None:
    node = Node(1, VOTERS, election=ElectionState(2, None, None, frozenset(VOTERS)))
    out = node.handle(3, BeginQuorumEpochRequest(cluster_id=None, voter_id=1, leader_id=3, leader_epoch=4), "b", 0)
    assert node.core.role == "Follower" and node.core.leader_and_epoch.leader_id == 3
    assert out.persist_election_state == ElectionState(4, 3, None, frozenset(VOTERS))
    stale = node.handle(2, BeginQuorumEpochRequest(cluster_id=None, voter_id=1, leader_id=2, leader_epoch=3), "s", 1)
    assert stale.messages[0].message.error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert node.core.leader_and_epoch.leader_id == 3


def test_restart_resumes_from_the_persisted_election_state() -> None:
    voters = frozenset(VOTERS)
    cases = {
        ElectionState(3, None, None, voters): "Unattached",
        ElectionState(3, None, 2, voters): "Voted",
        ElectionState(3, None, 1, voters): "Candidate",
        ElectionState(3, 2, 2, voters): "Follower",
        ElectionState(3, 1, 1, voters): "Resigned",
    }
    for election, role in cases.items():
        node = Node(1, VOTERS, election=election)
        assert (node.core.role, node.core.epoch) == (role, 3), election


def test_an_epoch_found_only_in_the_log_is_adopted_without_a_vote() -> None:
    # The records of epoch 4 reached the disk; the quorum-state write did not.
    node = Node(1, VOTERS, log=log_with([1, 4]), election=ElectionState(2, None, 3, frozenset(VOTERS)))
    assert node.core.role == "Unattached" and node.core.epoch == 4
    assert answer(node.handle(2, vote_request(2, 5, 4, 2), "v", 0)).vote_granted


def test_two_voters_standing_at_once_with_the_same_log_elect_the_lower_id_without_a_split_vote() -> None:
    h = Harness(Node(i, VOTERS, seed=4) for i in VOTERS)
    leader = h.elect()
    del h.nodes[leader.node_id]  # killed: nothing reaches it any more
    low, high = sorted(h.nodes.values(), key=lambda n: n.node_id)
    assert low.log.log_end_offset == high.log.log_end_offset
    for node in (low, high):
        node.outputs.clear()
        node.core.become_prospective(h.now_ms)
    for node in (low, high):
        node.tick(h.now_ms)  # both pre-votes are on the wire before either is answered
    h.flush_messages()
    assert low.core.is_leader and low.core.epoch == leader.core.epoch + 1
    assert high.core.leader_and_epoch.leader_id == low.node_id
    assert not any(o.role == "Candidate" for o in high.outputs), "the higher id stood too: a split vote"
