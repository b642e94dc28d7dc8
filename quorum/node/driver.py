"""RaftNode: the trio driver that runs a RaftCore as a voter or an observer.

Theory of operation
-------------------
One task, the *driver loop*, owns the `RaftCore`, the metadata log and
the applied `MetadataState`; nothing else touches them. Everything that
happens reaches it as an event on one bounded channel: a Raft request from
the server (`handle_request`), the answer to a request it sent (from
`network.RaftChannel`), a proposal (`propose`), a function to run
(`snapshots`, `resign`). Each turn of the loop:

1. takes every event already waiting (at least one, or wakes at the core's
   `wake_at_ms`) and feeds them to the core, in order; consecutive
   proposals are coalesced into one `core.propose`, so N concurrent
   writers cost one batch append and one fsync (a turn decides a bounded
   amount, see TURN_PROPOSAL_BYTES; the rest wait for the next turn);
2. **persists**: the newest election state to the `quorum-state` file and
   the log up to the largest `flush_log_to_offset`, both fsynced, in a
   worker thread while the loop task waits (events keep queueing meanwhile,
   which is what makes the next turn's batch large: group commit);
3. **sends** every message of those outputs, in order; a leader whose step
   changed no election state sends *before* step 2 instead
   (`Output.send_before_flush`), so its followers fetch, append and fsync
   while its own fsync runs;
4. **applies** committed records (below the high watermark) to the image,
   publishes it to subscribers, and completes proposals whose records are
   committed; a completed flush is followed by a `tick`, and the loop goes
   back to 2 with its output (a leader counts its own log only up to what
   is flushed). A long backlog (a node that just restarted on its log) is
   replayed by a task in a worker thread instead, so the loop stays quick
   to answer votes and Fetches.

Durability
----------
- The quorum-state file (epoch, leader id, voted id) is fsynced before any
  message of the step that changed it is sent: a vote is durable before it
  is granted on the wire; a new epoch before anyone hears of it.
- The log is flushed (fsync of the segments and, when segments were
  created, the directory) up to `flush_log_to_offset` before any message of
  that step is sent: a voter's Fetch names its log end offset, which the
  leader counts toward the commit, so that offset must survive a crash; the
  leader's own log counts only up to what is flushed (which is why its
  Fetch answers need not wait for its flush).
- Snapshots are written atomically (temp file, fsync, rename, fsync dir)
  before the log prefix they replace is deleted.
- A write the metadata log's disk refuses (full, failed, read-only) stops
  the node with `MetadataLogDiskError`, naming the directory, the cause and
  the fix, as Kafka stops a node whose metadata log directory fails
  (KIP-858): its metadata cannot go on, and what it wrote is recovered from
  its files at the next start.

Proposals and the active controller
-----------------------------------
`propose_with(build)` runs `build(base_offset, epoch)` inside the loop,
with the offset its records will get, so a caller (the controller) can
decide against a working image that includes everything appended before
it, at the right offsets. It returns once the records are committed, and
raises `NotLeaderError` if this node is not, or stops being, the leader of
that epoch first (Kafka fails a renounced controller's pending writes).
Leadership listeners hear `on_leader_active(epoch, image)` once this node
leads and has applied its own epoch's LeaderChange (so the image holds
every record committed before the epoch: KIP-631's "the new active
controller replays the log first"), and `on_leader_lost(epoch)`.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio

from quorum.metadata.image import MetadataImage
from quorum.node.applier import MetadataState
from quorum.node.applying import Applying
from quorum.node.describe_quorum import discover_voters
from quorum.node.voter_config import parse_directory_id
from quorum.node.events import Build, Call, MetadataListener, Proposal, ProposalTooLargeError, Staged, Waiter
from quorum.node.metadata_log import DEFAULT_SEGMENT_BYTES, MAX_BATCH_BYTES, metadata_log_dir, open_metadata_log
from quorum.node.network import RaftChannel
from quorum.node.publish import LeadershipListener, Publisher
from quorum.node.quorum_state import QuorumStateFile
from quorum.node.raft_stats import RaftStats
from quorum.raft import (
    AppendResult,
    ElectionState,
    Inbound,
    LeaderAndEpoch,
    NotLeaderError,
    Output,
    QuorumConfig,
    QuorumStatus,
    RaftCore,
    RaftUsageError,
)
from quorum.raft.messages import Message
from quorum.raft.storage_log import StorageReplicatedLog
from common.errors import ConfigError, RaftkaError
from common.meta_properties import read_directory_id
from common.security.client import ClientSecurity
from common.wire import ConnectionPool

_log = logging.getLogger("quorum.node.driver")

EVENT_QUEUE_SIZE = 1024
# A turn of the loop must stay short: while it runs, no Fetch or vote is
# handled, and a turn that outlasts controller.quorum.fetch.timeout.ms on a
# busy machine looks like a dead leader. So a turn decides proposals worth
# at most TURN_PROPOSAL_BYTES of records (always at least one; the rest
# wait a turn) and applies at most APPLY_BYTES_PER_TURN of committed
# records (quorum.node.applying).
TURN_PROPOSAL_BYTES = 256 * 1024
SLOW_TURN_MS = 500


class MetadataLogDiskError(RaftkaError):
    """The disk of the metadata log refused a write: the node stops (see Durability)."""

    def __init__(self, log_dir: str, exc: OSError) -> None:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space on that disk (or lower retention.bytes / retention.ms), then start the node again"
        elif exc.errno == errno.EIO:
            fix = "check the device (dmesg) and move the log directory off it, then start the node again"
        else:
            fix = "check the directory's permissions and disk, then start the node again"
        super().__init__(f"the metadata log in {log_dir} cannot be written ({name}: {exc.strerror}); this node "
                         f"stops, as a Kafka node whose metadata log directory fails does. Fix: {fix}; it "
                         "recovers the log from its files")
        self.errno = exc.errno


def wall_clock_ms() -> int:
    """Record batch timestamps are wall-clock time; timers use trio's monotonic clock."""
    return time.time_ns() // 1_000_000

