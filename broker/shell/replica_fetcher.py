"""Follower fetchers and the leader's ISR sender (I/O shell over `broker.core.replication`).

Theory of operation
-------------------
`ReplicaFetchers` runs one trio task per source broker (Kafka's
ReplicaFetcherThread). The pure `FetcherManager` decides which partitions
each source serves and what each Fetch carries (replica id = this broker,
fetch offset = our LEO, last fetched epoch, current leader epoch); the
task sends it as one Fetch v12 (incremental within a KIP-227 fetch
session once the leader grants one) over a `common.wire` connection to the
source's listener, applies each partition's `FollowerAction` to the log
(truncate by DivergingEpoch, start over at the leader's log start, append
as follower) and tells the partition (`on_follower_log_changed`). A failed
connection backs off `replica.fetch.backoff.ms`. `follow` (called from the
metadata delta) moves a partition to its new leader's fetcher at once.

`IsrSender` sends the queued ISR changes of the partitions led here (one
AlterPartition v3 per batch, KIP-497) to the active controller through the
broker's `ControllerChannel`, and ticks the leaders so lagging followers
leave the ISR after `replica.lag.time.max.ms`: every leader each quarter of
it (Kafka checks each half), and the few partitions with an ISR change
under way (retries after `alter_partition_retry_backoff_ms`) every 100 ms,
so a broker leading thousands of partitions does not scan them all 10
times a second. With no ISR change under way the tick task sleeps until
the next full tick (woken when one starts), so an idle broker does not
wake 10 times a second.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio
from kio.schema.errors import ErrorCode

from broker.shell.replica_manager import log_timeline
from broker.shell.storage_errors import storage_error_logger
from broker.core.replication import (
    EpochEndOffset,
    FetcherManager,
    FetchPlan,
    PartitionFetchResult,
    TopicIdPartition,
    build_request,
    failed,
    split_response,
)
from common.frozen import new_tuple
from common.wire import ConnectionFailedError
from common.wire.client import open_connection
from common.wire.codec import EncodedRequest
from common.wire.fetch_request import encode_fetch_v12
from storage.log_checkpoints import write_checkpoints_of
from storage.record_validation import check_stored_batches

_log = logging.getLogger("broker.replica_fetcher")
#: How often leaders are ticked (ISR shrink checks, AlterPartition retries).
TICK_S = 0.1
#: Top-level Fetch errors that only end the fetch session (KIP-227).
SESSION_ERRORS = (ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch)
#: AlterPartition answers for more partitions than this are logged as one line.
LOG_EACH_MAX = 20


class ReplicaFetchers:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.manager = FetcherManager(broker.node_id, broker.replicas.replication)
        self._wake: dict[int, trio.Event] = {}
        self._nursery: trio.Nursery | None = None

    def follow(self, topic: str, partition: int, topic_id, leader_id: int, leader_epoch: int) -> None:
        old, new = self.manager.follow(TopicIdPartition(topic_id, partition), topic, leader_id, leader_epoch)
        # Wake the source a partition joined, and the one it left only if
        # none is left there (its task ends). A partition leaving is no
        # reason to fetch or connect sooner: a fence moves a dead leader's
        # partitions 500 per metadata batch, and each batch made its
        # fetcher reconnect at once, while its log said "retrying in
        # 1000 ms". Kafka's fetcher thread, too, is woken from its
        # back-off by added partitions only.
        if old is not None and old != new and self.manager.fetcher(old) is None:
            self._poke(old)
        if new is not None:
            self._poke(new)
        if new is not None and new not in self._wake and self._nursery is not None:
            self._wake[new] = trio.Event()
            self._nursery.start_soon(self._run_source, new)

    def _poke(self, source: int) -> None:
        event = self._wake.get(source)
        if event is not None:
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for source in list(self.manager.fetchers):
                if source not in self._wake:
                    self._wake[source] = trio.Event()
                    nursery.start_soon(self._run_source, source)
            task_status.started()
            await trio.sleep_forever()

    def _logs(self) -> _Logs:
        return _Logs(self.broker.replicas.by_id)

    def _address(self, source: int) -> tuple[str, int] | None:
        registration = self.broker.image.brokers.get(source)
        if registration is None or not registration.endpoints:
            return None
        for endpoint in registration.endpoints:
            if endpoint.name == self.broker.config.inter_broker_listener:
                return endpoint.host, endpoint.port
        return registration.endpoints[0].host, registration.endpoints[0].port

    async def _run_source(self, source: int) -> None:
        """Fetch from `source` until no partition is followed from it."""
        config = self.manager.config
        try:
            while self.manager.fetcher(source) is not None:
                address = self._address(source)
                if address is None:
                    await self._sleep(source, config.replica_fetch_backoff_ms)
                    continue
                try:
                    async with open_connection(*address, client_id=f"replica-fetcher-{self.broker.node_id}",
                                               log=_log, security=self.broker.config.inter_broker_security) as conn:
                        await self._fetch_loop(source, conn)
                except (ConnectionFailedError, OSError) as exc:
                    _log.info("fetcher from broker %d: %s; retrying in %d ms", source, exc,
                              config.replica_fetch_backoff_ms)
                    await self._back_off(source, config.replica_fetch_backoff_ms)
                except Exception as exc:  # a malformed answer, say: never take the broker down
                    _log.warning("fetcher from broker %d failed: %r; retrying in %d ms", source, exc,
                                 config.replica_fetch_backoff_ms)
                    await self._back_off(source, config.replica_fetch_backoff_ms)
        finally:
            self._wake.pop(source, None)

    async def _back_off(self, source: int, ms: float) -> None:
        """After a failed connection: `ms`, cut short only by a partition
        added (or the last one gone) while it lasts. One added during the
        failed attempt is in the next attempt anyway."""
        self._wake[source] = trio.Event()
        await self._sleep(source, ms)

    async def _sleep(self, source: int, ms: float) -> None:
        event = self._wake.get(source)
        if event is None:
            event = self._wake[source] = trio.Event()
        with trio.move_on_after(max(ms, 0) / 1000):
            await event.wait()
        if event.is_set():
            self._wake[source] = trio.Event()

    async def _fetch_loop(self, source: int, conn) -> None:
        broker = self.broker
        while True:
            fetcher = self.manager.fetcher(source)
            if fetcher is None:
                return
            if conn.renew_at is not None and trio.current_time() >= conn.renew_at:
                # Its SASL session is about to expire (KIP-368): the caller connects
                # again at once, instead of the leader closing this one at a fetch.
                return
            now = broker.clock_ms()
            me = broker.image.brokers.get(broker.node_id)
            plan = fetcher.build_fetch(self._logs(), me.epoch if me is not None else -1, now)
            if plan is None:
                wakeup = fetcher.next_wakeup_ms(now)
                await self._sleep(source, 1000 if wakeup is None else wakeup - now)
                continue
            try:
                response = await conn.request(_fetch_request(plan), timeout_ms=plan.max_wait_ms + 30000)
            except BaseException:
                fetcher.handle_response(plan, None, self._logs(), broker.clock_ms())
                self.manager.on_response_done(source)
                raise
            results = None
            if response.error_code == ErrorCode.none:
                results = _results(fetcher, response)
            elif response.error_code in SESSION_ERRORS:
                # The leader lost the session (it restarted, or evicted it):
                # the next Fetch is a full one, at once.
                _log.info("fetcher from broker %d: %s; starting a new fetch session", source,
                          ErrorCode(response.error_code).name)
                fetcher.on_session_error(plan)
                self.manager.on_response_done(source)
                continue
            actions = fetcher.handle_response(plan, results, self._logs(), broker.clock_ms(), response.session_id)
            self.manager.on_response_done(source)
            self._apply(fetcher, actions)
            if results is None:
                await self._sleep(source, self.manager.config.replica_fetch_backoff_ms)
            elif broker.follower_throttle is not None:
                await self._hold_to_follower_throttle(source, response)

    async def _hold_to_follower_throttle(self, source: int, response) -> None:
        """Count what this answer brought for throttled replicas out of the
        ISR against `follower.replication.throttled.rate`, and wait before the
        next fetch from `source` while the rate is over it. Kafka leaves such
        partitions out of its next fetches instead; here the source's other
        partitions wait too, a second at most at a time."""
        throttle = self.broker.follower_throttle
        image = self.broker.image
        me = self.broker.node_id
        nbytes = 0
        for topic in response.responses:
            topic_image = image.topics_by_id.get(image.topic_ids_by_name.get(topic.topic))
            for p in topic.partitions:
                if p.records and throttle.throttled(topic.topic, p.partition_index):
                    registration = topic_image.partitions.get(p.partition_index) if topic_image else None
                    if registration is None or me not in registration.isr:
                        nbytes += len(p.records)
        now = trio.current_time()
        if nbytes:
            throttle.record(nbytes, now)
        delay = throttle.delay_s(now)
        if delay > 0:
            await self._sleep(source, min(delay, 1.0) * 1000)

    def _apply(self, fetcher, actions) -> None:
        """Do each partition's `FollowerAction` of one answer, in order."""
        # Runs per action of answers naming thousands of partitions (a
        # fence), so the lookups are hoisted out of the loop, and an action
        # that only carries the leader's HW (two of a fence's three answers
        # per partition) does not enter the log-changing code. The cost shows
        # in `raftka bench failover --led-partitions 10000 --acks all` as the
        # cluster's CPU per partition moved.
        replicas = self.broker.replicas
        by_id = replicas.by_id
        timeline = replicas.timeline
        clock_ms = self.broker.clock_ms
        not_truncated = self._truncate_all(fetcher, actions)
        for action in actions:
            hp = by_id.get(action.key)
            if hp is None or hp.state.leader is not None or action.key in not_truncated:
                continue
            changed = False
            if action.truncate_to is not None or action.start_at is not None or len(action.records):
                if not self._change_log(fetcher, hp, action):
                    continue
                changed = True
            if action.leader_log_start_offset > hp.log.log_start_offset:
                self._follow_log_start(hp, action.leader_log_start_offset)
            leader_high_watermark = action.leader_high_watermark
            if changed or leader_high_watermark is not None:
                if hp.state.on_follower_log_changed(hp.log.log_end_offset, leader_high_watermark) or changed:
                    hp.notify()
            if leader_high_watermark is not None and timeline.watching:
                log_timeline(timeline.on_fetch_answered(hp, clock_ms()))

    def _truncate_all(self, fetcher, actions) -> set:
        """Truncate or start over every log an action of this answer says
        to, then write the recovery point checkpoints of them all at once,
        before any append (`Log.truncate_to`): a leader change makes
        thousands of followers truncate, and a per-directory file rewritten
        per partition was quadratic. The keys whose truncation failed (the
        fetcher backs them off)."""
        not_truncated: set = set()
        truncated = []
        by_id = self.broker.replicas.by_id
        for action in actions:
            if action.truncate_to is None and action.start_at is None:
                continue
            hp = by_id.get(action.key)
            if hp is None or hp.state.leader is not None:
                continue
            log = hp.log
            try:
                if action.truncate_to is not None:
                    _log.info("%s-%d: truncating to %d (DivergingEpoch)", hp.state.topic, hp.state.partition,
                              action.truncate_to)
                    log.truncate_to(action.truncate_to, write_checkpoints=False)
                    log.epoch_cache.truncate_from_end(action.truncate_to)
                if action.start_at is not None:
                    _log.info("%s-%d: starting over at the leader's log start %d", hp.state.topic,
                              hp.state.partition, action.start_at)
                    log.truncate_fully_and_start_at(action.start_at, write_checkpoints=False)
                truncated.append(log)
            except Exception as exc:  # a disk error: retry later
                _log.warning("%s-%d: follower truncation failed: %s", hp.state.topic, hp.state.partition, exc)
                fetcher.on_append_failed(action.key, self.broker.clock_ms())
                not_truncated.add(action.key)
        if truncated:
            try:
                write_checkpoints_of(truncated)
            except Exception as exc:  # a full or failing disk: none of them takes records before it is written
                _log.warning("writing the recovery point checkpoints of %d truncated logs failed: %s; "
                             "their fetches are retried", len(truncated), exc)
                for action in actions:
                    if action.truncate_to is not None or action.start_at is not None:
                        fetcher.on_append_failed(action.key, self.broker.clock_ms())
                        not_truncated.add(action.key)
        return not_truncated

    @staticmethod
    def _follow_log_start(hp, leader_log_start_offset: int) -> None:
        """Adopt the leader's log start offset (DeleteRecords, retention), up
        to this log's end: Kafka's follower does the same after each fetch."""
        try:
            if hp.log.maybe_increment_log_start_offset(min(leader_log_start_offset, hp.log.log_end_offset)):
                hp.notify()
        except OSError as exc:
            _log.warning("%s-%d: cannot move the log start offset to %d: %s", hp.state.topic,
                         hp.state.partition, leader_log_start_offset, exc)

    def _change_log(self, fetcher, hp, action) -> bool:
        """Append as `action` says, its truncation done (`_truncate_all`);
        False if that failed (the fetcher backs off the partition)."""
        log = hp.log
        try:
            if len(action.records):
                # The records of what the leader sent are walked as a leader
                # walks a client's (their structure; the topic's rules were
                # the leader's to apply): a leader holding a batch that does
                # not parse must not spread it. The append checks the CRCs.
                check_stored_batches(action.records)
                log.append_as_follower(action.records, self.broker.clock_ms())
                topic_stats = self.broker.replicas.topic_stats
                if topic_stats is not None:
                    topic_stats[hp.state.topic][3] += len(action.records)
        except Exception as exc:  # a corrupt batch, a gap, a disk error: retry later
            if isinstance(exc, OSError) and self.broker.replicas.disk_error(hp.state.topic, hp.state.partition, exc):
                pass  # the log dir goes offline, and this replica with it (`ReplicaManager.fail_log_dir`)
            elif isinstance(exc, OSError):  # a full or failing disk: once per partition and cause, with the fix
                storage_error_logger.report(f"{hp.state.topic}-{hp.state.partition}", "follower append failed", exc,
                                            "it is retried on every fetch; the leader drops this replica from "
                                            "the ISR meanwhile")
            else:
                _log.warning("%s-%d: follower append failed: %s", hp.state.topic, hp.state.partition, exc)
            fetcher.on_append_failed(action.key, self.broker.clock_ms())
            return False
        fetcher.log_changed(action.key)
        return True


