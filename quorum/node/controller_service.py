"""The active controller: the controller APIs, served on the Raft leader (KIP-631).

Theory of operation
-------------------
Every voter runs a `ControllerService`; only the one whose `RaftNode` is
the *active* leader (it leads and has applied its epoch's LeaderChange, so
its image holds everything committed before the epoch) decides. Elsewhere
each request gets NOT_CONTROLLER at once, and the sender looks for the
active controller.

On activation the service builds a fresh `QuorumController` over the
committed image: the soft state (broker heartbeats) starts over, and every
registered broker gets a full session, as in Kafka after a failover. It
keeps a *working image*: the committed image plus every record it has
appended since, applied at the offsets they got; when they commit, the
driver adopts that image as the committed one (`Staged`) instead of
replaying the leader's own records a second time.

A request is decided inside the Raft driver's loop (`propose_with`): the
decision sees the working image including every earlier decision, its
records are appended at the offset the driver names, and they are applied
to the working image at those offsets. The answer goes out once the
records are committed (for a decision without records, once everything
appended before it is: read-after-write). Registration's broker epoch is
the offset of its RegisterBroker record. If leadership is lost first, the
service drops the controller and its working image, and the request gets
NOT_CONTROLLER.

A timer runs `QuorumController.tick` at its `next_deadline_ms` (at least
every second): it fences brokers whose session expired and, every
`leader.imbalance.check.interval.seconds`, moves leadership back to
preferred replicas.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from quorum.controller import SUPPORTED_REQUESTS, ControllerConfig, ControllerResult, QuorumController
from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.metadata.records import BrokerRegistrationChangeRecord, Record, encode_record
from quorum.node.controller_errors import error_response
from quorum.node.driver import RaftNode
from quorum.node.events import Staged
from quorum.node.metadata_log import MAX_BATCH_BYTES
from quorum.raft import AppendResult, NotLeaderError
from common.errors import RaftkaError

#: How long a new leader's requests wait for its activation.
ACTIVATION_WAIT_S = 5.0
#: A request not committed in this time gets REQUEST_TIMED_OUT.
COMMIT_TIMEOUT_S = 30.0
#: Fence-check period when no broker session is about to expire.
IDLE_TICK_S = 1.0

_log = logging.getLogger("quorum.node.controller")


class _NotActive(RaftkaError):
    """The decision ran after this node stopped being the active controller."""


class _TooLarge(RaftkaError):
    """The decision's records exceed what one metadata batch holds."""