class RaftNode(Applying):
    """A member of the metadata quorum: a voter if `node_id` is in `voters`, else an observer.

    Build it, then `await nursery.start(node.run)`; cancel to stop (or
    `await node.resign()` first, for a leader's graceful hand-over).
    """

    def __init__(
        self,
        *,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        log_dir: str,
        cluster_id: str,
        config: QuorumConfig | None = None,
        rng: random.Random | None = None,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        client_security: ClientSecurity | None = None,
        bootstrap_servers: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self.node_id = node_id
        #: `controller.quorum.bootstrap.servers`: where a node of a dynamic
        #: quorum whose log names no voters yet asks for them (DescribeQuorum).
        self.bootstrap_servers = tuple(bootstrap_servers)
        #: TLS and SASL of this node's connections to the voters (the controller listener's).
        self.client_security = client_security
        self.voter_addresses = dict(voters)
        self.is_voter = node_id in voters
        self.cluster_id = cluster_id
        self.config = config or QuorumConfig()
        self._rng = rng or random.Random()
        self._log_dir = log_dir
        self._segment_bytes = segment_bytes
        self._send_events, self._events = trio.open_memory_channel[Any](EVENT_QUEUE_SIZE)
        self._tokens = itertools.count()
        self._waiters: dict[Any, Waiter] = {}
        self._proposals: list[Proposal] = []
        self._precomputed: collections.deque[Proposal] = collections.deque()
        self._adopt_staged = True
        self._deferred: list[Any] = []
        self._publisher = Publisher()
        self._active_epoch: int | None = None
        self._role: tuple[str, int, int | None] = ("none", -1, None)
        self._turn_fsync_s = 0.0
        self._snapshotting = False
        self._replaying = False
        self._log_lock = trio.Lock()  # a log read by the replay task never overlaps a flush in its thread
        self._wake_at_ms = 0
        self.core: RaftCore | None = None
        self.log: StorageReplicatedLog | None = None
        self.state = MetadataState()
        self._channel: RaftChannel | None = None
        self._pool: ConnectionPool | None = None
        self._nursery: trio.Nursery | None = None
        #: Latencies and rates for the metrics (`quorum.node.metrics`).
        self.stats = RaftStats()
        self._voter_sets_seen: object = None

    # --- public views ----------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        """The committed metadata image (immutable; safe to keep)."""
        return self.state.image

    @property
    def applied_offset(self) -> int:
        """The next metadata log offset to apply: everything below is in `image`."""
        return self.state.next_offset

    @property
    def leader(self) -> LeaderAndEpoch:
        assert self.core is not None, "the node is not running"
        return self.core.leader_and_epoch

    @property
    def is_leader(self) -> bool:
        return self.core is not None and self.core.is_leader

    @property
    def is_active(self) -> bool:
        """Leader, with its epoch's LeaderChange applied (the active controller)."""
        return self._active_epoch is not None

    @property
    def high_watermark(self) -> int | None:
        return None if self.core is None else self.core.high_watermark

    engine = "raftka"

    def engine_configs(self) -> dict[str, str]:
        """This member's engine settings, as DescribeConfigs of its node answers them (quorum.node.handler)."""
        return {"quorum.engine": self.engine}

    def describe(self) -> QuorumStatus:
        assert self.core is not None, "the node is not running"
        return self.core.describe(self.now_ms())

    def subscribe(self, callback: MetadataListener, *, broker_id: int | None = None) -> None:
        """Call `callback(image, delta)` after every change of the committed
        image, in the driver task (be quick; start tasks for slow work).
        `delta` is what changed for `broker_id`'s replicas (None without one)."""
        self._publisher.subscribe(callback, broker_id)

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        """`listener.on_leader_active(epoch, image)` / `listener.on_leader_lost(epoch)`, in the driver task."""
        self._publisher.add_leadership_listener(listener)

    async def wait_for_change(self) -> None:
        """Return after the next turn of the loop that changed the node's view."""
        await self._publisher.wait_for_change()

    async def wait_until_applied(self, offset: int) -> None:
        """Wait until every record below `offset` is in `image`."""
        while self.state.next_offset < offset:
            await self.wait_for_change()

    # --- entry points for other tasks ---------------------------------------------------

    async def handle_request(self, source_id: int, message: Message) -> Message:
        """Hand a Raft request to the core; its answer (a Fetch may be parked
        up to its max wait first)."""
        token = ("in", next(self._tokens))
        waiter = Waiter()
        self._waiters[token] = waiter
        try:
            await self._send_events.send(Inbound(source_id, message, token))
            return await waiter.wait()
        finally:
            self._waiters.pop(token, None)

    async def propose(self, records: Sequence[bytes]) -> AppendResult:
        """Append `records` as (part of) one batch; return once committed."""
        records = list(records)
        return await self.propose_with(lambda base_offset, epoch: records)

    async def propose_with(self, build: Build) -> AppendResult:
        """Run `build(base_offset, epoch)` in the driver loop and append the
        records it returns at base_offset; return once they are committed
        (with no records: once everything appended before is committed)."""
        proposal = Proposal(build=build, queued_at=trio.current_time())
        await self._send_events.send(proposal)
        return await proposal.wait()

    async def call(self, fn: Callable[[int], Output | None]) -> Any:
        """Run `fn(now_ms)` in the driver loop; an Output it returns is obeyed."""
        call = Call(fn=fn)
        await self._send_events.send(call)
        return await call.wait()

    async def resign(self) -> None:
        """Graceful shutdown of a leader: hand over with EndQuorumEpoch (KIP-595)."""
        assert self.core is not None
        await self.call(lambda now_ms: self.core.resign(now_ms))  # type: ignore[union-attr]

    # --- running ---------------------------------------------------------------------------

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    async def run(self, *, task_status: trio.TaskStatus[RaftNode] = trio.TASK_STATUS_IGNORED) -> None:
        log = self.log = await trio.to_thread.run_sync(lambda: open_metadata_log(
            self._log_dir, clock_ms=wall_clock_ms, segment_bytes=self._segment_bytes))
        quorum_state = QuorumStateFile(metadata_log_dir(self._log_dir), self.cluster_id)
        voter_directory_ids: dict[int, Any] = {}
        try:
            dynamic = log.latest_voters() is not None
            if dynamic:
                self._adopt_log_voters()
            elif not self.voter_addresses:
                if not self.bootstrap_servers:
                    raise ConfigError("this node knows no voters: set controller.quorum.voters (a static quorum) or "
                                      "controller.quorum.bootstrap.servers (a dynamic one)")
                self.voter_addresses, voter_directory_ids = await discover_voters(
                    self.bootstrap_servers, self.config.controller_quorum_request_timeout_ms)
                self.is_voter = self.node_id in self.voter_addresses
                dynamic = True
            # In a dynamic quorum any node may be a voter now or later: its vote is kept either way.
            election = quorum_state.read() if self.is_voter or dynamic else None
            snapshot = log.latest_snapshot_id
            if snapshot is not None:
                self.state, _ = await trio.to_thread.run_sync(self.state.load_snapshot, log.snapshot_data(snapshot))
            self.core = RaftCore(node_id=self.node_id, voters=set(self.voter_addresses), log=log, rng=self._rng,
                                 now_ms=self.now_ms(), config=self.config, election_state=election,
                                 cluster_id=self.cluster_id, directory_id=self._directory_id(),
                                 voter_directory_ids=voter_directory_ids)
            # A voter's id with another disk's directory id is not that voter (KIP-853).
            self.is_voter = self.core.is_voter
            _log.info("node %d starts as %s in epoch %d (log %d..%d, snapshot %s, %s)", self.node_id,
                      self.core.role, self.core.epoch, log.log_start_offset, log.log_end_offset, snapshot,
                      "voter" if self.is_voter else "observer")
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                request_timeout_ms = self.config.controller_quorum_request_timeout_ms
                peers = {n: a for n, a in self.voter_addresses.items() if n != self.node_id}
                pool = self._pool = ConnectionPool(nursery, peers, client_id=f"raftka-quorum-{self.node_id}",
                                                   connect_timeout_ms=request_timeout_ms,
                                                   security=self.client_security)
                self._channel = RaftChannel(
                    node_id=self.node_id, cluster_id=self.cluster_id, voters=frozenset(self.voter_addresses),
                    pool=pool, nursery=nursery, deliver=self._send_events.send,
                    request_timeout_ms=request_timeout_ms, followed_leader=self._followed_leader,
                    replay_backlog=self._replay_backlog)
                await self._obey([self.core.tick(self.now_ms())], quorum_state)
                task_status.started(self)
                try:
                    await self._loop(quorum_state)
                except OSError as exc:  # the loop's only I/O is the log's and the quorum-state file's
                    raise MetadataLogDiskError(self._log_dir, exc) from exc
        finally:
            stopped = NotLeaderError(None, self.core.epoch if self.core else 0)
            self._fail_proposals(stopped)
            for event in self._deferred:
                event.finish(error=stopped)
            try:
                log.storage_log.close()
            except OSError as exc:  # the same disk: what the close could not write is recovered at the start
                _log.error("node %d: closing the metadata log in %s failed (%s); it is recovered at the next "
                           "start", self.node_id, self._log_dir, exc)

    def _followed_leader(self) -> tuple[int | None, int]:
        core = self.core
        assert core is not None
        if core.role != "Follower":
            return None, core.epoch
        return core.leader_and_epoch.leader_id, core.epoch

    def _replay_backlog(self) -> int | None:
        """Committed records not yet applied (None while the HW is unknown)."""
        hw = self.high_watermark
        return None if hw is None else max(0, hw - self.state.next_offset)

    async def _loop(self, quorum_state: QuorumStateFile) -> None:
        core = self.core
        assert core is not None
        while True:
            events: list[Any] = list(self._deferred)
            self._deferred.clear()
            if not events:
                with trio.move_on_at(self._wake_at_ms / 1000):
                    events.append(await self._events.receive())
            while len(events) < EVENT_QUEUE_SIZE:
                try:
                    events.append(self._events.receive_nowait())
                except trio.WouldBlock:
                    break
            now_ms = self.now_ms()
            cpu_started = time.process_time()
            outputs = self._feed(events, now_ms)
            if now_ms >= self._wake_at_ms or not outputs:
                outputs.append(core.tick(now_ms))
            self._turn_fsync_s = 0.0
            await self._obey(outputs, quorum_state)
            turn_ms = self.now_ms() - now_ms
            if turn_ms > SLOW_TURN_MS:
                cpu_ms = (time.process_time() - cpu_started) * 1000
                _log.warning("node %d: a turn of the Raft loop took %d ms (%d events; %d ms of CPU in this "
                             "process, %d ms waiting for fsync): the machine is short of CPU or disk; turns beyond "
                             "controller.quorum.fetch.timeout.ms (%d ms) make peers start elections", self.node_id,
                             turn_ms, len(events), cpu_ms, self._turn_fsync_s * 1000,
                             self.config.controller_quorum_fetch_timeout_ms)

    def _feed(self, events: list[Any], now_ms: int) -> list[Output]:
        core = self.core
        assert core is not None and self.log is not None
        outputs: list[Output] = []
        batch: list[bytes] = []
        proposals: list[Proposal] = []

        def append_batch() -> None:
            nonlocal batch, proposals
            if batch:
                result, out = core.propose(batch, now_ms)
                assert result.base_offset == proposals[0].base_offset, (result, proposals[0].base_offset)
                outputs.append(out)
            self._proposals.extend(proposals)
            with_records = [p for p in proposals if p.last_offset >= p.base_offset]
            if any(p.image_after is None for p in with_records):
                # A staged image covers every record before it only while all
                # of this epoch's records are staged; stop adopting for good.
                self._adopt_staged = False
                self._precomputed.clear()
            if self._adopt_staged:
                self._precomputed.extend(with_records)
            batch, proposals = [], []

        turn_bytes = 0
        now = trio.current_time()
        for event in events:
            if isinstance(event, Proposal):
                if turn_bytes >= TURN_PROPOSAL_BYTES:
                    # Enough decisions for one turn: let the followers have these
                    # records (and the loop its Fetches) before deciding more.
                    self._deferred.append(event)
                    continue
                if not core.is_leader or self._active_epoch != core.epoch:
                    event.finish(error=NotLeaderError(core.leader_and_epoch.leader_id, core.epoch))
                    continue
                base = self.log.log_end_offset + len(batch)
                self.stats.event_queue.observe(now - event.queued_at)
                event.appended_at = now
                try:
                    built = event.build(base, core.epoch)
                except Exception as exc:  # the caller's decision failed: only its proposal does
                    event.finish(error=exc)
                    continue
                if isinstance(built, Staged):
                    records, event.image_after = [bytes(r) for r in built.records], built.image_after
                else:
                    records = [bytes(r) for r in built]
                size = sum(len(r) for r in records)
                if size > MAX_BATCH_BYTES // 2:
                    event.finish(error=ProposalTooLargeError(
                        f"a proposal of {size} bytes exceeds the {MAX_BATCH_BYTES // 2} a metadata batch takes"))
                    continue
                event.base_offset, event.last_offset, event.epoch = base, base + len(records) - 1, core.epoch
                batch += records
                turn_bytes += size
                proposals.append(event)
                continue
            append_batch()
            if isinstance(event, Inbound):
                if isinstance(event.correlation, tuple) and event.correlation[0] == "in" \
                        and event.correlation not in self._waiters:
                    continue  # its requester gave up
                outputs.append(core.handle(event, now_ms))
            elif isinstance(event, Call):
                try:
                    result = event.fn(now_ms)
                except Exception as exc:
                    event.finish(error=exc)
                    continue
                if isinstance(result, Output):
                    outputs.append(result)
                event.finish(result)
        append_batch()
        return outputs

    async def _obey(self, outputs: list[Output], quorum_state: QuorumStateFile) -> None:
        core = self.core
        log = self.log
        assert core is not None and log is not None and self._channel is not None
        while outputs:
            # 1. persist (see "Durability")
            election: ElectionState | None = None
            flush_to: int | None = None
            for out in outputs:
                if out.persist_election_state is not None:
                    election = out.persist_election_state
                if out.flush_log_to_offset is not None:
                    flush_to = max(flush_to or 0, out.flush_log_to_offset)
            # A leader's records go to the followers while its own flush runs
            # (Output.send_before_flush): one fsync per commit on the path, not two.
            send_first = all(out.send_before_flush for out in outputs)
            if send_first:
                self._send(outputs)
            if election is not None or flush_to is not None:
                started = trio.current_time()
                async with self._log_lock:
                    await trio.to_thread.run_sync(self._persist, quorum_state, election, flush_to)
                self._turn_fsync_s += trio.current_time() - started
            # 2. send
            if not send_first:
                self._send(outputs)
            # 3. apply
            installed = [o.snapshot_installed for o in outputs if o.snapshot_installed is not None]
            if installed:
                await self._load_snapshot(installed[-1])
            more = self._apply_committed()
            self._after_turn()
            if outputs[-1].snapshot_suggested:  # the newest view: a snapshot stored this turn reset it
                self._maybe_snapshot()
            self._wake_at_ms = self.now_ms() if more else outputs[-1].wake_at_ms
            # 4. a completed flush may advance the leader's high watermark
            outputs = [core.tick(self.now_ms())] if flush_to is not None else []

    def _send(self, outputs: list[Output]) -> None:
        assert self._channel is not None
        for out in outputs:
            for message in out.messages:
                if message.is_request:
                    self._channel.send(message)
                else:
                    waiter = self._waiters.pop(message.correlation, None)
                    if waiter is not None:
                        waiter.finish(message.message)

    def _persist(self, quorum_state: QuorumStateFile, election: ElectionState | None, flush_to: int | None) -> None:
        if election is not None:
            quorum_state.write(election)
        if flush_to is not None:
            assert self.log is not None
            self.log.flush(flush_to)

    def _directory_id(self) -> Any:
        """The `directory.id` of this node's metadata log dir (None before
        `raftka storage format` wrote one): its identity as a voter."""
        directory = read_directory_id(self._log_dir)
        return parse_directory_id(directory) if directory else None

    # --- applying (replay and snapshots: quorum.node.applying) ----------------------------------

    def _adopt_log_voters(self) -> None:
        """Take the voter set (and the voters' endpoints) from the latest
        VotersRecord in the log, committed or not (KIP-853)."""
        assert self.log is not None
        self._voter_sets_seen = self.log.voter_sets()
        infos = self.log.latest_voters()
        if infos is None:
            return
        addresses = {}
        for info in infos:
            address = info.address or self.voter_addresses.get(info.node_id)
            if address is not None:
                addresses[info.node_id] = address
        if addresses != self.voter_addresses:
            _log.info("node %d: the voters are now %s", self.node_id,
                      ", ".join(f"{n}@{h}:{p}" for n, (h, p) in sorted(addresses.items())))
        self.voter_addresses = addresses
        self.is_voter = self.node_id in addresses if self.core is None else self.core.is_voter
        if self._pool is not None:
            for node_id, (host, port) in addresses.items():
                if node_id != self.node_id:
                    self._pool.set_address(node_id, host, port)
        if self._channel is not None:
            self._channel.voters = frozenset(addresses)

    def _voter_set_only_in_snapshot(self) -> bool:
        """A dynamic quorum whose voter set is known only from the snapshot the
        log starts at (the one `storage format` wrote), not from a record."""
        assert self.log is not None
        records = self.log.voter_records()
        return self.log.log_start_offset == 0 and bool(records) and all(offset < 0 for offset, _ in records)

    async def _write_voter_set_into_log(self, epoch: int) -> None:
        """As Kafka's first leader does: append the voter set as a
        VotersRecord, so that every replica's log (observers' too) names the
        voters and their endpoints, and a node restarting needs no bootstrap
        server to find them."""
        while self.core is not None and self.core.is_leader and self.core.epoch == epoch:
            if not self._voter_set_only_in_snapshot():
                return
            done: list[bool] = []

            def append(now_ms: int, done: list[bool] = done) -> Output | None:
                core = self.core
                assert core is not None
                try:
                    _, output = core.change_voters(core.voters, now_ms, same_set=True)
                except (RaftUsageError, NotLeaderError):
                    return None  # a change pending or nothing committed in this epoch yet: retry
                done.append(True)
                return output

            await self.call(append)
            if done:
                _log.info("node %d wrote the voter set %s into the metadata log", self.node_id,
                          sorted(self.core.voters))
                return
            await trio.sleep(0.05)

    def _after_turn(self) -> None:
        core = self.core
        assert core is not None
        if self.log is not None and self.log.voter_sets() is not self._voter_sets_seen:
            self._adopt_log_voters()
        # Proposals: committed ones complete; a lost leadership fails the rest.
        if self._proposals:
            if not core.is_leader or core.epoch != self._proposals[0].epoch:
                self._fail_proposals(NotLeaderError(core.leader_and_epoch.leader_id, core.epoch))
            else:
                committed = min(core.high_watermark or 0, self.state.next_offset)
                still = []
                now = trio.current_time()
                for p in self._proposals:
                    if p.last_offset < committed:
                        if p.last_offset >= p.base_offset:  # records of its own: their commit latency
                            self.stats.commit_latency.record((now - p.appended_at) * 1000, now)
                        p.finish(AppendResult(p.base_offset, p.last_offset, p.epoch))
                    else:
                        still.append(p)
                self._proposals = still
        role = (core.role, core.epoch, core.leader_and_epoch.leader_id)
        now = trio.current_time()
        if self.log is not None:
            self.stats.on_turn(self.log.log_end_offset, core.is_leader, now)
        if role != self._role:
            self.stats.on_role(role[0], role[2], now)
            _log.info("node %d: %s in epoch %d (leader %s), was %s in epoch %d", self.node_id, role[0], role[1],
                      role[2], self._role[0], self._role[1])
            self._role = role
        # Leadership listeners (the active controller).
        if self._active_epoch is not None and (not core.is_leader or core.epoch != self._active_epoch):
            lost, self._active_epoch = self._active_epoch, None
            _log.info("node %d is no longer the active leader of epoch %d", self.node_id, lost)
            self._publisher.leader_lost(lost)
        start = core.leader_epoch_start_offset
        if self._active_epoch is None and start is not None and self.state.next_offset > start:
            self._active_epoch = core.epoch
            self._adopt_staged = True
            _log.info("node %d is the active leader of epoch %d from offset %d", self.node_id, core.epoch, start)
            self._publisher.leader_active(core.epoch, self.state.image)
            if self._nursery is not None and self._voter_set_only_in_snapshot():
                self._nursery.start_soon(self._write_voter_set_into_log, core.epoch)
        self._publisher.changed()

    def _fail_proposals(self, error: BaseException) -> None:
        self._precomputed.clear()
        proposals, self._proposals = self._proposals, []
        for p in proposals:
            p.finish(error=error)
