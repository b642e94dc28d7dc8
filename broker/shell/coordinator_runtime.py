"""The group coordinator in the broker: shards over `__consumer_offsets` (I/O shell).

Theory of operation
-------------------
`GroupCoordinatorRuntime` drives the pure `broker.core.group.GroupCoordinatorShard`
exactly as that package's docstring asks, one shard per `__consumer_offsets`
partition this broker leads:

- **Load** (`on_metadata_update`, after the replica manager applied the
  delta): for each partition of the topic this broker now leads, and has no
  shard for at that leader epoch, a shard is created and a task replays the
  partition's log from its start to the log end offset seen at that moment
  (control batches skipped), yielding to the event loop between reads, then
  calls `on_loaded`. Meanwhile the shard answers COORDINATOR_LOAD_IN_PROGRESS.
  This is coordinator failover: the new leader of a partition rebuilds its
  groups and committed offsets from the records alone.
- **Unload**: a partition no longer led here (or led at a new leader epoch:
  another leader may have written in between, so the shard is rebuilt)
  drops its shard; its parked requests are answered NOT_COORDINATOR.
- **Requests**: a group API request is split by partition
  (`split_by_partition`; ListGroups goes to every shard here); a part for a
  partition without a shard here is answered NOT_COORDINATOR at once. The
  shard is called inside `ctx.in_order`, so one connection's requests reach
  it in the order they were sent, as Kafka's one-at-a-time connections
  guarantee; a parked request (JoinGroup, a follower's SyncGroup) leaves
  that block and waits for a later step to answer it.
- **Results**: the records of every step (request, tick, unload) are
  appended at once, in order, as one uncompressed batch through the same
  leader append as Produce (`ReplicaManager.append_to_leader`, acks=all
  rules). Each response of the step is held until the partition's high
  watermark reaches the log end offset right after that append (or the
  current log end offset when the step wrote nothing: it may depend on
  earlier, uncommitted writes). So an OffsetCommit is answered only once
  its records are committed. Held responses become NOT_COORDINATOR when
  leadership is lost and COORDINATOR_NOT_AVAILABLE after
  `offsets.commit.timeout.ms`. A failed append answers the step's responses
  NOT_COORDINATOR and reloads the shard from the log, because the shard
  already applied what did not get written.
- **Transactional offsets** (TxnOffsetCommit): the shard's records of one
  come as `txn_records` and are appended as a transactional batch of the
  producer (`ReplicaManager.append_coordinator_batch`: epoch checked, no
  sequence), after a check that the producer's epoch is not stale here
  (INVALID_PRODUCER_EPOCH, before the shard takes them as pending). A
  COMMIT/ABORT marker written to the partition (`broker.api.txn_markers`)
  calls `on_txn_marker`, which ends them in the shard (queued until the
  replay is over if the shard is loading); the replay itself treats a
  transactional batch's records as pending and applies the markers in
  log order.
- **Timers**: `tick` runs on shards whose `next_deadline_ms` has passed
  (session expiry, join and sync phases, the `offsets.retention.minutes`
  sweep), from the timer task of `broker.shell.shard_host`, which every
  step that may have moved a deadline wakes (a request, a tick, a load,
  an unload).
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Hashable
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from broker.core.group import (
    OFFSETS_TOPIC_NAME,
    CoordinatorResult,
    GroupCoordinatorConfig,
    GroupCoordinatorShard,
    GroupRecordError,
    RequestContext,
    error_response,
    is_multi_group,
    merge_responses,
    split_by_partition,
)
from broker.shell.hosted_partition import HostedPartition, wait_for_change
from broker.shell.shard_host import ShardHost, ShardRunner
from broker.core.group.routing import TXN_OFFSET_COMMIT
from storage.batch import ControlRecordType, build_batch, iter_batch_headers, iter_records, read_txn_marker
from storage.errors import StorageError

#: Bytes read per step of a replay; the loop yields between steps (each
#: record is decoded in Python: about 128 KiB of small records per 10 ms).
REPLAY_READ_BYTES = 128 * 1024
LIST_GROUPS = 16

_log = logging.getLogger("broker.coordinator")


class GroupShardRunner(ShardRunner):
    """A group shard with the partition it is loaded from."""

    def __init__(self, shard: GroupCoordinatorShard, hp: HostedPartition) -> None:
        super().__init__(shard, hp)
        #: Transaction markers that landed while the shard was loading:
        #: (producer id, commit), applied after the replay, in order.
        self.markers_while_loading: list[tuple[int, bool]] = []


class HeldResponse:
    """One request part waiting for the shard's answer and for that
    answer's records to commit."""

    def __init__(self, token: Hashable, request: Any, runner: GroupShardRunner) -> None:
        self.token = token
        self.request = request
        self.runner = runner
        self.ready = trio.Event()
        self.response: Any = None
        #: The high watermark the response waits for (None: send at once).
        self.barrier: int | None = None
        self.deadline = 0.0

    def answer(self, response: Any, barrier: int | None, deadline: float) -> None:
        if self.ready.is_set():
            return
        self.response, self.barrier, self.deadline = response, barrier, deadline
        self.ready.set()

    async def wait(self) -> Any:
        await self.ready.wait()
        if self.barrier is None:
            return self.response
        hp = self.runner.hp
        while True:
            state = hp.state
            if not state.is_leader or state.leader_epoch != self.runner.leader_epoch:
                # Another leader may have truncated what was appended.
                return error_response(self.request, ErrorCode.not_coordinator)
            if state.high_watermark >= self.barrier:
                return self.response
            if trio.current_time() >= self.deadline:
                return error_response(self.request, ErrorCode.coordinator_not_available)
            await wait_for_change((hp,), self.deadline)