class ControllerService:
    def __init__(self, node: RaftNode, config: ControllerConfig, rng: random.Random | None = None,
                 bootstrap_records: Sequence[Record] = ()) -> None:
        #: Appended by the first active controller of a cluster that never
        #: had a SCRAM credential (`quorum.node.bootstrap`).
        self.bootstrap_records = tuple(bootstrap_records)
        self.node = node
        self.config = config
        self._rng = rng or random.Random()
        self._controller: QuorumController | None = None
        self._working: MetadataImage | None = None
        self._epoch: int | None = None
        self._nursery: trio.Nursery | None = None
        self._tick_scope: trio.CancelScope | None = None
        node.add_leadership_listener(self)

    @property
    def active_epoch(self) -> int | None:
        return self._epoch

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the session timer; runs until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self._epoch is not None:  # activated before this task ran
                    nursery.start_soon(self._session_timer, self._epoch)
                    if self.bootstrap_records and self._working is not None and not self._working.scram_ever_set:
                        nursery.start_soon(self._bootstrap)
                task_status.started()
                await trio.sleep_forever()
        finally:
            # A node shutting down (a port it could not bind, a signal) may
            # still win an election in its last turns: nothing is started then.
            self._nursery = None

    # --- leadership (called in the driver loop) ----------------------------------

    def on_leader_active(self, epoch: int, image: MetadataImage) -> None:
        now_ms = int(trio.current_time() * 1000)
        self._controller = QuorumController(image, now_ms, self.config, random.Random(self._rng.getrandbits(64)))
        self._working = image
        self._epoch = epoch
        _log.info("active controller for epoch %d at offset %d", epoch, image.offset)
        if self._nursery is not None:
            self._nursery.start_soon(self._session_timer, epoch)
            if self.bootstrap_records and not image.scram_ever_set:
                self._nursery.start_soon(self._bootstrap)

    async def _bootstrap(self) -> None:
        try:
            await self.propose_from_image(
                lambda image: [] if image.scram_ever_set else list(self.bootstrap_records))
            _log.info("stored %d bootstrap SCRAM credentials in the metadata log", len(self.bootstrap_records))
        except (RaftkaError, NotLeaderError) as exc:
            _log.info("bootstrap SCRAM credentials not stored (%s); the next active controller will", exc)

    def on_leader_lost(self, epoch: int) -> None:
        _log.info("no longer the active controller (epoch %d)", epoch)
        self._controller = None
        self._working = None
        self._epoch = None
        if self._tick_scope is not None:
            self._tick_scope.cancel()

    # --- requests -----------------------------------------------------------------

    def serves(self, request: Any) -> bool:
        return type(request) in SUPPORTED_REQUESTS

    async def handle(self, request: Any) -> Any:
        """Decide `request` if this node is the active controller; its response."""
        if not await self._wait_active():
            return error_response(request, ErrorCode.not_controller)
        holder: list[ControllerResult[Any]] = []
        with trio.move_on_after(COMMIT_TIMEOUT_S):
            try:
                appended = await self.node.propose_with(lambda base, epoch: self._decide(request, base, epoch, holder))
            except (NotLeaderError, _NotActive):
                return error_response(request, ErrorCode.not_controller)
            except _TooLarge as exc:
                return error_response(request, ErrorCode.policy_violation, str(exc))
            result = holder[0]
            return result.respond(appended.base_offset if result.records else None)
        return error_response(request, ErrorCode.request_timed_out,
                              f"not committed within {COMMIT_TIMEOUT_S:.0f} s")

    async def _wait_active(self) -> bool:
        with trio.move_on_after(ACTIVATION_WAIT_S):
            while self._epoch is None:
                if not self.node.is_leader:
                    return False
                await self.node.wait_for_change()
            return True
        return False

    def _decide(self, request: Any, base_offset: int, epoch: int, holder: list[ControllerResult[Any]]) -> Staged:
        """Runs in the driver loop, with the offset the records will get."""
        controller, working = self._controller, self._working
        if controller is None or working is None or epoch != self._epoch:
            raise _NotActive(f"not the active controller in epoch {epoch}")
        result = controller.handle(request, working, int(trio.current_time() * 1000))
        holder.append(result)
        return self._stage(result.records, base_offset, epoch)

    def _stage(self, records: Any, base_offset: int, epoch: int) -> Staged:
        encoded = [encode_record(r) for r in records]
        size = sum(len(e) for e in encoded)
        if size > MAX_BATCH_BYTES // 2:
            raise _TooLarge(f"the request makes {size} bytes of metadata records, more than one batch "
                            f"({MAX_BATCH_BYTES // 2} bytes) holds; split it into smaller requests")
        if records:
            assert self._working is not None
            self._working = self._working.apply(
                [LoggedRecord(base_offset + i, epoch, r) for i, r in enumerate(records)])
        return Staged(encoded, self._working)

    # --- session expiry ---------------------------------------------------------------

    async def _session_timer(self, epoch: int) -> None:
        with trio.CancelScope() as scope:
            self._tick_scope = scope
            while self._epoch == epoch:
                controller, working = self._controller, self._working
                assert controller is not None and working is not None
                deadline_ms = controller.next_deadline_ms(working)
                now_s = trio.current_time()
                wake_s = now_s + IDLE_TICK_S if deadline_ms is None else min(deadline_ms / 1000, now_s + IDLE_TICK_S)
                await trio.sleep_until(wake_s)
                try:
                    await self.node.propose_with(lambda base, e: self._tick(base, e))
                except (NotLeaderError, _NotActive):
                    return

    def _tick(self, base_offset: int, epoch: int) -> Staged:
        controller, working = self._controller, self._working
        if controller is None or working is None or epoch != self._epoch:
            raise _NotActive(f"not the active controller in epoch {epoch}")
        records = controller.tick(working, int(trio.current_time() * 1000))
        owed = controller.cluster.moves_owed
        for record in records:
            if isinstance(record, BrokerRegistrationChangeRecord) and record.fenced is True:
                # Kafka: "Fencing broker N because its session has timed out."
                _log.info("fencing broker %d (epoch %d): no heartbeat for over broker.session.timeout.ms=%d ms; "
                          "its partitions leave it in batches of %d (%d still to look at after this one)",
                          record.broker_id, record.broker_epoch, self.config.broker_session_timeout_ms,
                          self.config.fence_moves_per_batch, owed)
        if records:
            _log.info("controller tick (session expiry or leader rebalance): %d records%s", len(records),
                      f", {owed} partitions of fenced brokers still to look at" if owed else "")
        return self._stage(records, base_offset, epoch)

    # --- hooks for the ZooKeeper migration (quorum/migration) ----------------------------

    async def propose_from_image(self, build: Callable[[MetadataImage], Sequence[Record]]) -> AppendResult:
        """Append what `build(working image)` returns as one batch of this
        active controller; where it went, once committed. Raises
        `NotLeaderError` or another `RaftkaError` when not active."""
        if not await self._wait_active():
            raise _NotActive("not the active controller")
        appended = await self.node.propose_with(lambda base, epoch: self._build_with(build, base, epoch))
        return appended

    def _build_with(self, build: Callable[[MetadataImage], Sequence[Record]], base_offset: int, epoch: int) -> Staged:
        if self._controller is None or self._working is None or epoch != self._epoch:
            raise _NotActive(f"not the active controller in epoch {epoch}")
        return self._stage(list(build(self._working)), base_offset, epoch)

    def keep_alive(self, broker_ids: Iterable[int]) -> None:
        """Count as a heartbeat of each of `broker_ids`: brokers still in
        ZooKeeper mode during a migration, alive by their ZooKeeper session."""
        if self._controller is not None:
            now_ms = int(trio.current_time() * 1000)
            for b in broker_ids:
                self._controller.cluster._touch(b, now_ms)