class _Logs(Mapping):
    """The hosted logs by topic id, as the fetcher core reads them."""

    def __init__(self, by_id) -> None:
        self._by_id = by_id

    def __getitem__(self, key):
        return self._by_id[key].log

    def get(self, key, default=None):
        # Mapping's own `get` calls `__getitem__` and catches its KeyError:
        # two Python calls per partition answered instead of one.
        hp = self._by_id.get(key)
        return default if hp is None else hp.log

    def __iter__(self):
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)


def _fetch_request(plan: FetchPlan) -> EncodedRequest:
    """The plan as a Fetch v12 body, encoded by hand (`common.wire.fetch_request`)."""
    topics: dict[str, list] = {}
    for p in plan.partitions:
        topics.setdefault(p.topic, []).append((
            p.key.partition, p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch, p.log_start_offset,
            p.partition_max_bytes))
    forgotten: dict[str, list[int]] = {}
    for p in plan.forgotten:
        forgotten.setdefault(p.topic, []).append(p.key.partition)
    return encode_fetch_v12(
        replica_id=plan.replica_id, max_wait_ms=plan.max_wait_ms, min_bytes=plan.min_bytes,
        max_bytes=plan.max_bytes, isolation_level=0, session_id=plan.session_id, session_epoch=plan.session_epoch,
        topics=list(topics.items()), forgotten=list(forgotten.items()))