class GroupCoordinatorRuntime(ShardHost):
    topic_name = OFFSETS_TOPIC_NAME

    def __init__(self, broker, config: GroupCoordinatorConfig) -> None:
        super().__init__(broker, config)
        self.shards: dict[int, GroupShardRunner] = {}
        self._held: dict[Hashable, HeldResponse] = {}
        self._tokens = itertools.count(1)
        # Member ids must differ across coordinators and restarts: each
        # shard's generator is seeded from the system's entropy.
        self._seeds = random.SystemRandom()
        self._topics_image = None
        self._partition_racks: dict = {}
        self._topics: dict = {}
        #: Rebalances completed by shards no longer here (metrics: the
        #: broker's count goes on across a shard's unload).
        self.retired_rebalances = 0
        self.retired_consumer_rebalances = 0

    def _topic_metadata(self) -> dict:
        """name -> (topic id, partitions) for the consumer groups' assignors,
        rebuilt only when the metadata image moved."""
        image = self.broker.image
        if self._topics_image is not image:
            self._topics_image = image
            self._topics = {t.name: (t.topic_id, len(t.partitions)) for t in image.topics_by_id.values()}
            brokers = image.brokers
            # The racks of each partition's replicas, for rack-aware assignment (client.rack).
            self._partition_racks = {
                (t.topic_id, p): frozenset(brokers[r].rack for r in reg.replicas if r in brokers and brokers[r].rack)
                for t in image.topics_by_id.values() for p, reg in t.partitions.items()} \
                if any(b.rack for b in brokers.values()) else {}
        return self._topics

    def _on_due(self, runner: GroupShardRunner, now_ms: int) -> None:
        runner.shard.topics = self._topic_metadata()
        runner.shard.consumer.partition_racks = self._partition_racks
        self._absorb(runner, runner.shard.tick(now_ms))

    # --- loading ---------------------------------------------------------

    def _load(self, partition: int, hp: HostedPartition) -> None:
        assert self._nursery is not None
        shard = GroupCoordinatorShard(partition, self.config, random.Random(self._seeds.getrandbits(64)))
        runner = self.shards[partition] = GroupShardRunner(shard, hp)
        self._nursery.start_soon(self._replay, runner)

    async def _replay(self, runner: GroupShardRunner) -> None:
        log = runner.hp.log
        shard = runner.shard
        start = trio.current_time()
        records = 0
        with runner.load_scope:
            end = log.log_end_offset
            offset = log.log_start_offset
            try:
                while offset < end:
                    data = log.read_bytes(offset, REPLAY_READ_BYTES, max_offset=end)
                    if not data:
                        break
                    for position, header in iter_batch_headers(data):
                        if header.is_control:
                            if header.producer_id >= 0:
                                marker = read_txn_marker(data, position)
                                if marker is not None:
                                    shard.complete_transaction(header.producer_id,
                                                               marker[0] == ControlRecordType.COMMIT)
                        else:
                            # A transactional batch holds a TxnOffsetCommit: pending until its marker.
                            producer_id = header.producer_id if header.is_transactional else -1
                            for record in iter_records(data, position):
                                if record.key is not None:
                                    shard.replay(record.key, record.value, producer_id, record.offset)
                                    records += 1
                        offset = header.next_offset
                    await trio.sleep(0)
            except (GroupRecordError, StorageError) as exc:
                _log.error("%s-%d: cannot load the groups of this partition: %s; its groups stay "
                           "unavailable here until the partition's leadership changes",
                           OFFSETS_TOPIC_NAME, runner.partition, exc)
                runner.active = False
                return
            for producer_id, commit in runner.markers_while_loading:
                shard.complete_transaction(producer_id, commit)
            runner.markers_while_loading.clear()
            shard.on_loaded(self.broker.clock_ms())
            self._timers_moved.set()
            _log.info("%s-%d: loaded %d groups from %d records up to offset %d in %.0f ms (leader epoch %d)",
                      OFFSETS_TOPIC_NAME, runner.partition, len(shard.groups), records, end,
                      (trio.current_time() - start) * 1000, runner.leader_epoch)

    def _unload(self, runner: GroupShardRunner, why: str) -> None:
        self._timers_moved.set()
        runner.load_scope.cancel()
        runner.active = False
        if self.shards.get(runner.partition) is runner:
            del self.shards[runner.partition]
        self.retired_rebalances += runner.shard.rebalances
        self.retired_consumer_rebalances += runner.shard.consumer_rebalances
        result = runner.shard.unload()
        for token, response in result.responses:
            held = self._held.get(token)
            if held is not None:
                held.answer(response, None, 0.0)
        for held in self._held.values():
            if held.runner is runner:
                held.answer(error_response(held.request, ErrorCode.not_coordinator), None, 0.0)
        _log.info("%s-%d: unloaded the group coordinator shard (%s)", OFFSETS_TOPIC_NAME, runner.partition, why)

    # --- requests --------------------------------------------------------

    async def handle(self, ctx, request) -> Any:
        """Answer one group API request (the broker's handler for every key
        of `GROUP_API_VERSIONS`)."""
        body = request.body
        n = self.num_partitions()
        if int(type(body).__api_key__) == LIST_GROUPS:
            parts = {p: body for p, runner in self.shards.items() if runner.active}
        elif n is None:
            return error_response(body, ErrorCode.not_coordinator)
        else:
            parts = split_by_partition(body, n)
        client_id = request.header.client_id or ""
        client_host = "/" + ctx.peer.rsplit(":", 1)[0]
        waits = []
        async with ctx.in_order(request):
            for p, part in parts.items():
                runner = self.shards.get(p)
                if runner is None or not runner.active:
                    waits.append(error_response(part, ErrorCode.not_coordinator))
                else:
                    waits.append(self._submit(runner, part, client_id, client_host))
        try:
            answers = [await w.wait() if isinstance(w, HeldResponse) else w for w in waits]
        finally:
            # Answered, or the connection went away: a later answer to a
            # parked part finds no one to send it to and is dropped.
            for w in waits:
                if isinstance(w, HeldResponse):
                    self._held.pop(w.token, None)
        return merge_responses(body, answers) if is_multi_group(body) else answers[0]

    def _submit(self, runner: GroupShardRunner, part: Any, client_id: str, client_host: str) -> HeldResponse | Any:
        if int(type(part).__api_key__) == TXN_OFFSET_COMMIT and runner.shard.loaded:
            # The partition's producer state fences a stale producer epoch
            # before the shard takes the offsets as pending (the append
            # would refuse the batch after the shard had applied it).
            producer_state = runner.hp.log.producer_state
            checked = producer_state.check_epoch(part.producer_id, part.producer_epoch, "TxnOffsetCommit") \
                if producer_state is not None else None
            if checked is not None and checked.error:
                return error_response(part, ErrorCode(checked.error))
        token = next(self._tokens)
        held = self._held[token] = HeldResponse(token, part, runner)
        runner.shard.topics = self._topic_metadata()
        runner.shard.consumer.partition_racks = self._partition_racks
        result = runner.shard.handle(RequestContext(token, client_id, client_host), part, self.broker.clock_ms())
        self._absorb(runner, result)
        return held

    def on_txn_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT/ABORT marker of `producer_id` was appended to
        `__consumer_offsets` partition `partition` (WriteTxnMarkers): its
        pending transactional offsets become committed or are dropped."""
        runner = self.shards.get(partition)
        if runner is None or not runner.active:
            return  # a later leader replays the marker from the log
        if runner.shard.loaded:
            runner.shard.complete_transaction(producer_id, commit)
        else:
            runner.markers_while_loading.append((producer_id, commit))

    # --- results ---------------------------------------------------------

    def _absorb(self, runner: GroupShardRunner, result: CoordinatorResult) -> None:
        """Append a step's records, then hold its responses behind them."""
        self._timers_moved.set()
        hp = runner.hp
        deadline = trio.current_time() + self.config.offsets_commit_timeout_ms / 1000
        if result.records or result.txn_records:
            barrier = self._append(runner, result)
            if barrier is None:
                for token, _response in result.responses:
                    held = self._held.get(token)
                    if held is not None:
                        held.answer(error_response(held.request, ErrorCode.not_coordinator), None, 0.0)
                if runner.active:
                    self._unload(runner, "an append failed")
                    self.on_metadata_update()
                return
        else:
            barrier = hp.log.log_end_offset
        for token, response in result.responses:
            held = self._held.get(token)
            if held is not None:
                held.answer(response, barrier, deadline)

    def _append(self, runner: GroupShardRunner, result: CoordinatorResult) -> int | None:
        """Append the records as leader; the log end offset after, or None."""
        broker = self.broker
        now_ms = broker.clock_ms()
        required = None
        if result.records:
            batch = build_batch([(r.key, r.value, (), now_ms) for r in result.records])
            answer, hp, required = broker.replicas.append_to_leader(
                broker.image, OFFSETS_TOPIC_NAME, runner.partition, bytearray(batch), -1, now_ms)
            if answer.error_code != ErrorCode.none or hp is not runner.hp:
                hint = ""
                if answer.error_code == ErrorCode.not_enough_replicas:
                    # Kafka refuses these writes too; say what unblocks them.
                    hint = ("(fewer in-sync replicas than its min.insync.replicas: joins, syncs and offset "
                            "commits of its groups fail until a replica catches up or the broker returns)")
                _log.warning("%s-%d: appending %d group records failed with %s %s%s", OFFSETS_TOPIC_NAME,
                             runner.partition, len(result.records), ErrorCode(answer.error_code).name,
                             answer.error_message or "", hint)
                return None
        for producer_id, producer_epoch, records in result.txn_records:
            # A TxnOffsetCommit: the producer's transactional batch (Kafka
            # numbers no sequence for it; the base sequence is 0 as Kafka's).
            batch = build_batch([(r.key, r.value, (), now_ms) for r in records], producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=0, is_transactional=True)
            error, required = broker.replicas.append_coordinator_batch(runner.hp, bytearray(batch), now_ms)
            if error is not ErrorCode.none:
                _log.warning("%s-%d: appending the transactional offsets of producer %d failed with %s",
                             OFFSETS_TOPIC_NAME, runner.partition, producer_id, ErrorCode(error).name)
                return None
        return required

async def handle_group_request(broker, ctx, request):
    return await broker.coordinator.handle(ctx, request)
