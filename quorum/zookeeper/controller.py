"""The ZooKeeper-mode controller: a component that runs inside a broker process.

Theory of operation
-------------------
Every broker runs a `ZkController`. All of them campaign for the ephemeral
`/controller` znode; the one that creates it (bumping `/controller_epoch`
in the same `multi`, see `store.try_become_controller`) is the controller
until its ZooKeeper session ends or it resigns. The others watch
`/controller` and campaign again when it disappears.

    Candidate --created /controller--> Active
    Candidate --/controller exists--> Watching --/controller deleted--> Candidate
    Active --session lost | /controller not ours | fenced write | newer epoch seen--> Candidate

Once elected, the controller loads the whole cluster state (`store.
load_snapshot`), hands it to the pure core (`decisions.ZkControllerCore`)
and from then on turns ZooKeeper watch firings into core events, one at a
time, as Kafka's single-threaded controller event loop does. Watches are
one-shot: a firing only marks its kind dirty (coalescing bursts) and the
handler re-reads the current children, re-arming the watch. The core's
writes go to ZooKeeper fenced by the epoch's zkVersion (`store.
apply_transactions`); its requests go to the `BrokerRequestSender`
(`channel.ControllerChannelManager` over the network, or anything in
process that delivers them to `broker_metadata.ZkMetadataCache`s).

kazoo runs its own threads: blocking calls go through `trio.to_thread`, and
watch callbacks hop back into trio with `trio.from_thread.run_sync`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.retry import KazooRetry

from common.metrics import LatencyHistogram
from quorum.zookeeper import store
from quorum.zookeeper.context import (
    BrokersChanged,
    ControllerEvent,
    Decision,
    Failover,
    IsrChangesNotified,
    PartitionsAdded,
    TopicConfigsLoaded,
    TopicDeletionRequested,
    TopicsChanged,
)
from quorum.zookeeper.decisions import ZkControllerConfig, ZkControllerCore
from quorum.zookeeper.errors import ControllerMovedError, MalformedZNodeError
from quorum.zookeeper.messages import ControllerRequest
from quorum.zookeeper.znodes import DELETE_TOPICS_PATH, BrokerInfo

_log = logging.getLogger("quorum.zookeeper.controller")

_KINDS = ("controller", "session", "brokers", "topics", "delete_topics", "isr_change", "config_changes",
          "partitions")


class BrokerRequestSender(Protocol):
    """Where the controller's requests go. `send` must not block: it queues, per broker, in order."""

    def update_brokers(self, live: Mapping[int, BrokerInfo]) -> None:
        """The live brokers now: open queues to new ones, drop the queues of gone ones."""

    def send(self, broker_id: int, request: ControllerRequest) -> None: ...


