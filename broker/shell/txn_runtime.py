"""The transaction coordinator in the broker: shards over `__transaction_state`
and the marker sender (I/O shell).

Theory of operation
-------------------
`TransactionCoordinatorRuntime` drives the pure
`broker.core.txn.TransactionCoordinatorShard`, one per `__transaction_state`
partition this broker leads, the way `coordinator_runtime` drives the
group shards:

- **Load** (`on_metadata_update`): for each partition led here with no
  shard at that leader epoch, a shard is created with the leader epoch as
  its coordinator epoch, and a task replays the partition's log up to the
  log end offset seen then, and calls `on_loaded`. The markers of every
  transaction it finds preparing are sent (failover: the new coordinator
  completes what the old one logged). Meanwhile calls are answered
  COORDINATOR_LOAD_IN_PROGRESS.
- **Unload**: a partition no longer led here, or led at a new leader
  epoch, drops its shard and its marker jobs; calls waiting on it are
  answered NOT_COORDINATOR.
- **Steps**: each step's records are appended at once through the
  leader append (`ReplicaManager.append_to_leader`, acks=all rules), and
  its answer and marker jobs are held until the partition's high watermark
  reaches the log end offset right after that append (the current log end
  offset when the step wrote nothing). So a transition is committed before
  the client hears of it and before any marker is written. A failed
  append answers NOT_COORDINATOR and reloads the shard from the log.
- **Markers** (`MarkerSender`): the jobs' partitions are grouped by their
  current leader in this broker's metadata image and sent as one
  WriteTxnMarkers per leader broker at a time, over the broker's own
  connections. A partition that answers NONE is done; any other answer,
  a lost connection or a missing leader is retried after a backoff,
  against the leader the newest image names, for as long as the shard that
  owns the job is loaded. A partition of a deleted topic is dropped (as
  Kafka does). When a job has no partition left, `markers_written` logs
  CompleteCommit/CompleteAbort.
- **Timers**: `tick` runs on each shard at its `next_deadline_ms`
  (aborting timed-out transactions, expiring idle transactional ids).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio
import trio.lowlevel
from kio.schema.errors import ErrorCode
from kio.schema.write_txn_markers.v1 import request as wtm_req

from broker.core.txn import (
    TRANSACTION_STATE_TOPIC_NAME,
    MarkerJob,
    Step,
    TransactionCoordinatorConfig,
    TransactionCoordinatorShard,
    TransactionRecordError,
    partition_for_transactional_id,
)
from broker.shell.hosted_partition import HostedPartition, wait_for_change
from broker.shell.shard_host import ShardHost, ShardRunner
from common.errors import RaftkaError
from common.wire import ConnectionFailedError, ConnectionPool
from storage.batch import build_batch, iter_batch_headers, iter_records
from storage.errors import StorageError

#: Wait between marker attempts to one broker after a failure, doubling
#: per failure in a row up to the max (Kafka's `retry.backoff.ms` 100 ms and
#: `retry.backoff.max.ms` 1000 ms).
MARKER_RETRY_BACKOFF_S = 0.1
MARKER_RETRY_BACKOFF_MAX_S = 1.0
MARKER_REQUEST_TIMEOUT_MS = 30_000

_log = logging.getLogger("broker.txn")


class NotCoordinator(RaftkaError):
    """Raised inside the runtime when a call's shard is not here (answered
    NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS by the handler)."""

    def __init__(self, error: ErrorCode) -> None:
        super().__init__(error.name)
        self.error = error


class TransactionCoordinatorRuntime(ShardHost):
    topic_name = TRANSACTION_STATE_TOPIC_NAME

    def __init__(self, broker, config: TransactionCoordinatorConfig) -> None:
        super().__init__(broker, config)
        self.markers = MarkerSender(self)
        #: What a call answers when its step's append failed (set by `_append`).
        self._append_error = ErrorCode.not_coordinator

    async def _start_tasks(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.markers.run)

    def _on_due(self, runner: ShardRunner, now_ms: int) -> None:
        step = runner.shard.tick(now_ms)
        if step.markers:
            _log.info("%s-%d: aborting the timed-out transactions of %s (their producers fenced)",
                      TRANSACTION_STATE_TOPIC_NAME, runner.partition,
                      ", ".join(job.transactional_id for job in step.markers))
        expired = len(step.records) - len(step.markers)
        if expired:
            _log.info("%s-%d: %d transactional ids expired (transactional.id.expiration.ms)",
                      TRANSACTION_STATE_TOPIC_NAME, runner.partition, expired)
        self._absorb(runner, step)

    def on_metadata_update(self) -> None:
        super().on_metadata_update()
        if self._nursery is not None:
            self.markers.wake()

    # --- loading ---------------------------------------------------------

    def _load(self, partition: int, hp: HostedPartition) -> None:
        assert self._nursery is not None
        shard = TransactionCoordinatorShard(partition, hp.state.leader_epoch, self.config)
        runner = self.shards[partition] = ShardRunner(shard, hp)
        self._nursery.start_soon(self._replay, runner)

    async def _replay(self, runner: ShardRunner) -> None:
        log = runner.hp.log
        shard = runner.shard
        records = 0
        with runner.load_scope:
            end = log.log_end_offset
            offset = log.log_start_offset
            try:
                while offset < end:
                    data = log.read_bytes(offset, self.config.transaction_state_log_load_buffer_size,
                                          max_offset=end)
                    if not data:
                        break
                    for position, header in iter_batch_headers(data):
                        if not header.is_control:
                            for record in iter_records(data, position):
                                if record.key is not None:
                                    shard.replay(record.key, record.value)
                                    records += 1
                        offset = header.next_offset
                    await trio.lowlevel.checkpoint()
            except (TransactionRecordError, StorageError) as exc:
                _log.error("%s-%d: cannot load the transactions of this partition: %s; they stay unavailable "
                           "here until the partition's leadership changes", TRANSACTION_STATE_TOPIC_NAME,
                           runner.partition, exc)
                runner.active = False
                return
            step = shard.on_loaded(self.broker.clock_ms())
            # Most of the 50 partitions are empty: say so only when asked.
            _log.log(logging.INFO if records else logging.DEBUG,
                     "%s-%d: loaded %d transactional ids from %d records up to offset %d (coordinator epoch %d, "
                     "%d transactions to complete)", TRANSACTION_STATE_TOPIC_NAME, runner.partition,
                     len(shard.txns), records, end, runner.leader_epoch, len(step.markers))
            self._absorb(runner, step)

    def _unload(self, runner: ShardRunner, why: str) -> None:
        self._timers_moved.set()
        runner.load_scope.cancel()
        runner.active = False
        if self.shards.get(runner.partition) is runner:
            del self.shards[runner.partition]
        had = len(runner.shard.txns)
        runner.shard.unload()
        self.markers.drop(runner)
        _log.log(logging.INFO if had else logging.DEBUG, "%s-%d: unloaded the transaction coordinator shard (%s)",
                 TRANSACTION_STATE_TOPIC_NAME, runner.partition, why)

    # --- calls -----------------------------------------------------------

    def runner_for(self, transactional_id: str) -> ShardRunner:
        """The loaded shard of `transactional_id` here, or NotCoordinator."""
        n = self.num_partitions()
        if n is None:
            raise NotCoordinator(ErrorCode.not_coordinator)
        runner = self.shards.get(partition_for_transactional_id(transactional_id, n))
        if runner is None or not runner.active:
            raise NotCoordinator(ErrorCode.not_coordinator)
        if not runner.shard.loaded:
            raise NotCoordinator(ErrorCode.coordinator_load_in_progress)
        return runner

    async def call(self, runner: ShardRunner, fn: Callable[[TransactionCoordinatorShard, int], Step]) -> Any:
        """Take one step on the runner's shard; its response once committed."""
        if not runner.active or not runner.shard.loaded:
            raise NotCoordinator(ErrorCode.not_coordinator)
        step = fn(runner.shard, self.broker.clock_ms())
        barrier = self._absorb(runner, step)
        if barrier is None:
            raise NotCoordinator(self._append_error)
        deadline = trio.current_time() + self.config.transaction_state_write_timeout_ms / 1000
        await self._wait_committed(runner, barrier, deadline)
        return step.response

    async def _wait_committed(self, runner: ShardRunner, barrier: int, deadline: float) -> None:
        hp = runner.hp
        while True:
            state = hp.state
            if not runner.active or not state.is_leader or state.leader_epoch != runner.leader_epoch:
                raise NotCoordinator(ErrorCode.not_coordinator)
            if state.high_watermark >= barrier:
                return
            if trio.current_time() >= deadline:
                raise NotCoordinator(ErrorCode.coordinator_not_available)
            await wait_for_change((hp,), deadline)

    def _absorb(self, runner: ShardRunner, step: Step) -> int | None:
        """Append a step's records; hold its markers behind them. The
        barrier its response waits for, or None if the append failed."""
        self._timers_moved.set()
        hp = runner.hp
        if step.records:
            barrier = self._append(runner, step)
            if barrier is None:
                if runner.active:
                    self._unload(runner, "an append failed")
                    self.on_metadata_update()
                return None
        else:
            barrier = hp.log.log_end_offset
        if step.markers:
            assert self._nursery is not None
            self._nursery.start_soon(self._release_markers, runner, barrier, step.markers)
        return barrier

    async def _release_markers(self, runner: ShardRunner, barrier: int, jobs: tuple[MarkerJob, ...]) -> None:
        try:
            await self._wait_committed(runner, barrier, math.inf)
        except NotCoordinator:
            return  # the next coordinator replays the Prepare record and sends them
        for job in jobs:
            self.markers.add(runner, job)

    def _append(self, runner: ShardRunner, step: Step) -> int | None:
        broker = self.broker
        now_ms = broker.clock_ms()
        batch = build_batch([(r.key, r.value, (), now_ms) for r in step.records])
        answer, hp, required = broker.replicas.append_to_leader(
            broker.image, TRANSACTION_STATE_TOPIC_NAME, runner.partition, bytearray(batch), -1, now_ms)
        if answer.error_code != ErrorCode.none or hp is not runner.hp:
            _log.warning("%s-%d: appending %d transaction records failed with %s %s", TRANSACTION_STATE_TOPIC_NAME,
                         runner.partition, len(step.records), ErrorCode(answer.error_code).name,
                         answer.error_message or "")
            # As Kafka's TransactionStateManager answers a failed append: the
            # client looks the coordinator up again when leadership moved,
            # and retries here when the partition is short of in-sync replicas.
            self._append_error = (ErrorCode.not_coordinator if answer.error_code in (
                ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition) or hp is not runner.hp
                else ErrorCode.coordinator_not_available)
            return None
        return required

    def on_markers_written(self, runner: ShardRunner, job: MarkerJob) -> None:
        if runner.active and runner.shard.loaded:
            self._absorb(runner, runner.shard.markers_written(job, self.broker.clock_ms()))


