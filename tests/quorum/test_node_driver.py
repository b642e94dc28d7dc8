"""RaftNode, the trio driver: voters and observers on loopback inside one trio run."""

from __future__ import annotations

import os
import uuid

import pytest
import trio

from quorum.metadata.image import LoggedRecord
from quorum.metadata.records import PartitionRecord, RegisterBrokerRecord, TopicRecord, encode_record
from quorum.node import applying, driver
from quorum.node.applier import committed_records
from quorum.node.events import Staged
from quorum.node.metadata_log import metadata_log_dir
from quorum.node.quorum_state import QuorumStateFile
from quorum.raft import NotLeaderError, QuorumConfig
from quorum.raft.messages import FetchRequest, VoteRequest, VoteResponse

from node_testing import FAST, InProcessQuorum


def topic(name: str) -> bytes:
    return encode_record(TopicRecord(name=name, topic_id=uuid.uuid4()))


def topic_names(node) -> set[str]:
    return set(node.image.topic_ids_by_name)


async def test_three_voters_elect_one_leader_and_commit_what_it_proposes(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader_id = await quorum.active_leader()
    leader = quorum.node(leader_id)
    result = await leader.propose([topic("a"), topic("b")])
    assert result.last_offset == result.base_offset + 1
    assert leader.high_watermark > result.last_offset
    await quorum.wait_applied_everywhere(result.last_offset + 1)
    for node_id in quorum.voters:
        node = quorum.node(node_id)
        assert topic_names(node) == {"a", "b"}
        assert node.leader.leader_id == leader_id
    assert [n for n in quorum.voters if quorum.node(n).is_leader] == [leader_id]


async def test_concurrent_proposals_share_one_batch_and_keep_their_order(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader = quorum.node(await quorum.active_leader())
    results = {}

    async def propose(i: int) -> None:
        results[i] = await leader.propose([topic(f"t{i}")])

    async with trio.open_nursery() as proposers:
        for i in range(50):
            proposers.start_soon(propose, i)
    offsets = sorted(r.base_offset for r in results.values())
    assert offsets == list(range(offsets[0], offsets[0] + 50)), "50 proposals take 50 consecutive offsets"
    data = leader.log.read(offsets[0], 10**7)
    _, spans = committed_records(data)
    assert len(spans) < 50, f"50 concurrent proposals went into {len(spans)} batches: none were coalesced"
    assert topic_names(leader) == {f"t{i}" for i in range(50)}


async def test_a_follower_refuses_proposals(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader_id = await quorum.active_leader()
    follower = quorum.node(next(n for n in quorum.voters if n != leader_id))
    with pytest.raises(NotLeaderError):
        await follower.propose([topic("x")])


async def test_a_restarted_follower_catches_up_from_its_own_log(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader_id = await quorum.active_leader()
    leader = quorum.node(leader_id)
    await leader.propose([topic("before")])
    follower_id = next(n for n in quorum.voters if n != leader_id)
    await quorum.stop(follower_id)
    last = await leader.propose([topic("while-down")])  # the other follower makes the majority
    follower = await quorum.start(follower_id)
    with trio.fail_after(10):
        await follower.wait_until_applied(last.last_offset + 1)
    assert topic_names(follower) == {"before", "while-down"}
    state = QuorumStateFile(metadata_log_dir(quorum.log_dir(follower_id))).read()
    assert state is not None and state.epoch == leader.leader.epoch and state.leader_id == leader_id


async def test_a_long_backlog_is_replayed_off_the_loop_to_the_same_image(tmp_path, nursery, monkeypatch):
    monkeypatch.setattr(applying, "REPLAY_IN_THREAD_RECORDS", 5)
    monkeypatch.setattr(applying, "REPLAY_CHUNK_BYTES", 300)  # a few batches per chunk
    replays = []
    original = driver.RaftNode._replay_in_thread

    async def counted(self):
        replays.append(self.node_id)
        await original(self)

    monkeypatch.setattr(driver.RaftNode, "_replay_in_thread", counted)
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader_id = await quorum.active_leader()
    leader = quorum.node(leader_id)
    names = {f"t{i}" for i in range(40)}
    for name in sorted(names):
        last = await leader.propose([topic(name)])
    follower_id = next(n for n in quorum.voters if n != leader_id)
    await quorum.stop(follower_id)
    follower = await quorum.start(follower_id)
    with trio.fail_after(10):
        await follower.wait_until_applied(last.last_offset + 1)
    assert follower_id in replays, "the restarted follower replayed its log in the trio loop"
    assert topic_names(follower) == names
    assert follower.image.offset == leader.image.offset
    last = await leader.propose([topic("after")])  # it still fetches, votes and applies as usual
    with trio.fail_after(10):
        await follower.wait_until_applied(last.last_offset + 1)
    assert topic_names(follower) == names | {"after"}


async def test_a_restarted_leader_does_not_lead_its_old_epoch_again(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    old_leader = await quorum.active_leader()
    epoch = quorum.node(old_leader).leader.epoch
    await quorum.node(old_leader).propose([topic("kept")])
    await quorum.stop(old_leader)
    await quorum.start(old_leader)
    new_leader = await quorum.active_leader()
    node = quorum.node(new_leader)
    assert node.leader.epoch > epoch
    result = await node.propose([topic("after")])
    await quorum.wait_applied_everywhere(result.last_offset + 1)
    assert all(topic_names(quorum.node(n)) == {"kept", "after"} for n in quorum.voters)


async def test_graceful_resignation_hands_over_quickly(tmp_path, nursery):
    slow = QuorumConfig(**{**FAST.__dict__, "controller_quorum_fetch_timeout_ms": 5000,
                           "controller_quorum_election_timeout_ms": 3000})
    quorum = InProcessQuorum(tmp_path, nursery, config=slow)
    await quorum.start_all()
    old = await quorum.active_leader(timeout_s=20)
    await quorum.node(old).resign()
    with trio.fail_after(2):  # far below the 5 s fetch timeout: EndQuorumEpoch made a successor stand
        while True:
            leaders = [n for n in quorum.voters if n != old and quorum.node(n).is_active]
            if leaders:
                break
            await trio.sleep(0.01)


async def test_an_observer_follows_and_publishes_what_changes_for_its_broker(tmp_path, nursery):
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader = quorum.node(await quorum.active_leader())
    observer = await quorum.start(100)
    assert not observer.is_voter
    updates = []
    observer.subscribe(lambda image, delta: updates.append((image, delta)), broker_id=5)
    topic_id = uuid.uuid4()
    result = await leader.propose([
        encode_record(RegisterBrokerRecord(broker_id=5, incarnation_id=uuid.uuid4(), endpoints=(), fenced=False)),
        encode_record(TopicRecord(name="mine", topic_id=topic_id)),
        encode_record(PartitionRecord(topic_id=topic_id, partition=0, replicas=(5,), isr=(5,), leader=5)),
    ])
    with trio.fail_after(10):
        await observer.wait_until_applied(result.last_offset + 1)
    leaders = [p for _, delta in updates for p in delta.leaders]
    assert [(p.topic_name, p.partition) for p in leaders] == [("mine", 0)]
    assert updates[-1][0] is observer.image
    assert observer.image.brokers[5].epoch == result.base_offset, "the broker epoch is its record's offset"
    status = leader.describe()
    assert [o.replica_id for o in status.observers] == [100]
    assert observer.describe().role == "Follower"


async def test_snapshots_bound_the_log_and_a_new_observer_starts_from_one(tmp_path, nursery):
    config = QuorumConfig(**{**FAST.__dict__, "metadata_log_max_record_bytes_between_snapshots": 20_000})
    quorum = InProcessQuorum(tmp_path, nursery, config=config, segment_bytes=16_384)
    await quorum.start_all()
    leader = quorum.node(await quorum.active_leader())
    names = [f"topic-{i:04d}" for i in range(1500)]
    for i in range(0, len(names), 50):
        await leader.propose([topic(n) for n in names[i:i + 50]])
    with trio.fail_after(10):
        while leader.log.log_start_offset == 0:
            await trio.sleep(0.01)
    files = os.listdir(metadata_log_dir(quorum.log_dir(leader.node_id)))
    assert any(f.endswith(".checkpoint") for f in files)
    assert "00000000000000000000.log" not in files, "segments below the snapshot are deleted"
    observer = await quorum.start(200)
    target = leader.high_watermark
    with trio.fail_after(20):
        await observer.wait_until_applied(target)
    assert observer.log.log_start_offset > 0, "the observer started from a snapshot, not offset 0"
    assert topic_names(observer) == set(names)
    assert observer.image.topic_ids_by_name == leader.image.topic_ids_by_name


async def test_votes_and_fetch_offsets_are_on_disk_before_they_are_sent(tmp_path, nursery):
    """The Durability rules of quorum.node.driver, checked at every send
    against the files: a granted vote is in the quorum-state file; a Fetch
    claims only offsets the log has fsynced (its recovery point)."""
    quorum = InProcessQuorum(tmp_path, nursery)
    checked = {"votes": 0, "fetches": 0}
    violations = []
    for node_id in quorum.voters:
        member_node = await quorum.start(node_id)
        state_file = QuorumStateFile(metadata_log_dir(quorum.log_dir(node_id)))
        channel = member_node._channel
        send = channel.send

        def checked_send(outbound, node=member_node, send=send):
            if isinstance(outbound.message, FetchRequest):
                checked["fetches"] += 1
                if outbound.message.fetch_offset > node.log.flushed_offset:
                    violations.append(f"node {node.node_id} fetches from unflushed offset {outbound.message}")
            send(outbound)

        channel.send = checked_send
        handle = member_node.handle_request

        async def checked_handle(source_id, message, handle=handle, state_file=state_file):
            response = await handle(source_id, message)
            if isinstance(message, VoteRequest) and not message.pre_vote and isinstance(response, VoteResponse) \
                    and response.vote_granted:
                checked["votes"] += 1
                state = state_file.read()
                if state is None or state.voted_id != message.replica_id or state.epoch != message.replica_epoch:
                    violations.append(f"vote for {message.replica_id} sent before it was persisted: {state}")
            return response

        member_node.handle_request = checked_handle
    for _ in range(3):
        leader_id = await quorum.active_leader()
        await quorum.node(leader_id).propose([topic(f"t-{leader_id}-{uuid.uuid4()}")])
        await quorum.node(leader_id).resign()
        await trio.sleep(0.3)
    assert not violations, violations
    assert checked["votes"] >= 2 and checked["fetches"] >= 10, checked




async def test_a_bare_proposal_between_staged_ones_stays_in_the_leader_image(tmp_path, nursery):
    """A staged image covers what its builder knew; once a bare-record
    proposal is appended in the epoch, the leader replays from its log."""
    quorum = InProcessQuorum(tmp_path, nursery)
    await quorum.start_all()
    leader = quorum.node(await quorum.active_leader())

    def staged(name):
        def build(base, epoch):
            record = TopicRecord(name=name, topic_id=uuid.uuid4())
            # Built on the committed image only: it knows nothing uncommitted.
            image = leader.image.apply([LoggedRecord(base, epoch, record)])
            return Staged([encode_record(record)], image)
        return build

    await leader.propose_with(staged("a"))
    bare = [f"b{i}" for i in range(3000)]  # more than one turn decides: "c" comes a turn later
    async with trio.open_nursery() as proposers:
        proposers.start_soon(leader.propose, [topic(n) for n in bare])
        await trio.sleep(0)
        proposers.start_soon(leader.propose_with, staged("c"))
    await quorum.wait_applied_everywhere(leader.high_watermark)
    expected = {"a", "c", *bare}
    assert topic_names(leader) == expected
    assert all(topic_names(quorum.node(n)) == expected for n in quorum.voters)
