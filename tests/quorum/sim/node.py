"""SimNode: one raftka quorum member as the simulation runs it.

It plays the driver's part faithfully: for every `Output` it persists the
election state, flushes the log, then sends (a leader's output that
changed no election state: sends first, as the driver does), then applies
committed records to a toy state machine (a list of every record), exactly
the order `quorum.raft.core` documents. Its log (see `disk.py`) and its persisted
election state are its disk; a crash keeps only those.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import TYPE_CHECKING

from quorum.raft import ElectionState, Inbound, MemoryLog, Output, QuorumConfig, RaftCore
from quorum.raft.storage_log import StorageReplicatedLog
from quorum.raft.leader import LeaderState
from quorum.raft.messages import REQUEST_TYPES, FetchRequest, FetchSnapshotRequest, SnapshotId, VoteResponse

from sim.disk import MemoryDisk, StorageDisk
from sim.invariants import SafetyViolation
from sim.network import Flight, RequestToken

if TYPE_CHECKING:
    from sim.cluster import SimCluster

Entry = tuple[int, int, bool, bytes]  # offset, epoch, control, record


class StateMachine:
    """Applies committed records in order; its snapshot is every record so far."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.next_offset = 0

    def load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        decoded = json.loads(data)
        self.entries = [(o, e, c, bytes.fromhex(r)) for o, e, c, r in decoded]
        self.next_offset = snapshot_id.end_offset
        assert all(o < self.next_offset for o, *_ in self.entries)

    def snapshot_bytes(self) -> bytes:
        return json.dumps([[o, e, c, r.hex()] for o, e, c, r in self.entries]).encode()


def directory_id_of(node_id: int, generation: int) -> uuid.UUID:
    """A deterministic directory id for a node's disk (one per format)."""
    return uuid.UUID(int=(node_id + 1) << 64 | generation + 1)