def _results(fetcher, response) -> dict[TopicIdPartition, PartitionFetchResult]:
    # Runs per partition of answers naming thousands (a fence): no Python
    # call per partition. `ErrorCode(code)` is two calls through EnumMeta,
    # so the codes come from a dict; the key lookup and the NamedTuple's own
    # `__new__` are inlined. The cost shows in `raftka bench failover
    # --led-partitions 10000 --acks all` as the cluster's CPU per partition moved.
    out = {}
    keys = fetcher.keys_by_name
    errors = _ERROR_CODES
    for topic in response.responses:
        name = topic.topic
        for p in topic.partitions:
            key = keys.get((name, p.partition_index))
            if key is None:
                continue
            de = p.diverging_epoch
            diverging = None if de.epoch == -1 and de.end_offset == -1 else EpochEndOffset(de.epoch, de.end_offset)
            code = p.error_code
            error = errors.get(code)
            if error is None:
                error = ErrorCode(code)
            out[key] = new_tuple(PartitionFetchResult, (error, p.high_watermark, p.log_start_offset, diverging,
                                                         p.records or b""))
    return out


#: Every error code by its number (`_results`).
_ERROR_CODES = {int(code): code for code in ErrorCode}


class IsrSender:
    """Ticks the leaders and sends their ISR changes to the controller."""

    def __init__(self, broker) -> None:
        self.broker = broker
        #: Partitions whose ISR change is under way: ticked often for retries.
        self._changing: set[TopicIdPartition] = set()
        #: Set when `_changing` gains partitions (they need ticks every `TICK_S`).
        self._changing_added = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick_loop)
            task_status.started()
            await self._send_loop()

    async def _tick_loop(self) -> None:
        replicas = self.broker.replicas
        every_ms = max(TICK_S * 1000, replicas.replication.replica_lag_time_max_ms / 4)
        last_full = 0
        while True:
            wait_s = TICK_S
            if self.broker.loaded and not self._changing and not replicas.alter_partition_queue:
                wait_s = min(max(TICK_S, (last_full + every_ms - self.broker.clock_ms()) / 1000), every_ms / 1000)
            with trio.move_on_after(wait_s):
                await self._changing_added.wait()
            self._changing_added = trio.Event()
            if not self.broker.loaded:
                continue
            now = self.broker.clock_ms()
            self._changing.update(replicas.alter_partition_queue)
            if now - last_full >= every_ms:
                last_full = now
                replicas.tick(now)
            elif self._changing:
                replicas.tick(now, list(self._changing))
            for key in list(self._changing):
                hp = replicas.by_topic_id(key)
                if hp is None or hp.state.leader is None or hp.state.next_deadline_ms() is None:
                    self._changing.discard(key)

    async def _send_loop(self) -> None:
        replicas = self.broker.replicas
        while True:
            await replicas.alter_partition_pending.wait()
            replicas.alter_partition_pending = trio.Event()
            proposals = list(replicas.alter_partition_queue.values())
            replicas.alter_partition_queue.clear()
            if not proposals:
                continue
            me = self.broker.image.brokers.get(self.broker.node_id)
            request = build_request(self.broker.node_id, me.epoch if me is not None else -1, proposals)
            try:
                response = await self.broker.controller.send(request)
                results = split_response(response, proposals)
            except Exception as exc:  # no controller now: the leaders retry after their backoff
                _log.info("AlterPartition of %d partitions failed: %s", len(proposals), exc)
                results = failed(proposals, ErrorCode.request_timed_out)
            now = self.broker.clock_ms()
            # One line per partition for a few; a sum for thousands (a
            # broker's return expands the ISR of every partition it hosts).
            per_partition = logging.INFO if len(proposals) <= LOG_EACH_MAX else logging.DEBUG
            outcomes: dict[str, int] = {}
            for proposal in proposals:
                key = TopicIdPartition(proposal.topic_id, proposal.partition)
                self._changing.add(key)
                self._changing_added.set()
                hp = replicas.by_topic_id(key)
                result = results.get(key)
                if hp is None or result is None:
                    continue
                outcome = result.error.name if result.error else "accepted"
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if _log.isEnabledFor(per_partition):
                    _log.log(per_partition, "%s-%d: ISR %s %s -> %s", hp.state.topic, hp.state.partition,
                             proposal.kind, list(proposal.isr),
                             result.error.name if result.error else list(result.isr))
                replicas.act(hp, hp.state.on_alter_partition_result(proposal, result, now))
            if per_partition is logging.DEBUG:
                _log.info("AlterPartition of %d partitions: %s", len(proposals),
                          ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())))
