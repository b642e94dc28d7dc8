"""The broker's link to the metadata quorum (I/O shell): metadata in, lifecycle out.

Theory of operation
-------------------
A broker follows `__cluster_metadata` with a `quorum.node.RaftNode`: an
observer in a broker-only process, the process's own voter in a combined
one (one Raft node per process). `BrokerQuorumLink` connects that node to
the `Broker`:

- **Metadata in.** The first image is published to the broker only once
  the node has caught up: it has heard the quorum's high watermark and
  applied everything below it (Kafka's broker waits for the same before
  its first publish, so that `LogManager.load` judges stray logs against a
  complete image). Later images are handed over by the link's own task,
  not in the Raft driver's callback: opening or deleting logs must not
  stall the driver (a voter, on a combined node). The broker computes the
  delta from the image it has, so images that arrive meanwhile fold into
  one delta, and works through it in slices of the event loop's time
  (`Broker.publish_metadata`), so heartbeats go on during a delta of
  thousands of partitions.
- **Lifecycle out.** `broker.core.lifecycle.BrokerLifecycle` decides when to
  register and heartbeat; this shell sends through the `ControllerClient`
  (to whichever voter is the active controller) and feeds answers back.
  Heartbeats say want_fence until the first image is published, then
  carry the offset of the broker's image, so the controller unfences the
  broker once it has seen its own registration (KIP-631).
- **Offline log dirs.** When a log dir fails (`ReplicaManager.fail_log_dir`),
  the next heartbeat, sent at once, lists its id, and `_report_offline`
  sends AssignReplicasToDirs for the partitions that were in it and that
  the image does not yet show assigned to it, or that still name this
  broker leader or in-sync, until the image shows none: the controller
  records the dir of each and moves them to the other replicas
  (`quorum.controller.cluster_control`), and Metadata answers list them
  offline.
- **Controlled shutdown.** `controlled_shutdown(timeout_s)` heartbeats
  want_shut_down until the controller answers should_shut_down (its
  leaderships have moved), or until the timeout; the caller then stops
  the broker, which closes its logs cleanly.

`QuorumControllerChannel` is the broker's `ControllerChannel` over the same
`ControllerClient`.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from typing import Any

import trio

from kio.schema.assign_replicas_to_dirs.v0 import request as ard_req

from broker.shell.broker import Broker
from broker.shell.log_dir_failure import dir_id
from broker.shell.controller_channel import ControllerUnavailableError
from broker.core.lifecycle import BrokerLifecycle, BrokerState, ListenerSpec
from quorum.metadata import MetadataDelta, MetadataImage
from quorum.node.controller_client import ControllerClient, NoActiveControllerError
from quorum.node.driver import RaftNode
from common.wire.errors import ConnectionFailedError

#: How long a forwarded admin request may look for the active controller.
ADMIN_TIMEOUT_MS = 30_000
#: How often a controlled shutdown counts the partitions the broker still leads.
LEADERSHIP_CHECK_S = 1.0
#: A controlled shutdown whose timeout restarts as leaderships move off
#: waits at most this many times its timeout in all.
MAX_SHUTDOWN_EXTENSION = 10

_log = logging.getLogger("broker.quorum_link")


class QuorumControllerChannel:
    """`ControllerChannel` over `ControllerClient`: the active controller, wherever it is."""

    def __init__(self, client: ControllerClient, timeout_ms: int = ADMIN_TIMEOUT_MS) -> None:
        self.client = client
        self.timeout_ms = timeout_ms

    async def send(self, request: Any) -> Any:
        try:
            _node_id, response = await self.client.send(request, timeout_ms=self.timeout_ms)
        except NoActiveControllerError as exc:
            raise ControllerUnavailableError(str(exc)) from exc
        return response


class BrokerQuorumLink:
    def __init__(
        self,
        node: RaftNode,
        broker: Broker,
        client: ControllerClient,
        *,
        cluster_id: str,
        heartbeat_interval_ms: int,
        heartbeat_timeout_ms: int,
    ) -> None:
        self.node = node
        self.broker = broker
        self.client = client
        self.cluster_id = cluster_id
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.lifecycle: BrokerLifecycle | None = None
        #: `controlled_shutdown`'s timeout restarts each time leaderships
        #: moved off (set where `raftka.controlled.shutdown.timeout.ms` is not).
        self.extend_shutdown_while_moving = False
        self.published = False
        self._poke = trio.Event()
        self._progress = trio.Event()
        self._new_image = trio.Event()
        self._dir_offline = trio.Event()
        node.subscribe(self._on_image)
        broker.replicas.on_dir_offline = self._on_dir_offline
        broker.replicas.log_dirs_can_go_offline = True

    # --- metadata in -----------------------------------------------------------------

    def caught_up(self) -> bool:
        hw = self.node.high_watermark
        return hw is not None and self.node.applied_offset >= hw

    def _on_image(self, image: MetadataImage, delta: MetadataDelta | None) -> None:
        # In the Raft driver's task, which must not wait for the broker's
        # log work (opening, deleting): only wake the publisher.
        self._new_image.set()

    def has_own_registration(self) -> bool:
        """The node's image holds this incarnation's registration record.

        KIP-631: a broker acts on partition metadata only once it has seen
        its own registration. Before that, the image can still name this
        broker, as it was before a restart, leader of partitions whose
        leadership the controller is about to move; leading them with a log
        that lost its unflushed tail would let followers truncate to it."""
        lifecycle = self.lifecycle
        return lifecycle is not None and lifecycle.broker_epoch >= 0 \
            and self.node.applied_offset > lifecycle.broker_epoch

    async def _publish_images(self) -> None:
        while not (self.caught_up() and self.has_own_registration()):
            with trio.move_on_after(0.05):
                await self.node.wait_for_change()
        _log.info("broker %d caught up with the metadata log at offset %d: publishing %r",
                  self.broker.node_id, self.node.applied_offset, self.node.image)
        while True:
            self._new_image = trio.Event()
            image = self.node.image
            if image.offset > self.broker.image.offset or not self.published:
                # The broker computes the delta from the image it has, so
                # images that came while it worked fold into one delta.
                # In slices: a delta of thousands of partitions must not
                # starve the heartbeats below (the broker would be fenced).
                await self.broker.publish_metadata(image)
                self.published = True
                self._wake()
            await self._new_image.wait()

    # --- lifecycle out --------------------------------------------------------------------

    @property
    def metadata_offset(self) -> int:
        """The offset of the newest metadata record in the broker's image: the
        controller unfences the broker once it has seen its own registration."""
        return self.broker.image.offset

    def _on_dir_offline(self, log_dir: str) -> None:
        lifecycle = self.lifecycle
        if lifecycle is not None:
            lifecycle.offline_log_dirs = tuple(dir_id(d) for d in self.broker.log_manager.offline_dirs)
            lifecycle.poll_now()
            self._poke.set()
        self._dir_offline.set()

    def _offline_replicas(self) -> dict[uuid.UUID, dict[uuid.UUID, list[int]]]:
        """dir id -> topic id -> partitions in an offline log dir that the
        image does not show in that dir, or still has this broker lead or
        sit in the ISR of."""
        image = self.broker.image
        me = self.broker.node_id
        out: dict[uuid.UUID, dict[uuid.UUID, list[int]]] = defaultdict(lambda: defaultdict(list))
        for (topic, partition), log_dir in self.broker.replicas.dir_offline.items():
            t = image.topic(topic)
            reg = None if t is None else t.partitions.get(partition)
            if reg is None or me not in reg.replicas:
                continue
            directory = dir_id(log_dir)
            if reg.directory(me) != directory or reg.leader == me or (me in reg.isr and len(reg.isr) > 1):
                out[directory][t.topic_id].append(partition)
        return out

    async def _report_offline(self) -> None:
        """AssignReplicasToDirs for the replicas of offline log dirs, until the
        controller has moved them (module doc)."""
        while True:
            await self._dir_offline.wait()
            self._dir_offline = trio.Event()
            while True:
                # After the heartbeat that lists the dir: the controller acts
                # on an assignment to a dir it knows is offline.
                await trio.sleep(self.heartbeat_interval_ms / 1000 / 4)
                lifecycle = self.lifecycle
                pending = self._offline_replicas()
                if not pending:
                    break
                if lifecycle is None or lifecycle.broker_epoch < 0:
                    continue
                request = ard_req.AssignReplicasToDirsRequest(
                    broker_id=self.broker.node_id, broker_epoch=lifecycle.broker_epoch,
                    directories=tuple(ard_req.DirectoryData(id_=d, topics=tuple(
                        ard_req.TopicData(topic_id=t, partitions=tuple(
                            ard_req.PartitionData(partition_index=p) for p in sorted(parts)))
                        for t, parts in topics.items())) for d, topics in pending.items()))
                try:
                    await self.client.send(request, timeout_ms=self.heartbeat_timeout_ms)
                except (NoActiveControllerError, ConnectionFailedError) as exc:
                    _log.warning("broker %d: AssignReplicasToDirs failed: %s; retrying", self.broker.node_id, exc)
                # The changes reach this broker's image in a moment: wait for it.
                with trio.move_on_after(self.heartbeat_interval_ms / 1000):
                    await self._new_image.wait()

    def _now_ms(self) -> int:
        return int(trio.current_time() * 1000)

    def _wake(self) -> None:
        """A new image: a recovering broker may be caught up now; tell the controller at once."""
        lifecycle = self.lifecycle
        if lifecycle is not None and self.published and lifecycle.state is BrokerState.RECOVERY:
            lifecycle.poll_now()
        self._poke.set()

    async def run(self, advertised: ListenerSpec | tuple[ListenerSpec, ...], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register with the `advertised` endpoints, one per listener (what
        clients are told to connect to); heartbeat until the controlled shutdown is over. Also
        publishes the first image."""
        config = self.broker.config
        self.lifecycle = BrokerLifecycle(
            broker_id=self.broker.node_id, cluster_id=self.cluster_id, incarnation_id=uuid.uuid4(),
            listeners=advertised if isinstance(advertised, tuple) else (advertised,), rack=config.rack,
            heartbeat_interval_ms=self.heartbeat_interval_ms, now_ms=self._now_ms())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._publish_images)
            nursery.start_soon(self._report_offline)
            task_status.started()
            await self._heartbeat_loop()
            nursery.cancel_scope.cancel()

    async def _heartbeat_loop(self) -> None:
        lifecycle = self.lifecycle
        assert lifecycle is not None
        state = lifecycle.state
        while not lifecycle.done:
            request = lifecycle.poll(self._now_ms(), self.metadata_offset, self.published)
            if request is None:
                wake_ms = lifecycle.wake_at_ms()
                with trio.move_on_at(float("inf") if wake_ms is None else wake_ms / 1000):
                    await self._poke.wait()
                self._poke = trio.Event()
                continue
            try:
                _node_id, response = await self.client.send(request, timeout_ms=self.heartbeat_timeout_ms)
            except (NoActiveControllerError, ConnectionFailedError) as exc:
                lifecycle.on_failure(str(exc), self._now_ms())
                _log.warning("broker %d: %s failed: %s", self.broker.node_id, type(request).__name__, exc)
            else:
                lifecycle.on_response(response, self._now_ms())
                if lifecycle.last_error is not None:
                    _log.warning("broker %d: %s", self.broker.node_id, lifecycle.last_error)
            if lifecycle.state is not state:
                _log.info("broker %d: %s -> %s (broker epoch %d)", self.broker.node_id, state.value,
                          lifecycle.state.value, lifecycle.broker_epoch)
                state = lifecycle.state
            self._progress.set()
            self._progress = trio.Event()

    # --- waiting ------------------------------------------------------------------------

    def is_serving(self) -> bool:
        """Unfenced, and this broker's own image says so (its Metadata lists itself)."""
        lifecycle = self.lifecycle
        if lifecycle is None or lifecycle.state is not BrokerState.RUNNING or not self.published:
            return False
        registration = self.broker.image.brokers.get(self.broker.node_id)
        return registration is not None and registration.epoch == lifecycle.broker_epoch \
            and not registration.fenced

    async def wait_serving(self) -> None:
        while not self.is_serving():
            await self._wait_progress()

    async def _wait_progress(self) -> None:
        with trio.move_on_after(0.05):
            await self._progress.wait()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Hand leadership over (KIP-631); whether the controller let us go
        in time: within `timeout_s`, or, with `extend_shutdown_while_moving`,
        within `timeout_s` of the last time leaderships moved off."""
        lifecycle = self.lifecycle
        if lifecycle is None:
            return True
        _log.info("broker %d: controlled shutdown", self.broker.node_id)
        lifecycle.begin_controlled_shutdown(self._now_ms())
        self._poke.set()
        started = trio.current_time()
        deadline = started + timeout_s
        led = self._partitions_led()
        next_count = started + LEADERSHIP_CHECK_S
        while not lifecycle.done:
            now = trio.current_time()
            if self.extend_shutdown_while_moving and now >= next_count:
                # The controller moves leadership off in batches (10,000
                # partition changes each, about a second apiece here): at
                # 100,000 partitions a fixed 9 s ran out one batch short.
                # Each batch that moved some gives the wait `timeout_s` more.
                # Against the previous count, not the first: a broker told
                # to stop while its elections still come in leads more
                # partitions first. Bounded, whatever the counts do.
                next_count = now + LEADERSHIP_CHECK_S
                now_led, was = self._partitions_led(), led
                led = now_led
                if now_led < was:
                    deadline = max(deadline, min(now + timeout_s, started + timeout_s * MAX_SHUTDOWN_EXTENSION))
            if now >= deadline:
                _log.warning("broker %d: controlled shutdown did not finish in %.1f s (%s; it still leads %d "
                             "partitions); stopping anyway: raise raftka.controlled.shutdown.timeout.ms if the "
                             "controller needs longer", self.broker.node_id, now - started,
                             lifecycle.last_error or "no answer", self._partitions_led())
                return False
            with trio.move_on_at(deadline):
                await self._wait_progress()
        _log.info("broker %d: the controller let it go", self.broker.node_id)
        return True

    def _partitions_led(self) -> int:
        return sum(1 for hp in self.broker.replicas.partitions.values() if hp.state.leader is not None)