class SimNode:
    def __init__(self, cluster: SimCluster, node_id: int, config: QuorumConfig, seed: int, disk: str) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.config = config
        self.seed = seed
        self.disk_kind = disk
        self.max_high_watermark = -1  # over every life of this node (of this disk)
        self.max_high_watermark_as_voter = -1  # the highest it reported while a voter
        # Its metadata log dir's directory.id; a wipe formats the disk again with a new one.
        self.generation = 0
        self.directory_id = directory_id_of(node_id, 0)
        self.directory_by_incarnation: dict[int, uuid.UUID] = {}
        # The voters (and their directory ids) it starts from while its log names none:
        # the initial controllers, or, after a wipe, those it discovered (as
        # `controller.quorum.bootstrap.servers` and DescribeQuorum give them).
        self.bootstrap_voters: tuple[frozenset[int], dict[int, uuid.UUID | None]] = (
            cluster.voters, dict(cluster.initial_directory_ids))
        self.disk = (StorageDisk if disk == "storage" else MemoryDisk)(self, seed * 1000 + node_id)
        self.disk_election: ElectionState | None = None
        self.core: RaftCore | None = None
        self.incarnation = 0
        self.sm = StateMachine()
        self.wake_at_ms = 0
        self.crash_mid_next_event = False
        self.observer_checked_offset = 0
        self.flushed_before_crash = 0
        self.voter_at_crash = False  # a voter flushes before it acks; an observer now and then
        self.paused_until_ms = 0  # a paused process (SIGSTOP, a long GC) does nothing until then
        self._ticks_at: tuple[int, int] = (-1, 0)

    @property
    def log(self) -> MemoryLog | StorageReplicatedLog:
        return self.disk.log

    @property
    def is_up(self) -> bool:
        return self.core is not None

    @property
    def is_voter(self) -> bool:
        """Whether it ever was a voter with this disk: a voter's log may hold
        uncommitted records, also after it was removed from the set."""
        return self.cluster.was_voter(self.node_id, self.directory_id)

    # --- life cycle ---------------------------------------------------------

    def start(self, now_ms: int) -> None:
        assert self.core is None
        self.incarnation += 1
        self.directory_by_incarnation[self.incarnation] = self.directory_id
        self.sm = StateMachine()
        snapshot = self.log.latest_snapshot_id
        if snapshot is not None:
            self.sm.load_snapshot(snapshot, self.log.snapshot_data(snapshot))
            self.cluster.invariants.on_snapshot_loaded(self)
        self.cluster.invariants.on_restart(self)
        voters, directory_ids = self.bootstrap_voters
        self.core = RaftCore(
            node_id=self.node_id,
            voters=voters,
            log=self.log,
            rng=random.Random(f"{self.seed}/{self.node_id}/{self.incarnation}"),
            now_ms=now_ms,
            config=self.config,
            election_state=self.disk_election,
            cluster_id="sim",
            directory_id=self.directory_id,
            voter_directory_ids=directory_ids,
        )
        self.process(self.core.tick(now_ms), now_ms)

    def crash(self, rng: random.Random) -> None:
        """Lose memory and every unflushed write (some may reach the disk anyway)."""
        self.voter_at_crash = self.core is not None and self.core.may_stand
        self.core = None
        self.flushed_before_crash = self.log.flushed_offset
        self.disk.crash(rng)

    def wipe(self, voters: frozenset[int], directory_ids: dict[int, uuid.UUID | None]) -> None:
        """The disk is lost: the node is down, and comes back (`start`) on a
        disk formatted again (`raftka storage format --no-initial-controllers`):
        an empty log, no election state, a new directory id, and the voters
        it discovered."""
        self.core = None
        self.generation += 1
        self.directory_id = directory_id_of(self.node_id, self.generation)
        self.bootstrap_voters = (voters, dict(directory_ids))
        self.disk = (StorageDisk if self.disk_kind == "storage" else MemoryDisk)(
            self, (self.seed * 1000 + self.node_id) * 1000 + self.generation)
        self.disk_election = None
        self.max_high_watermark = -1
        self.max_high_watermark_as_voter = -1
        self.observer_checked_offset = 0
        self.flushed_before_crash = 0
        self.voter_at_crash = False
        self.crash_mid_next_event = False

    # --- the driver loop -------------------------------------------------------

    def deliver(self, inbound: Inbound, now_ms: int, source_directory_id: uuid.UUID | None = None) -> None:
        assert self.core is not None
        core = self.core
        message = inbound.message
        counted = None
        if isinstance(message, (FetchRequest, FetchSnapshotRequest)) and isinstance(core.state, LeaderState):
            counted = self._replica_of_another_disk(inbound.source_id, source_directory_id)
        if isinstance(message, VoteResponse) and message.vote_granted and core.role in ("Prospective", "Candidate"):
            self._check_identity(inbound.source_id, source_directory_id, "granted a vote as")
        before = None if counted is None else (counted.end_offset, counted.last_fetch_ms)
        out = core.handle(inbound, now_ms)
        if counted is not None and (counted.end_offset, counted.last_fetch_ms) != before:
            self._check_identity(inbound.source_id, source_directory_id, "fetched and counted as")
        self.obey(out, now_ms)

    def _replica_of_another_disk(self, source_id: int, directory_id: uuid.UUID | None) -> object | None:
        """The leader's progress record of voter `source_id`, if the sender is
        that id on another disk (it must not touch it)."""
        assert self.core is not None and isinstance(self.core.state, LeaderState)
        recorded = self.core.recorded_directory_id(source_id)
        if recorded is None or directory_id is None or recorded == directory_id:
            return None
        return self.core.state.voter_states.get(source_id)

    def _check_identity(self, source_id: int, directory_id: uuid.UUID | None, what: str) -> None:
        """A node on a wiped disk must never count as the voter its id was."""
        assert self.core is not None
        recorded = self.core.recorded_directory_id(source_id)
        if recorded is not None and directory_id is not None and recorded != directory_id:
            raise SafetyViolation(
                f"node {source_id} with directory id {directory_id} {what} voter {source_id} "
                f"(directory id {recorded}) on node {self.node_id} in epoch {self.core.epoch}"
            )

    def tick(self, now_ms: int) -> None:
        assert self.core is not None
        at, count = self._ticks_at
        self._ticks_at = (now_ms, count + 1 if at == now_ms else 1)
        assert self._ticks_at[1] < 50, f"node {self.node_id} asks for a tick again and again at {now_ms} ms"
        self.obey(self.core.tick(now_ms), now_ms)

    def obey(self, out: Output, now_ms: int) -> None:
        if self.crash_mid_next_event:
            # Crash after the core changed its mind, before anything reached
            # disk or wire; or, for a leader that sends before its flush, in
            # the window that opens: records on the wire, not on its disk.
            self.crash_mid_next_event = False
            if out.send_before_flush and out.flush_log_to_offset is not None:
                self.send(out, now_ms)
            self.crash(self.cluster.rng)
            return
        self.process(out, now_ms)

    def process(self, out: Output | None, now_ms: int) -> None:
        while out is not None:
            assert self.core is not None
            # 1. persist (a leader's messages may go first: Output.send_before_flush)
            if out.send_before_flush:
                self.send(out, now_ms)
            if out.persist_election_state is not None:
                self.disk_election = out.persist_election_state
            flushed = out.flush_log_to_offset is not None
            if flushed:
                self.log.flush(out.flush_log_to_offset)
            # 2. send
            if not out.send_before_flush:
                self.send(out, now_ms)
            # 3. apply
            if out.snapshot_installed is not None:
                self.sm.load_snapshot(out.snapshot_installed, self.log.snapshot_data(out.snapshot_installed))
                self.cluster.invariants.on_snapshot_loaded(self)
            if out.high_watermark is not None:
                self.cluster.invariants.on_high_watermark(self, out.high_watermark)
                self.apply_to(out.high_watermark)
            self.wake_at_ms = out.wake_at_ms
            # 4. a completed flush may move the leader's high watermark
            if flushed:
                out = self.core.tick(now_ms)
            elif out.snapshot_suggested and self.sm.next_offset > self.log.log_start_offset:
                _, out = self.core.create_snapshot(self.sm.next_offset, self.sm.snapshot_bytes(), now_ms)
            else:
                out = None

    def send(self, out: Output, now_ms: int) -> None:
        for m in out.messages:
                if m.is_request:
                    self.cluster.network.send(
                        now_ms,
                        self.node_id,
                        m.destination_id,
                        m.message,
                        m.correlation,
                        source_incarnation=self.incarnation,
                    )
                else:
                    token = m.correlation
                    assert isinstance(token, RequestToken)
                    self.cluster.network.send(
                        now_ms,
                        self.node_id,
                        token.source_id,
                        m.message,
                        token.correlation,
                        source_incarnation=self.incarnation,
                        destination_incarnation=token.source_incarnation,
                    )

    def apply_to(self, high_watermark: int) -> None:
        if self.sm.next_offset >= high_watermark:
            return
        for batch in self.disk.batches(self.sm.next_offset, high_watermark):
            assert batch.base_offset == self.sm.next_offset, (batch.base_offset, self.sm.next_offset)
            assert batch.end_offset <= high_watermark, "the high watermark falls inside a batch"
            for i, record in enumerate(batch.records):
                entry = (batch.base_offset + i, batch.epoch, batch.control, record)
                self.cluster.invariants.on_apply(self, entry)
                self.sm.entries.append(entry)
            self.sm.next_offset = batch.end_offset
        assert self.sm.next_offset == high_watermark, (self.sm.next_offset, high_watermark)

    def is_leader(self) -> bool:
        return self.core is not None and isinstance(self.core.state, LeaderState)

    def receive(self, flight: Flight, now_ms: int) -> None:
        """Deliver a message off the network (dropped if this node is down, or
        if it is a response meant for an earlier life of this node)."""
        if self.core is None:
            return
        if flight.destination_incarnation is not None and flight.destination_incarnation != self.incarnation:
            return
        correlation = flight.correlation
        if isinstance(flight.message, REQUEST_TYPES):
            correlation = RequestToken(flight.source_id, flight.source_incarnation, flight.correlation)
        # Which disk the sender ran on when it sent this: the truth the checks compare with.
        source = self.cluster.nodes[flight.source_id].directory_by_incarnation.get(flight.source_incarnation)
        self.deliver(Inbound(flight.source_id, flight.message, correlation), now_ms, source)
