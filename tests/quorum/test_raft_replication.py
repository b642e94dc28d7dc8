"""Replication: Fetch, truncation on divergence, the snapshot path, the high
watermark, long polls, observers, and the status view."""

from __future__ import annotations

import dataclasses

import pytest

from quorum.raft import (
    DivergingEpoch,
    ElectionState,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Inbound,
    MemoryLog,
    NotLeaderError,
    RaftUsageError,
)

from sim.harness import CONFIG, Envelope, Harness, Node, Token, outbound

VOTERS = (1, 2, 3)


def log_with(epochs: list[int]) -> MemoryLog:
    log = MemoryLog()
    for i, epoch in enumerate(epochs):
        log.append_as_leader([b"r%d-e%d" % (i, epoch)], epoch)
    log.flush(log.log_end_offset)
    return log


def records_of(log: MemoryLog) -> list[tuple[int, int, bool, bytes]]:
    return [(b.base_offset, b.epoch, b.control, r) for b in log.batches() for r in b.records]


def fetch(replica_id: int, epoch: int, offset: int, last_epoch: int, *, max_wait_ms: int = 0) -> FetchRequest:
    return FetchRequest(
        cluster_id=None,
        replica_id=replica_id,
        current_leader_epoch=epoch,
        fetch_offset=offset,
        last_fetched_epoch=last_epoch,
        log_start_offset=0,
        max_bytes=1 << 20,
        max_wait_ms=max_wait_ms,
    )


def fetch_responses(node: Node) -> list[FetchResponse]:
    return [m.message for out in node.outputs for m in outbound(out, FetchResponse)]


def test_a_diverged_follower_truncates_to_the_diverging_epoch_end_and_converges() -> None:
    election = ElectionState(3, None, None, frozenset(VOTERS))
    h = Harness(
        [
            Node(1, VOTERS, log=log_with([1, 1, 1, 3, 3]), election=election, seed=1),
            Node(2, VOTERS, log=log_with([1, 1, 1, 2, 2, 2]), election=election, seed=1),
            Node(3, VOTERS, log=log_with([1, 1, 1, 3, 3]), election=election, seed=1),
        ]
    )
    leader = h.elect()
    assert leader.node_id != 2, "a log ending in epoch 2 is behind one ending in epoch 3"
    h.advance(20)
    diverging = [r.diverging_epoch for r in fetch_responses(leader) if r.diverging_epoch]
    assert diverging and diverging[0] == DivergingEpoch(epoch=1, end_offset=3)
    assert records_of(h[2].log) == records_of(leader.log)
    # The epoch-2 tail was never committed; the epoch-3 records now are.
    assert h[2].core.high_watermark == leader.core.high_watermark == leader.log.log_end_offset


def test_a_fetcher_below_the_log_start_loads_the_snapshot_in_chunks_then_fetches_on() -> None:
    config = dataclasses.replace(CONFIG, fetch_snapshot_max_bytes=7)
    h = Harness(Node(i, VOTERS, seed=2, config=config) for i in VOTERS)
    leader = h.elect()
    late = next(n for n in h.nodes.values() if n is not leader)
    cut = late.node_id
    for i in range(5):
        leader.propose([b"rec%d" % i], h.now_ms)
        h.advance(2, drop=lambda e: cut in (e.source_id, e.destination_id))
    hw = leader.core.high_watermark
    assert hw == leader.log.log_end_offset
    snapshot_id, out = leader.core.create_snapshot(hw, b"state-machine-image-at-%d" % hw, h.now_ms)
    leader.obey(out)
    assert leader.log.log_start_offset == hw and late.log.log_end_offset < hw
    leader.propose([b"after-snapshot"], h.now_ms)
    h.advance(CONFIG.controller_quorum_fetch_timeout_ms * 3)
    assert snapshot_id in [o.snapshot_installed for o in late.outputs]
    assert late.log.snapshot_data(snapshot_id) == b"state-machine-image-at-%d" % hw
    chunks = [m for out in leader.outputs for m in outbound(out, FetchSnapshotResponse)]
    assert len(chunks) >= 4, "the snapshot came in chunks of at most 7 bytes"
    assert late.log.log_start_offset == hw
    assert records_of(late.log) == records_of(leader.log)
    assert late.core.high_watermark == leader.core.high_watermark


