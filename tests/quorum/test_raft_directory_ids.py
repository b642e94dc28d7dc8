"""A voter is a node id and a directory id (KIP-853): a controller whose
disk was wiped and formatted again comes back with its old node id and a
new directory id, and must not act as the voter it was. Its log is empty,
so voting in that voter's place would let a candidate that misses committed
records win, and its fetches counting as that voter's would commit records
on a minority."""

from __future__ import annotations

import uuid

from quorum.raft import ErrorCode, FetchSnapshotRequest, MemoryLog, VoteRequest, VoteResponse
from quorum.raft.voters import VoterInfo

from sim.harness import CONFIG, Harness, Node, outbound

VOTERS = (1, 2, 3)
DIRS = {n: uuid.UUID(int=n) for n in VOTERS}
WIPED_DIR = uuid.UUID(int=33)


def flushed_log(records: int, epoch: int = 1) -> MemoryLog:
    log = MemoryLog()
    for _ in range(records):
        log.append_as_leader([b"r"], epoch)
    log.flush(log.log_end_offset)
    return log


def node(node_id: int, *, directory_id: uuid.UUID, log: MemoryLog | None = None) -> Node:
    return Node(node_id, VOTERS, log=log, seed=3, directory_id=directory_id, voter_directory_ids=DIRS)


def vote(candidate: int, receiver: int, directory_id: uuid.UUID | None) -> VoteRequest:
    return VoteRequest(cluster_id=None, voter_id=receiver, replica_id=candidate, replica_epoch=5,
                       last_offset_epoch=1, last_offset=0, pre_vote=False, voter_directory_id=directory_id,
                       replica_directory_id=DIRS[candidate])


def test_a_wiped_voter_neither_stands_nor_votes_under_its_old_directory_id() -> None:
    wiped = node(3, directory_id=WIPED_DIR)
    assert not wiped.core.is_voter and wiped.core.is_voter_key(3, DIRS[3])
    for now_ms in range(0, CONFIG.controller_quorum_election_timeout_ms * 50, 100):
        wiped.tick(now_ms)  # nobody answers: it keeps looking for a leader
    assert wiped.core.role == "Unattached", "a node that is not the voter of its id must not stand"
    sent = [m.destination_id for out in wiped.outputs for m in out.messages]
    assert sent and 3 not in sent, "it looks for the leader among the other voters, never itself"
    # A candidate with an empty log asks for the vote of voter 3 (its old disk): refused.
    (answer,) = outbound(wiped.handle(1, vote(1, 3, DIRS[3]), "v", 10_000), VoteResponse)
    assert (answer.message.error_code, answer.message.vote_granted) == (ErrorCode.INVALID_VOTER_KEY, False)
    # The same controller still votes when it is the voter asked for (a healthy disk).
    healthy = node(3, directory_id=DIRS[3])
    (answer,) = outbound(healthy.handle(1, vote(1, 3, DIRS[3]), "v", 0), VoteResponse)
    assert answer.message.vote_granted


def test_a_wiped_voter_holding_only_the_record_of_its_removal_does_not_stand() -> None:
    """A controller formatted again fetches the log from the leader; its
    first voter-set record may be the one removing its old identity. After a
    restart it does not know that record is committed, so it takes itself for
    a removed voter that may still be needed to commit it, which stands; but
    the configured set it came from records another directory id for it."""
    log = MemoryLog()
    log.append_as_leader([b"r"], 1)
    for n in VOTERS:
        log.remember_voter(VoterInfo(n, DIRS[n]))
    log.append_voters(1, frozenset({1, 2}))
    log.flush(log.log_end_offset)
    wiped = node(3, directory_id=WIPED_DIR, log=log)
    assert wiped.core.voter_change_pending and not wiped.core.may_stand
    for now_ms in range(0, CONFIG.controller_quorum_election_timeout_ms * 50, 100):
        wiped.tick(now_ms)
    assert wiped.core.role == "Unattached"
    # The voter itself, on its own disk, does stand (it may be needed to commit its removal).
    assert node(3, directory_id=DIRS[3], log=log).core.may_stand


