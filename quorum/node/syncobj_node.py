"""PysyncobjNode: the metadata quorum on pysyncobj's Raft instead of raftka's own.

`quorum.engine=pysyncobj` on the controllers swaps `RaftNode` for this
class; the controller (`ControllerService`), the records (the same cbor2
batches) and the brokers do not change.

How it works
------------
- Each controller runs a `SyncObj` (pysyncobj's thread, its own TCP port:
  `quorum.pysyncobj.port`, default the controller port + 100, on the
  controller listener's host). Its one replicated method, `commit`, takes a
  batch `(kind, epoch, base_offset, records)`.
- pysyncobj calls `commit` on every member in commit order. The method is a
  deterministic state machine over two numbers, the metadata log end offset
  and the current controller epoch:
  * a `leader` entry (a new pysyncobj leader announcing its term) is taken
    if its epoch is above the current one; it becomes the epoch and takes
    one offset (a LeaderChange control batch, as in KRaft);
  * a `records` entry is taken only if its epoch is the current epoch and
    its base offset is the current end offset: a stale controller's writes
    (an older epoch, or decided against an image that has since moved) are
    rejected on every member alike (fencing).
  Taken entries go, in that order, to the trio side, which appends them to
  the controller's own `__cluster_metadata` log (the same storage as the
  default engine) at the same offsets on every controller, and applies them
  to the image.
- The active controller is pysyncobj's leader once its own `leader` entry
  has come back through `commit` (every earlier entry is then applied);
  the controller epoch is pysyncobj's term.
- Brokers fetch the log as observers with the same Raft Fetch as ever:
  the active controller answers from its local log (everything in it is
  committed, so the high watermark is its end); the others answer
  NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH naming the leader.

What it does not promise (docs/durability.md): pysyncobj writes its journal
(`pysyncobj.journal` beside the metadata log) through mmap and never
fsyncs it, nor is the local log fsynced per commit. A SIGKILL of any or all
controllers loses nothing (the page cache survives a process); a power
failure or kernel crash can lose the newest committed records. The journal
is never compacted (pysyncobj's full-dump snapshots would not carry the
local log), so it grows with the metadata log; metadata snapshots are not
written by this engine.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from common.errors import ConfigError
from quorum.metadata.image import MetadataImage
from quorum.node.applier import MetadataState, apply_committed
from quorum.node.events import Build, MetadataListener, ProposalTooLargeError, Staged
from quorum.node.metadata_log import (
    DEFAULT_SEGMENT_BYTES,
    MAX_BATCH_BYTES,
    metadata_log_dir,
    open_metadata_log,
)
from quorum.node.publish import LeadershipListener, Publisher
from quorum.raft import (
    AppendResult,
    DivergingEpoch,
    LeaderAndEpoch,
    NotLeaderError,
    QuorumStatus,
    SnapshotId,
)
from quorum.raft.errors import ErrorCode
from quorum.raft.log import VALID, validate_fetch_position
from quorum.raft.messages import (
    NO_LEADER,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
)
from quorum.raft.status import ReplicaStatus
from quorum.raft.storage_log import StorageReplicatedLog

_log = logging.getLogger("quorum.node.syncobj")

#: pysyncobj's port is the controller port plus this, unless quorum.pysyncobj.port says otherwise.
PORT_OFFSET = 100
JOURNAL_FILE = "pysyncobj.journal"
POLL_S = 0.02
FETCH_MAX_BYTES = 1024 * 1024
#: Taken entries whose pysyncobj index DescribeQuorum can map to a metadata offset (the newest).
MAX_MAPPED_ENTRIES = 100_000
#: A peer unreachable this long gets a warning naming the settings to check.
UNREACHABLE_WARN_S = 5.0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def pysyncobj_addresses(voters: dict[int, tuple[str, int]], port: str | None) -> dict[int, str]:
    """Each voter's pysyncobj address: its controller host and the port
    `quorum.pysyncobj.port` gives, either one port for all (controllers on
    distinct hosts) or `id@port,...`; unset: its controller port + 100."""
    if port is None or not port.strip():
        return {n: f"{h}:{p + PORT_OFFSET}" for n, (h, p) in voters.items()}
    try:
        if "@" in port:
            ports = {int(i): int(p) for i, p in (item.split("@", 1) for item in port.split(","))}
        else:
            ports = {n: int(port) for n in voters}
    except ValueError:
        raise ConfigError(f"quorum.pysyncobj.port={port!r}: expected a port or id@port,... for every "
                          "controller") from None
    if set(ports) != set(voters) or not all(0 < p < 65536 for p in ports.values()):
        raise ConfigError(f"quorum.pysyncobj.port={port!r}: expected a port (1..65535) for each of the "
                          f"controllers {sorted(voters)}")
    return {n: f"{h}:{ports[n]}" for n, (h, _) in voters.items()}


def _make_syncobj(self_address: str, others: list[str], journal: str, sink: Callable[[tuple], None],
                  timeout_s: float) -> Any:
    from pysyncobj import (  # imported here: only this engine needs it
        SyncObj,
        SyncObjConf,
        replicated,
    )

    class MetadataJournal(SyncObj):  # type: ignore[misc]
        def __init__(self) -> None:
            # Set before SyncObj.__init__, so pysyncobj counts these as its own
            # attributes, not replicated state (it would pickle them otherwise).
            self._sink = sink
            self._end: int | None = None
            self._epoch = -1
            conf = SyncObjConf(
                journalFile=journal, dynamicMembershipChange=False,
                # Never compact: a full dump would not carry the local log.
                logCompactionMinEntries=2**62, logCompactionMinTime=2**62,
                raftMinTimeout=timeout_s / 2, raftMaxTimeout=timeout_s, connectionTimeout=max(3.5, timeout_s * 2),
                appendEntriesPeriod=min(0.1, timeout_s / 10),
                # Send each new entry at once rather than on the next append period: pysyncobj's
                # batching default puts one period (~100 ms) on every commit (measured: p50 102 ms
                # against 1.5 ms for one writer, 148 against 453 records/s for 16).
                appendEntriesUseBatch=False, commandsWaitLeader=False)
            super().__init__(self_address, others, conf)

        @replicated
        def commit(self, kind: str, epoch: int, base: int, records: Any) -> int | None:
            # pysyncobj counts this entry as raftLastApplied once it returns: its index in
            # pysyncobj's log, which DescribeQuorum maps peers' match indexes through.
            index = self.raftLastApplied + 1
            end = base if self._end is None else self._end  # the first entry ever sets the start
            if kind == "leader":
                if epoch <= self._epoch:
                    return None
                self._epoch, self._end = epoch, end + 1
                sink(("leader", epoch, end, records, index))
                return end
            if epoch != self._epoch or base != end:
                return None
            self._end = end + len(records)
            sink(("records", epoch, end, records, index))
            return end

    return MetadataJournal()


class PysyncobjNode:
    """A controller's quorum member on pysyncobj, with `RaftNode`'s surface."""

    engine = "pysyncobj"

    def __init__(self, *, node_id: int, voters: dict[int, tuple[str, int]], log_dir: str, cluster_id: str,
                 pysyncobj_port: str | None = None, election_timeout_ms: int = 1000,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        if node_id not in voters:
            raise ConfigError(f"quorum.engine=pysyncobj: node {node_id} is not in controller.quorum.voters")
        self.node_id = node_id
        self.voter_addresses = dict(voters)
        self.is_voter = True
        self.cluster_id = cluster_id
        self.sync_addresses = pysyncobj_addresses(voters, pysyncobj_port)
        if len(set(self.sync_addresses.values())) != len(voters):
            raise ConfigError(f"quorum.pysyncobj.port={pysyncobj_port} gives two controllers the same address "
                              f"{sorted(self.sync_addresses.values())}: unset it (controller port + {PORT_OFFSET})")
        self._by_address = {a: n for n, a in self.sync_addresses.items()}
        self._timeout_s = election_timeout_ms / 1000
        self._log_dir = log_dir
        self._segment_bytes = segment_bytes
        self._publisher = Publisher()
        self.state = MetadataState()
        self.log: StorageReplicatedLog | None = None
        self._sync: Any = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._active_epoch: int | None = None
        self._leader = LeaderAndEpoch(None, 0)
        self._next_base: int | None = None  # where the active controller's next proposal goes
        self._in_flight = 0
        self._resync = False
        self._announced = -1
        self._status: dict[str, Any] = {}
        self._unreachable_since: dict[int, float] = {}
        # pysyncobj's index of each taken entry and the metadata log end after it (for DescribeQuorum).
        self._entry_indexes: list[int] = []
        self._entry_ends: list[int] = []
        self._last_contact_ms: dict[int, int] = {}
        self._last_caught_up_ms: dict[int, int] = {}
        self._warned_unreachable: set[int] = set()

    # --- RaftNode's views --------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.state.image

    @property
    def applied_offset(self) -> int:
        return self.state.next_offset

    @property
    def leader(self) -> LeaderAndEpoch:
        return self._leader

    @property
    def is_leader(self) -> bool:
        return self._leader.leader_id == self.node_id

    @property
    def is_active(self) -> bool:
        return self._active_epoch is not None

    @property
    def high_watermark(self) -> int | None:
        return None if self.log is None else self.log.log_end_offset

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    def subscribe(self, callback: MetadataListener, *, broker_id: int | None = None) -> None:
        self._publisher.subscribe(callback, broker_id)

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        self._publisher.add_leadership_listener(listener)

    async def wait_for_change(self) -> None:
        await self._publisher.wait_for_change()

    async def wait_until_applied(self, offset: int) -> None:
        while self.state.next_offset < offset:
            await self.wait_for_change()

    def engine_configs(self) -> dict[str, str]:
        """This member's engine settings, as DescribeConfigs of its node answers them (quorum.node.handler)."""
        return {"quorum.engine": self.engine,
                "quorum.pysyncobj.port": self.sync_addresses[self.node_id].rsplit(":", 1)[1]}

    def _offset_at(self, index: int | None) -> int:
        """The metadata log end offset once pysyncobj's entry `index` is in a
        log (-1 if no taken entry is that old): where a peer whose match index is
        `index` stands in this log (Raft's logs agree up to a match index)."""
        if index is None:
            return -1
        i = bisect.bisect_right(self._entry_indexes, index) - 1
        return self._entry_ends[i] if i >= 0 else -1

    def describe(self) -> QuorumStatus:
        """DescribeQuorum's view from pysyncobj's status: the epoch is its term,
        the high watermark its commit point (the local log holds committed
        entries only), a peer's log end offset its match index in metadata
        offsets, its last fetch the last time (sampled every POLL_S) pysyncobj
        had it connected, its last caught up the last time its match index
        reached the commit index."""
        assert self.log is not None
        now = self.now_ms()
        voters = []
        for n in sorted(self.voter_addresses):
            if n == self.node_id:
                voters.append(ReplicaStatus(n, self.log.log_end_offset, now, now))
                continue
            match = self._status.get(f"match_idx_server_{self.sync_addresses[n]}")
            voters.append(ReplicaStatus(n, self._offset_at(match), self._last_contact_ms.get(n, -1),
                                        self._last_caught_up_ms.get(n, -1)))
        return QuorumStatus(node_id=self.node_id, role="Leader" if self.is_active else "Follower",
                            leader_id=self._leader.leader_id, epoch=self._leader.epoch,
                            high_watermark=self.log.log_end_offset, log_start_offset=self.log.log_start_offset,
                            log_end_offset=self.log.log_end_offset, voters=tuple(voters), observers=())

    # --- proposals ---------------------------------------------------------------------

    async def propose(self, records: Sequence[bytes]) -> AppendResult:
        records = list(records)
        return await self.propose_with(lambda base, epoch: records)

    async def propose_with(self, build: Build) -> AppendResult:
        """`build(base_offset, epoch)` with the offset its records will get;
        returns once committed; NotLeaderError if this controller is not, or
        stops being, the active one first (its entry is then rejected everywhere)."""
        epoch = self._active_epoch
        if epoch is None or self._next_base is None or self._resync:
            raise NotLeaderError(self._leader.leader_id, self._leader.epoch)
        base = self._next_base
        built = build(base, epoch)
        records = [bytes(r) for r in (built.records if isinstance(built, Staged) else built)]
        size = sum(len(r) for r in records)
        if size > MAX_BATCH_BYTES // 2:
            raise ProposalTooLargeError(
                f"a proposal of {size} bytes exceeds the {MAX_BATCH_BYTES // 2} a metadata batch takes")
        if not records:  # nothing to append: wait for what is in flight
            await self.wait_until_applied(base)
            return AppendResult(base, base - 1, epoch)
        self._next_base = base + len(records)
        done = trio.Event()
        outcome: list[Any] = []
        token = self._token
        assert token is not None

        def callback(result: Any, error: Any) -> None:  # in pysyncobj's thread
            try:
                token.run_sync_soon(lambda: (outcome.append((result, error)), done.set()))
            except trio.RunFinishedError:
                pass

        self._in_flight += 1
        try:
            self._sync.commit("records", epoch, base, records, callback=callback)
            await done.wait()
        finally:
            self._in_flight -= 1
        result, _error = outcome[0]  # an error (pysyncobj dropped it) reads as a rejection
        if result != base:
            # Rejected or dropped: every later proposal of ours is now at the wrong
            # offset; stop proposing until those are answered, then start over.
            self._resync = True
            self._maybe_resync()
            raise NotLeaderError(self._leader.leader_id, self._leader.epoch)
        await self.wait_until_applied(base + len(records))
        return AppendResult(base, base + len(records) - 1, epoch)

    def _maybe_resync(self) -> None:
        if self._resync and self._in_flight == 0 and self.log is not None:
            self._resync = False
            self._next_base = self.log.log_end_offset

    async def resign(self) -> None:
        """pysyncobj has no hand-over: the others elect after its election timeout."""

    # --- running -----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[PysyncobjNode] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.log = await trio.to_thread.run_sync(lambda: open_metadata_log(
            self._log_dir, clock_ms=wall_clock_ms, segment_bytes=self._segment_bytes))
        journal = os.path.join(metadata_log_dir(self._log_dir), JOURNAL_FILE)
        address = self.sync_addresses[self.node_id]
        self.check_bindable()
        token = self._token

        def sink(entry: tuple) -> None:  # pysyncobj's thread, commit order
            token.run_sync_soon(self._on_committed, entry)

        others = [a for n, a in sorted(self.sync_addresses.items()) if n != self.node_id]
        _log.info("node %d: pysyncobj on %s, peers %s, journal %s (log %d..%d)", self.node_id, address, others,
                  journal, self.log.log_start_offset, self.log.log_end_offset)
        # Built in this (the process's main) thread, not a worker: pysyncobj's
        # tick thread stops once the thread that built it has exited, and trio
        # retires idle worker threads after a few seconds.
        self._sync = _make_syncobj(address, others, journal, sink, self._timeout_s)
        try:
            self._apply()
            task_status.started(self)
            while True:
                self._poll()
                await trio.sleep(POLL_S)
        finally:
            sync, self._sync = self._sync, None
            with trio.CancelScope(shield=True):  # stopping is a cancel: still stop pysyncobj's thread first
                await trio.to_thread.run_sync(sync.destroy_synchronous)
            if self.log is not None:
                self.log.flush(self.log.log_end_offset)
                self.log.storage_log.close()

    def check_bindable(self) -> None:
        """ConfigError naming quorum.pysyncobj.port if pysyncobj's port is taken
        (pysyncobj itself would only retry the bind, silently, forever)."""
        import socket

        address = self.sync_addresses[self.node_id]
        host, port = address.rsplit(":", 1)
        sock = socket.socket()
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
        except OSError as exc:
            raise ConfigError(f"quorum.engine=pysyncobj: cannot bind pysyncobj's port {address} ({exc.strerror}); "
                              f"set quorum.pysyncobj.port to free ports (default: each controller port + "
                              f"{PORT_OFFSET})") from None
        finally:
            sock.close()

    def _poll(self) -> None:
        """pysyncobj's leader and term, and what follows from them."""
        status = self._sync.getStatus()
        self._status = status
        term = int(status["raft_term"])
        leader = status.get("leader")
        leader_id = self._by_address.get(str(leader.address if hasattr(leader, "address") else leader)) \
            if leader is not None else None
        old = self._leader
        self._leader = LeaderAndEpoch(leader_id, term)
        if self._active_epoch is not None and (leader_id != self.node_id or term != self._active_epoch):
            lost, self._active_epoch, self._next_base = self._active_epoch, None, None
            _log.info("node %d is no longer the active controller of epoch %d", self.node_id, lost)
            self._publisher.leader_lost(lost)
        if leader_id == self.node_id and self._active_epoch is None and self._announced < term:
            # Announce this term through the log; active once it comes back applied.
            self._announced = term
            assert self.log is not None
            self._sync.commit("leader", term, self.log.log_end_offset, self.node_id)
        now = time.monotonic()
        now_ms = self.now_ms()
        commit_idx = status.get("commit_idx", 0)
        for n, address in self.sync_addresses.items():
            if n != self.node_id and status.get(f"partner_node_status_server_{address}") == 2:
                self._last_contact_ms[n] = now_ms
                if (status.get(f"match_idx_server_{address}") or 0) >= commit_idx:
                    self._last_caught_up_ms[n] = now_ms
            if n == self.node_id or status.get(f"partner_node_status_server_{address}") == 2:
                self._unreachable_since.pop(n, None)
                self._warned_unreachable.discard(n)
                continue
            since = self._unreachable_since.setdefault(n, now)
            if now - since > UNREACHABLE_WARN_S and n not in self._warned_unreachable:
                self._warned_unreachable.add(n)
                _log.warning("node %d: pysyncobj cannot reach controller %d at %s for %.0f s: check that it runs "
                             "with quorum.engine=pysyncobj (every controller must) and that quorum.pysyncobj.port "
                             "gives the same ports on every controller", self.node_id, n, address, now - since)
        if old != self._leader:
            _log.info("node %d: pysyncobj leader %s in term %d", self.node_id, leader_id, term)
            self._publisher.changed()

    def _on_committed(self, entry: tuple) -> None:
        """An entry the state machine took, in commit order (trio thread)."""
        log = self.log
        if log is None:
            return
        kind, epoch, base, payload, index = entry
        self._entry_indexes.append(index)
        self._entry_ends.append(base + (1 if kind == "leader" else len(payload)))
        if len(self._entry_indexes) > 2 * MAX_MAPPED_ENTRIES:
            # Bounded: a peer further behind than this shows log end offset -1.
            del self._entry_indexes[:MAX_MAPPED_ENTRIES], self._entry_ends[:MAX_MAPPED_ENTRIES]
        end = log.log_end_offset
        if base < end:
            pass  # in the local log already (pysyncobj replays its journal from the start)
        elif base > end:
            _log.error("node %d: committed metadata at offset %d but the local log ends at %d; the local log lost "
                       "records pysyncobj committed (its journal is not fsynced)", self.node_id, base, end)
            return
        elif kind == "leader":
            log.append_leader_change(epoch, payload, sorted(self.voter_addresses), [payload])
        else:
            log.append_as_leader(payload, epoch)
        self._apply()
        if kind == "leader" and payload == self.node_id and self._leader.epoch == epoch \
                and self._leader.leader_id == self.node_id and self._active_epoch is None:
            self._active_epoch = epoch
            self._next_base = log.log_end_offset
            self._resync = False
            _log.info("node %d is the active controller of epoch %d from offset %d", self.node_id, epoch, base)
            self._publisher.leader_active(epoch, self.state.image)
        self._maybe_resync()
        self._publisher.changed()

    def _apply(self) -> None:
        assert self.log is not None
        hw = self.log.log_end_offset
        if self.state.next_offset >= hw:
            return
        old = self.state.image
        while self.state.next_offset < hw:
            self.state = apply_committed(self.state, self.log.read, hw, collections.deque(), None, 1 << 30)
        self._publisher.image_changed(old, self.state.image)

    # --- the controller listener's Raft requests (observers' Fetch) ----------------------

    async def handle_request(self, source_id: int, message: Message) -> Message:
        log = self.log
        assert log is not None
        epoch = self._leader.epoch
        leader_id = NO_LEADER if self._leader.leader_id is None else self._leader.leader_id
        if isinstance(message, FetchSnapshotRequest):
            size = log.snapshot_size(message.snapshot_id)
            chunk = b"" if size is None else log.read_snapshot(message.snapshot_id, message.position, message.max_bytes)
            return FetchSnapshotResponse(
                error_code=ErrorCode.SNAPSHOT_NOT_FOUND if size is None else ErrorCode.NONE, leader_id=leader_id,
                leader_epoch=epoch, snapshot_id=message.snapshot_id, size=-1 if size is None else size,
                position=message.position, unaligned_records=chunk)
        if not isinstance(message, FetchRequest):
            raise ConfigError(f"quorum.engine=pysyncobj: node {self.node_id} got a raftka Raft request "
                              f"({type(message).__name__}) from node {source_id}: every controller must have the "
                              "same quorum.engine")
        active = self._active_epoch
        if active is None or message.current_leader_epoch != active:
            if active is not None and message.current_leader_epoch < active:
                error = ErrorCode.FENCED_LEADER_EPOCH
            elif message.current_leader_epoch > epoch:
                error = ErrorCode.UNKNOWN_LEADER_EPOCH
            elif message.current_leader_epoch < epoch:
                error = ErrorCode.FENCED_LEADER_EPOCH
            else:
                error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            if active is None and leader_id == self.node_id:
                leader_id = NO_LEADER  # not active yet: let the fetcher retry
            return FetchResponse(error_code=error, leader_id=leader_id, leader_epoch=epoch, high_watermark=-1,
                                 log_start_offset=log.log_start_offset)
        verdict = validate_fetch_position(log, message.fetch_offset, message.last_fetched_epoch)
        records = b""
        if verdict is VALID:
            if message.fetch_offset >= log.log_end_offset and message.max_wait_ms > 0:
                with trio.move_on_after(message.max_wait_ms / 1000):
                    while message.fetch_offset >= log.log_end_offset and self._active_epoch == active:
                        await self.wait_for_change()
            if self._active_epoch != active:
                return await self.handle_request(source_id, message)
            if message.fetch_offset < log.log_end_offset:
                records = log.read(message.fetch_offset, min(message.max_bytes, FETCH_MAX_BYTES), log.log_end_offset)
        return FetchResponse(
            error_code=ErrorCode.NONE, leader_id=self.node_id, leader_epoch=active,
            high_watermark=log.log_end_offset, log_start_offset=log.log_start_offset,
            diverging_epoch=verdict if isinstance(verdict, DivergingEpoch) else None,
            snapshot_id=verdict if isinstance(verdict, SnapshotId) else None, records=records)