class _Pending:
    """A marker job and the partitions still without their marker."""

    def __init__(self, runner: ShardRunner, job: MarkerJob) -> None:
        self.runner = runner
        self.job = job
        self.remaining = set(job.partitions)


class MarkerSender:
    """WriteTxnMarkers to partition leaders, retried until written."""

    def __init__(self, runtime: TransactionCoordinatorRuntime) -> None:
        self.runtime = runtime
        self.broker = runtime.broker
        self._pending: dict[tuple[str, int, int], _Pending] = {}
        self._wake = trio.Event()
        self._busy: set[int] = set()
        self._backoff_until: dict[int, float] = {}
        #: Failed attempts in a row per broker (the backoff doubles; only the first is logged).
        self._failures: dict[int, int] = {}
        self._pool: ConnectionPool | None = None
        self._nursery: trio.Nursery | None = None
        #: With `keep_sent`, every WriteTxnMarkers request sent, with its target broker (for tests).
        self.sent: list[tuple[int, Any]] = []
        self.keep_sent = False

    def add(self, runner: ShardRunner, job: MarkerJob) -> None:
        if not runner.active:
            return
        pending = _Pending(runner, job)
        if not pending.remaining:
            self.runtime.on_markers_written(runner, job)
            return
        self._pending[(job.transactional_id, job.producer_id, job.producer_epoch)] = pending
        self.wake()

    def drop(self, runner: ShardRunner) -> None:
        for key, pending in list(self._pending.items()):
            if pending.runner is runner:
                del self._pending[key]

    def pending_jobs(self) -> list[MarkerJob]:
        return [p.job for p in self._pending.values()]

    def wake(self) -> None:
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._pool = ConnectionPool(nursery, client_id=f"raftka-txn-markers-{self.broker.node_id}",
                                        log=_log, security=self.broker.config.inter_broker_security)
            task_status.started()
            try:
                while True:
                    sleep_s = self._send_round()
                    with trio.move_on_after(sleep_s):
                        await self._wake.wait()
                    self._wake = trio.Event()
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await self._pool.aclose()

    def _send_round(self) -> float:
        """Start one request per idle leader broker; how long to sleep."""
        if not self._pending:
            return math.inf
        image = self.broker.image
        now = trio.current_time()
        by_broker: dict[int, dict[tuple[str, int, int], set[tuple[str, int]]]] = {}
        waiting = False
        for key, pending in list(self._pending.items()):
            for tp in list(pending.remaining):
                topic = image.topic(tp[0])
                if topic is None or tp[1] not in topic.partitions:
                    # The topic was deleted: no marker can or need be written.
                    pending.remaining.discard(tp)
                    continue
                leader = topic.partitions[tp[1]].leader
                if leader < 0 or self._address(leader) is None:
                    waiting = True
                    continue
                by_broker.setdefault(leader, {}).setdefault(key, set()).add(tp)
            if not pending.remaining:
                self._complete(key)
        for broker_id, jobs in by_broker.items():
            if broker_id in self._busy:
                continue
            if self._backoff_until.get(broker_id, 0.0) > now:
                waiting = True
                continue
            self._busy.add(broker_id)
            assert self._nursery is not None
            self._nursery.start_soon(self._send, broker_id, jobs)
        return MARKER_RETRY_BACKOFF_S if waiting or by_broker else math.inf

    async def request(self, broker_id: int, request: Any, timeout_ms: int) -> Any:
        """One request to another broker over this sender's pool (the
        partition-side verification's AddPartitionsToTxn); raises
        ConnectionFailedError when the broker has no address."""
        address = self._address(broker_id)
        if address is None or self._pool is None:
            raise ConnectionFailedError(f"broker {broker_id} has no address in the metadata image")
        self._pool.set_address(broker_id, *address)
        return await self._pool.request(broker_id, request, timeout_ms=timeout_ms)

    def _address(self, broker_id: int) -> tuple[str, int] | None:
        registration = self.broker.image.brokers.get(broker_id)
        if registration is None or registration.fenced or not registration.endpoints:
            return None
        for endpoint in registration.endpoints:
            if endpoint.name == self.broker.config.inter_broker_listener:
                return endpoint.host, endpoint.port
        return registration.endpoints[0].host, registration.endpoints[0].port

    async def _send(self, broker_id: int, jobs: dict[tuple[str, int, int], set[tuple[str, int]]]) -> None:
        markers = []
        for key, tps in list(jobs.items()):
            pending = self._pending.get(key)
            if pending is None:  # dropped (its shard unloaded) since the round
                del jobs[key]
                continue
            job = pending.job
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(tps):
                by_topic.setdefault(topic, []).append(p)
            markers.append(wtm_req.WritableTxnMarker(
                producer_id=job.producer_id, producer_epoch=job.producer_epoch, transaction_result=job.commit,
                topics=tuple(wtm_req.WritableTxnMarkerTopic(name=t, partition_indexes=tuple(ps))
                             for t, ps in by_topic.items()),
                coordinator_epoch=job.coordinator_epoch))
        request = wtm_req.WriteTxnMarkersRequest(markers=tuple(markers))
        failed = False
        try:
            if not markers:
                return
            address = self._address(broker_id)
            if address is None:
                failed = True
                return
            assert self._pool is not None
            self._pool.set_address(broker_id, *address)
            if self.keep_sent:
                self.sent.append((broker_id, request))
            response = await self._pool.request(broker_id, request, timeout_ms=MARKER_REQUEST_TIMEOUT_MS)
            failed = not self._absorb(jobs, response)
        except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
            if not self._failures.get(broker_id):
                _log.info("WriteTxnMarkers to broker %d: %s; retrying until it answers", broker_id, exc)
            failed = True
        except Exception as exc:  # noqa: BLE001 -- a malformed answer: retry, never take the broker down
            _log.warning("WriteTxnMarkers to broker %d failed: %r; retrying", broker_id, exc)
            failed = True
        finally:
            self._busy.discard(broker_id)
            if failed:
                n = self._failures[broker_id] = self._failures.get(broker_id, 0) + 1
                backoff_s = min(MARKER_RETRY_BACKOFF_S * 2 ** min(n - 1, 10), MARKER_RETRY_BACKOFF_MAX_S)
                self._backoff_until[broker_id] = trio.current_time() + backoff_s
            else:
                self._failures.pop(broker_id, None)
            self.wake()

    def _absorb(self, jobs, response) -> bool:
        """Apply one answer; whether every partition in it was written."""
        all_written = True
        by_pid: dict[int, Any] = {r.producer_id: r for r in response.markers}
        for key, tps in jobs.items():
            pending = self._pending.get(key)
            if pending is None:
                continue
            result = by_pid.get(pending.job.producer_id)
            errors: dict[tuple[str, int], int] = {}
            if result is not None:
                for topic in result.topics:
                    for p in topic.partitions:
                        errors[(topic.name, p.partition_index)] = p.error_code
            for tp in tps:
                error = errors.get(tp, ErrorCode.unknown_server_error)
                if error == ErrorCode.none:
                    pending.remaining.discard(tp)
                elif error in (ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced):
                    # A newer producer epoch or coordinator owns the partition's
                    # transaction state: this job can never succeed (Kafka drops it too).
                    _log.warning("WriteTxnMarkers for %s on %s-%d refused with %s; dropping the job",
                                 key[0], tp[0], tp[1], ErrorCode(error).name)
                    self._pending.pop(key, None)
                    break
                else:
                    all_written = False
                    _log.debug("WriteTxnMarkers for %s on %s-%d: %s; retrying", key[0], tp[0], tp[1],
                               ErrorCode(error).name)
            if key in self._pending and not pending.remaining:
                self._complete(key)
        return all_written

    def _complete(self, key: tuple[str, int, int]) -> None:
        pending = self._pending.pop(key)
        self.runtime.on_markers_written(pending.runner, pending.job)