def test_a_wiped_voters_fetches_do_not_commit_records_it_holds_with_the_leader_alone() -> None:
    h = Harness([node(1, directory_id=DIRS[1], log=flushed_log(3)), node(2, directory_id=DIRS[2], log=flushed_log(3)),
                 node(3, directory_id=WIPED_DIR)])
    leader = h.elect()
    assert leader.node_id in (1, 2)
    other = 2 if leader.node_id == 1 else 1
    h.advance(50)
    committed = leader.core.high_watermark
    assert committed == leader.log.log_end_offset
    # DescribeQuorum lists it as an observer by its id and its own directory
    # id, beside voter 3 (the old disk), as Kafka does.
    status = leader.core.describe(h.now_ms)
    assert [(r.replica_id, r.directory_id, r.log_end_offset) for r in status.observers] == [(3, WIPED_DIR, committed)]
    assert {r.replica_id: r.directory_id for r in status.voters}[3] == DIRS[3]
    # The other healthy voter is cut off; the wiped one keeps fetching.
    cut = (lambda e: other in (e.source_id, e.destination_id))  # noqa: E731
    leader.propose([b"only-on-the-leader"], h.now_ms)
    h.advance(200, drop=cut)
    assert h[3].log.log_end_offset == committed, "a non-voter gets committed records only"
    assert leader.core.high_watermark == committed, "the wiped voter's fetches counted as voter 3's"
    status = leader.core.describe(h.now_ms)
    assert {r.replica_id: r.log_end_offset for r in status.voters}[3] == -1
    h.advance(200)
    assert leader.core.high_watermark == leader.log.log_end_offset


def test_a_lagging_voter_cannot_win_with_the_vote_of_a_wiped_one() -> None:
    """The unsafe election a directory id prevents. Records are committed on
    voters 1 and 2; voter 3 missed them. Voter 1 is down and voter 2's disk
    was wiped. Were the wiped node to vote as voter 2, its empty log would
    grant voter 3's request, and voter 3 would lead without the committed
    records. It refuses (its directory id is not voter 2's), so no leader is
    elected until voter 1 is back."""
    h = Harness([node(2, directory_id=WIPED_DIR), node(3, directory_id=DIRS[3])])  # voter 1 is down
    h.advance(CONFIG.controller_quorum_election_timeout_ms * 10)
    assert not h.leaders(), "voter 3 won an election with the vote of a wiped disk"
    h.nodes[1] = node(1, directory_id=DIRS[1], log=flushed_log(3))
    leader = h.elect()
    assert leader.node_id == 1 and leader.log.log_end_offset > 3, "the voter holding the committed records leads"


def test_a_wiped_voters_snapshot_download_keeps_no_voter_contact_fresh() -> None:
    """Check-quorum: a leader that hears from no other voter resigns, even
    while a controller with a voter's id on a wiped disk downloads its
    snapshot; FetchSnapshot carries the fetcher's directory id (KIP-853), and
    only the voter's own disk counts as that voter's contact."""
    timeout = CONFIG.controller_quorum_fetch_timeout_ms
    for directory_id, resigns in ((WIPED_DIR, True), (None, False)):
        h = Harness([node(n, directory_id=DIRS[n], log=flushed_log(3)) for n in VOTERS])
        leader = h.elect()
        snapshot_id, out = leader.core.create_snapshot(leader.core.high_watermark, b"image", h.now_ms)
        leader.obey(out)
        fetcher = next(n for n in VOTERS if n != leader.node_id)
        given = directory_id or DIRS[fetcher]
        for step in range(1, 2 * timeout // 20):
            request = FetchSnapshotRequest(cluster_id=None, replica_id=fetcher, current_leader_epoch=leader.core.epoch,
                                           snapshot_id=snapshot_id, position=0, max_bytes=2,
                                           replica_directory_id=given)
            leader.handle(fetcher, request, f"s{step}", h.now_ms)
            h.advance(20, drop=lambda e: True)  # every other message is lost: the leader is cut off
        assert leader.core.is_leader is not resigns, (given, leader.core.role)
