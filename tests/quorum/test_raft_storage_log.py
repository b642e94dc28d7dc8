"""StorageReplicatedLog: the Raft core's log over storage.Log, on the
storage engine's simulated disk (crashes lose what was not fsynced)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import settings
from kio.schema.leader_change_message.v0.data import LeaderChangeMessage
from kio.serial import entity_reader

from quorum.raft import RaftUsageError, SnapshotId
from quorum.raft.storage_log import StorageReplicatedLog, snapshot_file_name
from quorum.raft.voters import VoterInfo
from storage.batch import ControlRecordType, iter_batch_headers, iter_records, parse_control_key
from storage.config import LogConfig
from storage.sim_fs import SimFileSystem

from sim.harness import CONFIG, Harness, Node
from test_raft_log import MemoryLogModel

DIR = "/meta/__cluster_metadata-0"


def open_log(fs: SimFileSystem) -> StorageReplicatedLog:
    return StorageReplicatedLog.open(DIR, now_ms=0, fs=fs)


def decode(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    for pos, header in iter_batch_headers(data):
        out += [(header.partition_leader_epoch, r.value) for r in iter_records(data, pos)]
    return out


class StorageLogModel(MemoryLogModel):
    truncation_is_durable = True  # storage.Log fsyncs the cut segment before returning

    def new_log(self) -> StorageReplicatedLog:
        self.fs = SimFileSystem(seed=1)
        return open_log(self.fs)

    def crash_log(self) -> None:
        self.fs.crash()
        self.log = open_log(self.fs)

    def decode(self, data: bytes) -> list[tuple[int, bytes]]:
        return decode(data)


TestStorageLogModel = StorageLogModel.TestCase
TestStorageLogModel.settings = settings(settings(), stateful_step_count=25)


def test_batches_carry_the_raft_epoch_and_the_leader_change_is_kafkas_control_record() -> None:
    log = open_log(SimFileSystem())
    info = log.append_leader_change(3, leader_id=2, voters=[1, 2, 3], granting_voters=[2, 3])
    data_info = log.append_as_leader([b"a", b"b"], 3)
    assert (info.base_offset, data_info.base_offset, data_info.last_offset) == (0, 1, 2)
    data = log.read(0, 1 << 20)
    (control_pos, control), (_, batch) = list(iter_batch_headers(data))
    assert control.is_control and control.partition_leader_epoch == 3
    assert batch.partition_leader_epoch == 3 and not batch.is_control
    (record,) = iter_records(data, control_pos)
    assert parse_control_key(record.key)[1] == ControlRecordType.LEADER_CHANGE
    message, _ = entity_reader(LeaderChangeMessage)(memoryview(record.value), 0)
    assert message.leader_id == 2
    assert [v.voter_id for v in message.voters] == [1, 2, 3]
    assert [v.voter_id for v in message.granting_voters] == [2, 3]
    assert log.last_fetched_epoch == 3 and log.end_offset_for_epoch(2).offset == 0


def test_snapshots_are_kafka_named_files_that_survive_a_crash_whole_or_not_at_all() -> None:
    fs = SimFileSystem()
    log = open_log(fs)
    log.append_as_leader([b"a"], 1)
    log.append_as_leader([b"b"], 2)
    log.flush(2)
    snapshot_id = log.create_snapshot(2, b"image")
    assert snapshot_id == SnapshotId(2, 2)
    assert snapshot_file_name(snapshot_id) in fs.listdir(DIR)
    log.delete_before(snapshot_id)
    # a half-written snapshot of a later install
    partial = fs.open(f"{DIR}/00000000000000000009-0000000004.checkpoint.tmp")
    partial.append(b"half")
    partial.fsync()
    fs.fsync_dir(DIR)
    fs.crash()
    log = open_log(fs)
    assert log.latest_snapshot_id == snapshot_id and log.snapshot_data(snapshot_id) == b"image"
    assert not [n for n in fs.listdir(DIR) if n.endswith(".tmp")]
    assert (log.log_start_offset, log.log_end_offset, log.last_fetched_epoch) == (2, 2, 2)
    assert log.read_snapshot(snapshot_id, 1, 3) == b"mag"


def test_a_snapshot_newer_than_the_log_empties_the_log_on_open() -> None:
    fs = SimFileSystem()
    log = open_log(fs)
    log.append_as_leader([b"a"], 1)
    log.flush(1)
    # the state of a crash right after writing a fetched snapshot, before emptying the log
    log._write_snapshot(SnapshotId(10, 3), b"leader's image")
    fs.crash()
    log = open_log(fs)
    assert (log.log_start_offset, log.log_end_offset, log.last_fetched_epoch) == (10, 10, 3)


def test_a_metadata_log_with_retention_is_refused() -> None:
    from storage.log import Log

    with pytest.raises(RaftUsageError, match="retention"):
        StorageReplicatedLog(Log.open(DIR, LogConfig(), now_ms=0, fs=SimFileSystem()))


def test_a_quorum_on_storage_logs_replicates_survives_crashes_and_ships_snapshots() -> None:
    voters = (1, 2, 3)
    disks = {i: SimFileSystem(seed=i) for i in voters}
    config = dataclasses.replace(CONFIG, fetch_snapshot_max_bytes=5)
    h = Harness(Node(i, voters, log=open_log(disks[i]), seed=7, config=config) for i in voters)
    leader = h.elect()
    follower = next(n for n in h.nodes.values() if n is not leader)
    for i in range(5):
        leader.propose([b"rec%d" % i], h.now_ms)
        h.advance(3)
    assert follower.core.high_watermark == leader.log.log_end_offset == 6
    # The follower loses power; what it acknowledged was fsynced.
    disks[follower.node_id].crash()
    reopened = Node(follower.node_id, voters, log=open_log(disks[follower.node_id]),
                    election=follower.disk_election, seed=8, config=config, now_ms=h.now_ms)
    assert reopened.log.log_end_offset == 6
    h.nodes[follower.node_id] = reopened
    # Meanwhile the leader snapshots and drops its log prefix.
    cut = follower.node_id
    leader.propose([b"while-away"], h.now_ms)
    h.advance(3, drop=lambda e: cut in (e.source_id, e.destination_id))
    reopened.log.truncate_to(0)  # make it need the snapshot
    snapshot_id, out = leader.core.create_snapshot(leader.core.high_watermark, b"the-image", h.now_ms)
    leader.obey(out)
    h.advance(CONFIG.controller_quorum_fetch_timeout_ms * 3)
    assert reopened.log.latest_snapshot_id == snapshot_id
    assert reopened.log.snapshot_data(snapshot_id) == b"the-image"
    assert decode(reopened.log.read(snapshot_id.end_offset, 1 << 20)) == decode(
        leader.log.read(snapshot_id.end_offset, 1 << 20)
    )
    assert reopened.core.high_watermark == leader.core.high_watermark


def test_voter_changes_are_kafkas_voters_records_and_survive_a_restart_and_a_snapshot() -> None:
    """KIP-853 on disk: a change is a VotersRecord (control type 6) naming each
    voter's directory id and endpoint; a reopened log and a log that starts
    at a snapshot both know the voter set in force."""
    disks = {i: SimFileSystem(seed=i) for i in (1, 2)}
    logs = {i: open_log(disks[i]) for i in (1, 2)}
    two = VoterInfo(2, uuid.uuid4(), (("CONTROLLER", "127.0.0.1", 9094),))
    logs[1].remember_voter(VoterInfo(1, uuid.uuid4(), (("CONTROLLER", "127.0.0.1", 9093),)))
    logs[1].remember_voter(two)
    h = Harness(Node(i, (1,), log=logs[i], seed=7) for i in (1, 2))
    leader = h.elect()
    assert leader.node_id == 1
    _, out = leader.core.change_voters({1, 2}, h.now_ms)
    leader.obey(out)
    h.advance(CONFIG.controller_quorum_fetch_timeout_ms)
    assert h.nodes[2].core.voters == {1, 2} and h.nodes[2].core.is_voter
    data = logs[1].read(0, 1 << 20)
    types = [parse_control_key(r.key)[1] for pos, hd in iter_batch_headers(data) if hd.is_control
             for r in iter_records(data, pos)]
    assert ControlRecordType.KRAFT_VOTERS in types
    assert logs[2].latest_voters()[1] == two  # the follower learned the endpoint and directory id
    # A restart rereads the records from the segments.
    del h.nodes[2]
    disks[2].crash()
    assert open_log(disks[2]).voter_sets()[-1][1] == {1, 2}
    # A snapshot starts with the voter set; a log that starts there knows it.
    leader.propose([b"after"], h.now_ms)
    h.advance(3)
    snapshot_id, out = leader.core.create_snapshot(leader.core.high_watermark, b"the-image", h.now_ms)
    leader.obey(out)
    fresh = open_log(SimFileSystem(seed=9))
    fresh.install_snapshot(snapshot_id, logs[1].read_snapshot(snapshot_id, 0, 1 << 20))
    assert fresh.snapshot_data(snapshot_id) == b"the-image"
    assert fresh.voter_sets() == ((snapshot_id.end_offset - 1, frozenset({1, 2})),)
    assert fresh.latest_voters()[1] == two