def test_the_hw_moves_only_through_a_record_of_the_leaders_epoch() -> None:
    """Raft §5.4.2: old-epoch records on a majority are not yet committed."""
    config = dataclasses.replace(CONFIG, fetch_max_bytes=1)  # one batch per Fetch answer
    election = ElectionState(1, None, None, frozenset(VOTERS))
    h = Harness(
        [
            Node(1, VOTERS, log=log_with([1, 1, 1]), election=election, config=config, seed=3),
            Node(2, VOTERS, log=log_with([1, 1, 1]), election=election, config=config, seed=3),
            Node(3, VOTERS, log=log_with([1]), election=election, config=config, seed=3),
        ]
    )
    leader = h.elect(max_ms=5000)
    assert leader.node_id in (1, 2), "node 3's log is behind"
    h.advance(40)
    other = h[3 - leader.node_id]
    fetched = [m.message.fetch_offset for o in other.outputs for m in outbound(o, FetchRequest)]
    assert 3 in fetched, "the other up-to-date voter claimed offset 3 (all of epoch 1) first"
    # Offsets 0..2 are epoch 1 and on a majority (nodes 1 and 2) from the
    # start; offset 3 is the new leader's LeaderChange record.
    hws = [o.high_watermark for o in leader.outputs]
    assert hws[0] is None and 3 not in hws
    assert hws[-1] == 4


def test_a_leader_counts_its_own_log_only_up_to_what_is_flushed() -> None:
    node = Node(1, (1,))
    node.tick(CONFIG.controller_quorum_election_timeout_ms * 2)
    assert node.core.is_leader and node.core.high_watermark == 1
    result, out = node.core.propose([b"a", b"b"], 500)
    assert (result.base_offset, result.last_offset) == (1, 2)
    assert out.flush_log_to_offset == 3 and out.high_watermark == 1
    assert node.core.tick(501).high_watermark == 1, "not flushed yet"
    node.log.flush(3)
    assert node.core.tick(502).high_watermark == 3


def test_a_follower_flushes_before_its_next_fetch_claims_the_records() -> None:
    h = Harness(Node(i, VOTERS, seed=4) for i in VOTERS)
    leader = h.elect()
    follower = next(n for n in h.nodes.values() if n is not leader)
    follower.outputs.clear()
    leader.propose([b"x" * 10], h.now_ms)
    h.advance(5)
    appended = [o for o in follower.outputs if o.flush_log_to_offset is not None]
    assert appended
    for out in appended:
        (request,) = [m.message for m in outbound(out, FetchRequest)]
        assert request.fetch_offset == out.flush_log_to_offset


def test_a_follower_learns_the_hw_bounded_by_its_own_log() -> None:
    follower = Node(2, VOTERS, election=ElectionState(1, 1, None, frozenset(VOTERS)))
    (request,) = [m for m in follower.tick(0).messages if isinstance(m.message, FetchRequest)]
    leader_log = log_with([1, 1, 1, 1])
    response = FetchResponse(
        error_code=ErrorCode.NONE,
        leader_id=1,
        leader_epoch=1,
        high_watermark=4,
        log_start_offset=0,
        records=leader_log.read(0, 1 << 20, max_offset=2),
    )
    out = follower.handle(1, response, request.correlation, 1)
    assert follower.log.log_end_offset == 2
    assert out.high_watermark == 2