class _Resign(Exception):
    pass


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ZkController:
    """Campaigns for `/controller` and, while elected, runs the controller.

    `zk` must be started (connected). `run` lives in the broker's nursery
    until cancelled. `on_change(active, epoch)` is called on every win and loss.
    """

    def __init__(self, zk: KazooClient, config: ZkControllerConfig, sender: BrokerRequestSender, *,
                 on_change: Callable[[bool, int], None] | None = None) -> None:
        self.zk = zk
        self.config = config
        self.sender = sender
        self.on_change = on_change
        self.core: ZkControllerCore | None = None
        self.epoch = -1
        self.epoch_zk_version = -1
        #: elections this controller won (for tests and metrics)
        self.elections_won = 0
        self._dirty: set[str] = set()
        self._wakeup = trio.Event()
        #: kind -> when (trio clock) its watch fired and was not yet read, and
        #: how long those events waited (Kafka's EventQueueTimeMs; metrics).
        self._marked_at: dict[str, float] = {}
        self.event_queue = LatencyHistogram()
        self._token: trio.lowlevel.TrioToken | None = None
        self._last_config_change: str | None = None
        #: topics whose `/brokers/topics/<t>` watch fired since the last read
        self._modified_topics: set[str] = set()
        # Retry through connection losses (kazoo reconnects within the session),
        # as Kafka's retryRequestUntilConnected does; a session expiry surfaces.
        self._retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0, ignore_expire=False)

    @property
    def active(self) -> bool:
        return self.core is not None and self.core.active

    # --- watch plumbing --------------------------------------------------------------

    def _mark(self, kind: str) -> None:
        self._dirty.add(kind)
        self._marked_at.setdefault(kind, trio.current_time())
        self._wakeup.set()

    def _watch(self, kind: str) -> Callable[[object], None]:
        def fired(_event: object) -> None:
            try:
                trio.from_thread.run_sync(self._mark, kind, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        return fired

    def _topic_modified(self, event: object) -> None:
        # kazoo's thread: a topic's assignment changed (one watch per topic, as Kafka's
        # PartitionModificationsHandler); the name is the path's last part.
        name = str(getattr(event, "path", "")).rsplit("/", 1)[-1]

        def mark() -> None:
            self._modified_topics.add(name)
            self._mark("partitions")
        try:
            trio.from_thread.run_sync(mark, trio_token=self._token)
        except trio.RunFinishedError:
            pass

    def _session_listener(self, state: str) -> None:
        # Runs in kazoo's thread and must not block: hand the news to trio.
        if state == KazooState.LOST:
            try:
                self._token.run_sync_soon(self._mark, "session")
            except trio.RunFinishedError:
                pass

    async def _wait_dirty(self) -> set[str]:
        while not self._dirty:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
        dirty, self._dirty = self._dirty, set()
        now = trio.current_time()
        for kind in dirty:
            marked = self._marked_at.pop(kind, None)
            if marked is not None:
                self.event_queue.observe(now - marked)
        return dirty

    async def _zk(self, fn, *args):
        return await trio.to_thread.run_sync(self._retry.copy(), fn, *args, abandon_on_cancel=True)

    # --- campaign ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.zk.add_listener(self._session_listener)
        task_status.started()
        try:
            while True:
                try:
                    won = await self._campaign()
                except KazooException as e:
                    _log.info("controller campaign of broker %d interrupted (%s); retrying",
                              self.config.broker_id, type(e).__name__)
                    await trio.sleep(0.1)
                    continue
                if won is None:
                    continue
                self.epoch, self.epoch_zk_version = won
                self.elections_won += 1
                _log.info("broker %d is the controller at epoch %d", self.config.broker_id, self.epoch)
                pause_s = 0.0
                try:
                    await self._lead()
                except (_Resign, ControllerMovedError, KazooException) as e:
                    _log.warning("controller %d (epoch %d) resigns: %s", self.config.broker_id, self.epoch, e)
                except MalformedZNodeError as e:
                    # Not ours to repair: step down and let an operator (or another broker) try.
                    _log.error("controller %d (epoch %d) resigns on unreadable metadata: %s",
                               self.config.broker_id, self.epoch, e)
                    pause_s = 1.0
                finally:
                    self.core = None
                    if self.on_change:
                        self.on_change(False, self.epoch)
                    with trio.CancelScope(shield=True):
                        await self._zk(self._step_down)
                await trio.sleep(pause_s)
        finally:
            self.zk.remove_listener(self._session_listener)

    async def _campaign(self) -> tuple[int, int] | None:
        """Try to win once; if another broker holds `/controller`, wait until it goes (or our
        session is replaced, which drops watches) and return None."""
        self._dirty.clear()
        won = await self._zk(store.try_become_controller, self.zk, self.config.broker_id, wall_clock_ms())
        if won is not None:
            return won
        holder = await self._zk(store.active_controller, self.zk, self._watch("controller"))
        if holder is not None:
            while not {"controller", "session"} & await self._wait_dirty():
                pass
        return None

    def _step_down(self) -> None:
        try:
            store.resign(self.zk)
        except Exception as e:  # the session may be gone; then /controller is gone with it
            _log.debug("step-down of /controller failed: %s", e)

    # --- leading ------------------------------------------------------------------------

    async def _lead(self) -> None:
        self.core = ZkControllerCore(self.config)
        self._dirty.clear()
        self._modified_topics = set()
        watches = {k: self._watch(k) for k in ("brokers", "topics", "delete_topics", "isr_change")}
        if not await self._zk(store.controller_znode_is_ours, self.zk, self.config.broker_id,
                              self._watch("controller")):
            raise _Resign("/controller vanished before the load")
        self._last_config_change, _ = await self._zk(store.read_config_changes, self.zk, None,
                                                     self._watch("config_changes"))
        snapshot = await self._zk(store.load_snapshot, self.zk, self.epoch, self.epoch_zk_version, watches)
        await self._zk(store.watch_topics, self.zk, list(snapshot.topics), self._topic_modified)
        self.sender.update_brokers(snapshot.brokers)
        await self._run_event(Failover(snapshot))
        if self.on_change:
            self.on_change(True, self.epoch)
        while True:
            dirty = await self._wait_dirty()
            if "session" in dirty:
                raise _Resign("ZooKeeper session expired")
            if "controller" in dirty and not await self._zk(
                    store.controller_znode_is_ours, self.zk, self.config.broker_id, self._watch("controller")):
                raise _Resign("/controller is no longer ours")
            for kind in ("brokers", "topics", "delete_topics", "isr_change", "config_changes", "partitions"):
                if kind in dirty:
                    event = await self._read_event(kind)
                    if event is not None:
                        await self._run_event(event)

    async def _read_event(self, kind: str) -> ControllerEvent | None:
        zk, watch = self.zk, self._watch(kind)
        if kind == "brokers":
            live = await self._zk(store.read_brokers, zk, watch)
            self.sender.update_brokers(live)
            return BrokersChanged(live)
        if kind == "topics":
            names = await self._zk(store.read_topic_names, zk, watch)
            new = names - set(self.core.ctx.topics)
            await self._zk(store.watch_topics, zk, new, self._topic_modified)
            return TopicsChanged(frozenset(names), await self._zk(store.read_topic_assignments, zk, new))
        if kind == "partitions":
            names, self._modified_topics = self._modified_topics & set(self.core.ctx.topics), set()
            await self._zk(store.watch_topics, zk, names, self._topic_modified)
            assignments = await self._zk(store.read_topic_assignments, zk, names)
            return PartitionsAdded(assignments) if assignments else None
        if kind == "delete_topics":
            return TopicDeletionRequested(frozenset(await self._zk(zk.get_children, DELETE_TOPICS_PATH, watch)))
        if kind == "isr_change":
            names, partitions = await self._zk(store.read_isr_notifications, zk, watch)
            if not names:
                return None
            states = await self._zk(store.read_partition_states, zk, sorted(partitions))
            return IsrChangesNotified(names, {tp: states.get(tp) for tp in partitions})
        assert kind == "config_changes", kind
        self._last_config_change, topics = await self._zk(store.read_config_changes, zk, self._last_config_change,
                                                          watch)
        known = topics & set(self.core.ctx.topics)
        return TopicConfigsLoaded(await self._zk(store.read_topic_configs, zk, known)) if known else None

    async def _run_event(self, event: ControllerEvent) -> None:
        """One event through the core, its writes through ZooKeeper, its requests to brokers."""
        core = self.core
        decision = core.handle(event)
        reads: set[str] = set()
        while True:
            self._deliver(decision)
            reads |= decision.read_topic_configs
            if not decision.writes:
                break
            outcomes = await self._zk(store.apply_transactions, self.zk, self.epoch_zk_version, decision.writes)
            decision = core.writes_applied(outcomes)
        if reads:
            configs = await self._zk(store.read_topic_configs, self.zk, reads)
            await self._run_event(TopicConfigsLoaded(configs))

    def _deliver(self, decision: Decision) -> None:
        if decision.resign:
            raise _Resign("a partition state was written by a newer controller")
        for r in decision.requests:
            self.sender.send(r.broker_id, r.request)
