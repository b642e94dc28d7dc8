"""The log the core replicates: MemoryLog against a plain-list model, the
leader's Fetch verdicts against a table, the quorum-state file format, and
the config checks."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from quorum.raft import DivergingEpoch, ElectionState, MemoryLog, QuorumConfig, RaftUsageError, SnapshotId
from quorum.raft.log import VALID, validate_fetch_position
from quorum.raft.memory_log import decode_batches
from common.errors import ConfigError


class MemoryLogModel(RuleBasedStateMachine):
    """Drive a ReplicatedLog and a list of (epoch, record) side by side; a
    crash must bring back exactly what the last flush made durable.
    Subclasses swap in another log (`new_log`, `crash_log`)."""

    # MemoryLog: a truncation is durable only with the next flush.
    truncation_is_durable = False

    def new_log(self):  # noqa: ANN201
        return MemoryLog()

    def crash_log(self) -> None:
        self.log.crash()

    def decode(self, data: bytes) -> list[tuple[int, bytes]]:
        return [(b.epoch, r) for b in decode_batches(data) for r in b.records]

    def __init__(self) -> None:
        super().__init__()
        self.log = self.new_log()
        self.entries: list[tuple[int, bytes]] = []  # offset -> (epoch, record), from offset 0
        self.start = 0
        self.base_epoch = 0
        self.durable: list[tuple[int, bytes]] = []
        self.batch_ends: list[int] = []
        self.durable_batch_ends: list[int] = []
        self.n = 0

    def last_epoch(self) -> int:
        return self.entries[-1][0] if len(self.entries) > self.start else self.base_epoch

    @rule(bump=st.integers(0, 2), count=st.integers(1, 3))
    def append(self, bump: int, count: int) -> None:
        epoch = self.last_epoch() + bump
        records = []
        for _ in range(count):
            self.n += 1
            records.append(b"r%d" % self.n)
        info = self.log.append_as_leader(records, epoch)
        assert info.base_offset == len(self.entries)
        self.entries += [(epoch, r) for r in records]
        self.batch_ends.append(len(self.entries))

    @precondition(lambda self: self.batch_ends)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        candidates = [self.start] + [e for e in self.batch_ends if e > self.start]
        offset = data.draw(st.sampled_from(candidates))
        self.log.truncate_to(offset)
        cut = offset < len(self.entries)
        del self.entries[offset:]
        self.batch_ends = [e for e in self.batch_ends if e <= offset]
        if self.truncation_is_durable and cut:
            # storage.Log fsyncs the cut segment (the only one, in this model)
            self.durable = list(self.entries)
            self.durable_batch_ends = list(self.batch_ends)

    @rule()
    def flush(self) -> None:
        self.log.flush(self.log.log_end_offset)
        self.durable = list(self.entries)
        self.durable_batch_ends = list(self.batch_ends)

    @rule()
    def crash(self) -> None:
        self.crash_log()
        self.entries = list(self.durable)
        self.batch_ends = list(self.durable_batch_ends)

    @precondition(lambda self: any(e > self.start for e in self.batch_ends))
    @rule(data=st.data())
    def snapshot_and_delete(self, data: st.DataObject) -> None:
        self.flush()
        end = data.draw(st.sampled_from([e for e in self.batch_ends if e > self.start]))
        snapshot_id = self.log.create_snapshot(end, b"image")
        assert snapshot_id == SnapshotId(end, self.entries[end - 1][0])
        self.log.delete_before(snapshot_id)
        self.start = end
        self.base_epoch = snapshot_id.epoch

    @invariant()
    def positions_agree(self) -> None:
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == max(len(self.entries), self.start)
        assert self.log.last_fetched_epoch == self.last_epoch()
        assert self.decode(self.log.read(self.start, 1 << 20)) == self.entries[self.start :]

    @invariant()
    def epochs_agree(self) -> None:
        known = [e for e, _ in self.entries[self.start :]]
        for epoch in range(0, self.last_epoch() + 2):
            got = self.log.end_offset_for_epoch(epoch)
            if epoch < self.base_epoch:
                assert (got.epoch, got.offset) == (-1, -1)
                continue
            # the dumb way: walk every offset
            found, end = self.base_epoch, self.start
            for offset, e in enumerate(known, start=self.start):
                if e > epoch:
                    break
                found, end = e, offset + 1
            assert (got.epoch, got.offset) == (found, end), (epoch, known)


TestMemoryLogModel = MemoryLogModel.TestCase
TestMemoryLogModel.settings = settings(settings(), stateful_step_count=30)


def leader_log(epochs: list[int], snapshot_end: int | None = None) -> MemoryLog:
    log = MemoryLog()
    for i, epoch in enumerate(epochs):
        log.append_as_leader([b"r%d" % i], epoch)
    if snapshot_end is not None:
        log.delete_before(log.create_snapshot(snapshot_end, b"image"))
    return log


@pytest.mark.parametrize(
    ("fetch_offset", "last_fetched_epoch", "verdict"),
    [
        (0, 0, VALID),  # an empty fetcher
        (2, 1, VALID),
        (4, 3, VALID),
        (5, 5, VALID),  # caught up
        (3, 1, DivergingEpoch(1, 2)),  # it has more epoch-1 records than we do
        (3, 2, DivergingEpoch(1, 2)),  # we never had epoch 2
        (5, 4, DivergingEpoch(3, 4)),
        (6, 5, DivergingEpoch(5, 5)),  # beyond our end
    ],
)
def test_fetch_verdicts_of_a_leader_without_snapshot(
    fetch_offset: int, last_fetched_epoch: int, verdict: object
) -> None:
    log = leader_log([1, 1, 3, 3, 5])
    assert validate_fetch_position(log, fetch_offset, last_fetched_epoch) == verdict


@pytest.mark.parametrize(
    ("fetch_offset", "last_fetched_epoch", "verdict"),
    [
        (1, 1, SnapshotId(2, 1)),  # below the log start
        (2, 1, VALID),  # exactly at the snapshot
        (3, 3, VALID),
        (3, 2, DivergingEpoch(1, 2)),
        (3, 0, SnapshotId(2, 1)),  # an epoch older than the snapshot
    ],
)
def test_fetch_verdicts_of_a_leader_with_a_snapshot(
    fetch_offset: int, last_fetched_epoch: int, verdict: object
) -> None:
    log = leader_log([1, 1, 3, 3, 5], snapshot_end=2)
    assert validate_fetch_position(log, fetch_offset, last_fetched_epoch) == verdict


def test_a_crash_keeps_only_flushed_batches_or_some_written_back_early() -> None:
    log = MemoryLog()
    log.append_as_leader([b"a"], 1)
    log.flush(1)
    log.append_as_leader([b"b"], 1)
    log.append_as_leader([b"c"], 2)
    log.crash(keep_unflushed_batches=1)
    assert log.log_end_offset == 2 and log.flushed_offset == 2 and log.last_fetched_epoch == 1
    log.append_as_leader([b"d"], 2)
    log.crash()
    assert log.log_end_offset == 2


def test_election_state_is_kafkas_quorum_state_json() -> None:
    state = ElectionState(epoch=7, leader_id=2, voted_id=None, voters=frozenset({1, 2, 3}))
    text = state.to_quorum_state_json("cluster-x")
    assert json.loads(text) == {
        "clusterId": "cluster-x",
        "leaderId": 2,
        "leaderEpoch": 7,
        "votedId": -1,
        "appliedOffset": 0,
        "currentVoters": [{"voterId": 1}, {"voterId": 2}, {"voterId": 3}],
        "data_version": 0,
    }
    assert ElectionState.from_quorum_state_json(text) == state
    with pytest.raises(RaftUsageError, match="quorum-state"):
        ElectionState.from_quorum_state_json('{"leaderEpoch": 1}')


def test_quorum_config_rejects_values_that_cannot_work() -> None:
    with pytest.raises(ConfigError, match="request.timeout"):
        QuorumConfig(controller_quorum_request_timeout_ms=100, fetch_max_wait_ms=500)
    with pytest.raises(ConfigError):
        QuorumConfig(controller_quorum_election_timeout_ms=0)

    class NodeConfigLike:
        controller_quorum_election_timeout_ms = 1500
        controller_quorum_fetch_timeout_ms = 3000
        controller_quorum_election_backoff_max_ms = 800
        metadata_log_max_record_bytes_between_snapshots = 1 << 20

    config = QuorumConfig.from_node_config(NodeConfigLike())
    assert config.controller_quorum_election_timeout_ms == 1500
    assert config.controller_quorum_fetch_timeout_ms == 3000
    assert config.controller_quorum_election_backoff_max_ms == 800
    assert config.metadata_log_max_record_bytes_between_snapshots == 1 << 20


def test_the_voter_set_is_the_latest_voters_record_and_a_snapshot_carries_it() -> None:
    log = MemoryLog()
    assert log.voter_sets() == ()
    log.append_as_leader([b"a"], epoch=1)
    log.append_voters(1, frozenset({1, 2}))
    log.append_as_leader([b"b"], epoch=1)
    log.append_voters(1, frozenset({1, 2, 3}))
    assert log.voter_sets() == ((1, frozenset({1, 2})), (3, frozenset({1, 2, 3})))
    # an uncommitted change truncated away gives the older set back
    log.truncate_to(3)
    assert log.voter_sets() == ((1, frozenset({1, 2})),)
    log.append_as_leader([b"c"], epoch=2)
    snapshot = log.create_snapshot(4, b"state")
    assert log.snapshot_data(snapshot) == b"state"
    log.delete_before(snapshot)
    # the record itself is gone with the prefix; the snapshot still names the set
    assert log.voter_sets() == ((3, frozenset({1, 2})),)
    follower = MemoryLog()
    size = log.snapshot_size(snapshot)
    assert size is not None
    follower.install_snapshot(snapshot, log.read_snapshot(snapshot, 0, size))
    assert follower.voter_sets() == ((3, frozenset({1, 2})),)
    assert follower.snapshot_data(snapshot) == b"state"