def test_an_empty_fetch_is_parked_until_records_arrive_or_max_wait_passes() -> None:
    h = Harness(Node(i, VOTERS, seed=5) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    end = leader.log.log_end_offset
    now = h.now_ms
    voter = next(i for i in VOTERS if i != leader.node_id)
    # The voter already knows the HW (it fetched during the election).
    out = leader.handle(voter, fetch(voter, epoch, end, epoch, max_wait_ms=100), "parked", now)
    assert not [m for m in outbound(out, FetchResponse) if m.correlation.correlation == "parked"], "parked"
    leader.propose([b"news"], now + 1)
    (answer,) = [m for m in leader.take(FetchResponse) if m.correlation == "parked"]
    assert answer.message.records and answer.message.error_code == ErrorCode.NONE
    end = leader.log.log_end_offset
    # This fetch commits "news": the HW moves, so it is answered at once.
    leader.handle(voter, fetch(voter, epoch, end, epoch, max_wait_ms=100), "commits", now + 2)
    (committed,) = [m for m in leader.take(FetchResponse) if m.correlation == "commits"]
    assert committed.message.high_watermark == end
    leader.handle(voter, fetch(voter, epoch, end, epoch, max_wait_ms=100), "idle", now + 3)
    leader.tick(now + 102)
    assert not [m for m in leader.take(FetchResponse) if m.correlation == "idle"]
    leader.tick(now + 103)
    (timed_out,) = [m for m in leader.take(FetchResponse) if m.correlation == "idle"]
    assert timed_out.message.records == b"" and timed_out.message.high_watermark == end


def test_observers_get_only_committed_records_and_do_not_count_for_the_hw() -> None:
    nodes = [Node(i, VOTERS, seed=6) for i in VOTERS] + [Node(7, VOTERS, seed=6)]
    h = Harness(nodes)
    leader = h.elect()
    h.advance(50)
    observer = h[7]
    assert observer.core.role == "Follower" and observer.core.leader_and_epoch.leader_id == leader.node_id
    hw = leader.core.high_watermark
    assert observer.log.log_end_offset == hw
    followers = [n.node_id for n in h.nodes.values() if n.core.is_voter and n is not leader]
    leader.propose([b"uncommitted"], h.now_ms)
    h.advance(30, drop=lambda e: e.source_id in followers or e.destination_id in followers)
    assert leader.core.high_watermark == hw, "an observer's fetch does not commit anything"
    assert observer.log.log_end_offset == hw, "an observer never holds uncommitted records"
    h.advance(30)
    assert leader.core.high_watermark == leader.log.log_end_offset == observer.log.log_end_offset


def test_an_observer_flushes_its_log_at_most_once_a_second_where_a_voter_flushes_every_fetch() -> None:
    """Kafka's observers do not fsync what they fetch (a broker's copy of the
    metadata log counts toward no commit); a voter flushes before its next
    Fetch tells the leader its offset."""
    nodes = [Node(i, VOTERS, seed=6) for i in VOTERS] + [Node(7, VOTERS, seed=6)]
    h = Harness(nodes)
    leader = h.elect()
    h.advance(50)
    observer = h[7]
    voter = next(n for n in h.nodes.values() if n.core.is_voter and n is not leader)
    observer.outputs.clear()
    voter.outputs.clear()
    lagged = False
    for _ in range(20):  # 2 s, a record every 100 ms
        leader.propose([b"x"], h.now_ms)
        h.advance(100)
        assert voter.log.flushed_offset == voter.log.log_end_offset
        lagged |= observer.log.flushed_offset < observer.log.log_end_offset
    assert observer.log.log_end_offset == voter.log.log_end_offset == leader.core.high_watermark
    flushes = {n.node_id: sum(out.flush_log_to_offset is not None for out in n.outputs) for n in (voter, observer)}
    assert flushes[voter.node_id] >= 20, flushes
    assert 1 <= flushes[observer.node_id] <= 3, flushes
    assert lagged, "the observer's fetched records waited for its next flush"
    # What it had not flushed is lost with a crash, and fetched again.
    for _ in range(20):
        if observer.log.flushed_offset < observer.log.log_end_offset:
            break
        leader.propose([b"y"], h.now_ms)
        h.advance(100)
    flushed = observer.log.flushed_offset
    assert flushed < observer.log.log_end_offset
    observer.restart(h.now_ms)
    assert observer.log.log_end_offset == flushed < leader.core.high_watermark
    h.advance(100)
    assert observer.log.log_end_offset == leader.core.high_watermark


def test_fetch_errors_say_who_leads_which_epoch() -> None:
    h = Harness(Node(i, VOTERS, seed=7) for i in VOTERS)
    leader = h.elect()
    epoch = leader.core.epoch
    follower = next(n for n in h.nodes.values() if n is not leader)
    cases = [
        (follower, epoch - 1, ErrorCode.FENCED_LEADER_EPOCH),
        (follower, epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (follower, epoch, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (leader, epoch - 1, ErrorCode.FENCED_LEADER_EPOCH),
    ]
    for node, request_epoch, error in cases:
        out = node.handle(7, fetch(7, request_epoch, 0, 0), "f", h.now_ms)
        (response,) = [m.message for m in outbound(out, FetchResponse)]
        assert response.error_code == error
        assert (response.leader_id, response.leader_epoch) == (leader.node_id, epoch)
    out = leader.handle(7, fetch(7, epoch, -1, 0), "bad", h.now_ms)
    assert outbound(out, FetchResponse)[0].message.error_code == ErrorCode.INVALID_REQUEST
    out = follower.handle(
        7,
        FetchSnapshotRequest(
            cluster_id=None, replica_id=7, current_leader_epoch=epoch, snapshot_id=None, position=0, max_bytes=10
        ),
        "s",
        h.now_ms,
    )
    assert outbound(out, FetchSnapshotResponse)[0].message.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_propose_on_a_follower_names_the_leader() -> None:
    h = Harness(Node(i, VOTERS, seed=8) for i in VOTERS)
    leader = h.elect()
    follower = next(n for n in h.nodes.values() if n is not leader)
    with pytest.raises(NotLeaderError) as raised:
        follower.core.propose([b"x"], h.now_ms)
    assert raised.value.leader_id == leader.node_id and raised.value.epoch == leader.core.epoch


def test_snapshots_only_of_committed_state_and_suggested_after_enough_bytes() -> None:
    config = dataclasses.replace(CONFIG, metadata_log_max_record_bytes_between_snapshots=200)
    h = Harness(Node(i, VOTERS, seed=9, config=config) for i in VOTERS)
    leader = h.elect()
    hw = leader.core.high_watermark
    with pytest.raises(RaftUsageError):
        leader.core.create_snapshot(hw + 1, b"", h.now_ms)
    assert not leader.outputs[-1].snapshot_suggested
    for _ in range(4):
        leader.propose([b"x" * 60], h.now_ms)
        h.advance(3)
    assert leader.outputs[-1].snapshot_suggested
    snapshot_id, out = leader.core.create_snapshot(leader.core.high_watermark, b"img", h.now_ms)
    assert not out.snapshot_suggested and leader.log.log_start_offset == snapshot_id.end_offset


def test_describe_shows_each_replicas_progress_on_the_leader() -> None:
    nodes = [Node(i, VOTERS, seed=10) for i in VOTERS] + [Node(7, VOTERS, seed=10)]
    h = Harness(nodes)
    leader = h.elect()
    h.advance(50)
    status = leader.core.describe(h.now_ms)
    assert (status.leader_id, status.epoch, status.role) == (leader.node_id, leader.core.epoch, "Leader")
    assert status.high_watermark == leader.log.log_end_offset
    assert [v.replica_id for v in status.voters] == list(VOTERS)
    assert all(v.log_end_offset == status.high_watermark for v in status.voters)
    assert all(h.now_ms - 30 <= v.last_fetch_timestamp_ms <= h.now_ms for v in status.voters)
    (observer,) = status.observers
    assert observer.replica_id == 7 and observer.log_end_offset == status.high_watermark
    elsewhere = h[7].core.describe(h.now_ms)
    assert elsewhere.leader_id == leader.node_id
    assert all(v.log_end_offset == -1 for v in elsewhere.voters)


def test_snapshot_retention_keeps_two_and_any_being_downloaded() -> None:
    config = dataclasses.replace(CONFIG, fetch_snapshot_max_bytes=4)
    h = Harness(Node(i, VOTERS, seed=11, config=config) for i in VOTERS)
    leader = h.elect()
    log = leader.log

    def snapshot_now() -> object:
        leader.propose([b"r"], h.now_ms)
        h.advance(3)
        snapshot_id, out = leader.core.create_snapshot(leader.core.high_watermark, b"image-0123456789", h.now_ms)
        leader.obey(out)
        return snapshot_id

    first, second = snapshot_now(), snapshot_now()
    assert log.snapshot_ids == (first, second) and log.log_start_offset == first.end_offset
    # A fetcher starts downloading `first`; then two newer snapshots appear.
    epoch = leader.core.epoch
    chunk = FetchSnapshotRequest(
        cluster_id=None, replica_id=7, current_leader_epoch=epoch, snapshot_id=first, position=0, max_bytes=4
    )
    leader.handle(7, chunk, "s0", h.now_ms)
    third, fourth = snapshot_now(), snapshot_now()
    assert log.snapshot_ids == (first, third, fourth), "the one being downloaded stays, the log after it too"
    assert log.log_start_offset == first.end_offset
    # The download stalls past the fetch timeout: it is given up.
    h.advance(CONFIG.controller_quorum_fetch_timeout_ms + 1)
    assert log.snapshot_ids == (third, fourth) and log.log_start_offset == third.end_offset



def test_a_leader_sends_records_before_its_own_flush_but_counts_its_log_only_once_flushed() -> None:
    h = Harness(Node(i, VOTERS, seed=4) for i in VOTERS)
    leader = h.elect()
    follower = next(n for n in h.nodes.values() if n is not leader)
    hw = leader.core.high_watermark
    result, out = leader.core.propose([b"x"], h.now_ms)  # not obeyed: the leader's log stays unflushed
    assert out.flush_log_to_offset == result.last_offset + 1 and out.send_before_flush
    answers = [m for m in outbound(out, FetchResponse)
               if m.message.records and m.correlation.source_id == follower.node_id]
    assert answers, "the follower's parked Fetch gets the record before the leader's flush"
    h.deliver(Envelope(leader.node_id, follower.node_id, answers[0].message, answers[0].correlation.correlation))
    assert follower.log.flushed_offset == result.last_offset + 1
    (request,) = follower.take(FetchRequest)
    after = leader.core.handle(Inbound(follower.node_id, request.message, Token(follower.node_id, request.correlation)),
                               h.now_ms)
    assert after.high_watermark == hw, "one follower plus an unflushed leader is no majority"
    leader.log.flush(result.last_offset + 1)
    assert leader.core.tick(h.now_ms).high_watermark == result.last_offset + 1


def test_only_a_leader_that_changed_no_election_state_sends_before_flushing() -> None:
    h = Harness(Node(i, VOTERS, seed=4) for i in VOTERS)
    h.advance(CONFIG.controller_quorum_election_timeout_ms * 3)
    (leader,) = h.leaders()
    for node in h.nodes.values():
        for out in node.outputs:
            if out.send_before_flush:
                assert out.role == "Leader" and out.persist_election_state is None
            elif out.role == "Leader":
                assert out.persist_election_state is not None  # the step that made it leader
    followers_fetches = [o for n in h.nodes.values() if n is not leader for o in n.outputs
                         if outbound(o, FetchRequest)]
    assert followers_fetches and not any(o.send_before_flush for o in followers_fetches)
