"""One flow's mirror process: a consumer on the source, a producer on the target.

The loop, at-least-once (the default):

1. every `refresh.topics.interval.seconds`: list the source's topics, pick
   the mirrored ones (`mirror.policy`), create each on the target with the
   source's partition count and mirrored configs, add partitions and copy
   config changes the source made since; subscribe to the topics the target
   holds (nothing is read that cannot be written);
2. consume from the source in the mirror's consumer group (several
   processes with the same `group.id` share the partitions), produce each
   record to the same partition of the target topic with its key, value,
   headers and timestamp (an idempotent producer: order per partition holds
   through retries);
3. when the target acknowledges a record, store its source offset; every
   `offset.flush.interval.ms`, commit the stored offsets to the source
   group. A record the target refused (too large, topic gone, ...) blocks
   its partition: the error is printed, the producer drained, the consumer
   sought back to that record and the partition paused for a backoff (1 s
   doubling to 30 s, per partition; the others go on), then the record is
   sent again, until the target takes it. Nothing is skipped;
4. offset syncs go to the source's offset-syncs topic, checkpoints of the
   source's consumer groups (for the partitions this process owns) to the
   target's checkpoints topic, and with `sync.group.offsets.enabled` into
   the target's groups that have no member there.

With `exactly.once.support=enabled` step 3 is a transaction on the target
per batch, holding the records and the source group's offsets; its steps
are in `mirror.eos`.

An unreachable cluster is retried with the same backoff, with a message
naming it each time.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition)
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, NewTopic

from mirror.config import FlowConfig
from mirror.eos import ExactlyOnceSteps
from mirror.errors import Backoff, MirrorError, _quiet
from mirror.offsets import CheckpointTracker, OffsetSync, OffsetSyncEmitter, OffsetSyncStore
from mirror.policy import HEARTBEATS_TOPIC
from mirror.topics import ADMIN_TIMEOUT_S, TopicFollower

log = logging.getLogger("raftka.mirror")

UNASSIGNED_WARNING_S = 30.0
#: How long one reachability probe waits (short: a stop request is answered between probes).
REACH_TIMEOUT_S = 3.0
#: Lag: a partition the consumer gave no record for this long has the
#: timestamp of its oldest record not copied read from the source.
PROBE_AFTER_S = 2.0
#: librdkafka's own ceiling for a produced message; the target's limit is what decides.
PRODUCER_MAX_MESSAGE_BYTES = 100 * 1024 * 1024


def _common_keys(cfg: FlowConfig, on_target: bool) -> set[str]:
    """The settings given as `<alias>.<setting>` (for every client) rather than per kind."""
    clients = cfg.target_clients if on_target else cfg.source_clients
    kinds = [set(v.items()) for v in clients.values()]
    return {k for k, _ in set.intersection(*kinds)} if kinds else set()


@dataclasses.dataclass
class PartitionLag:
    records: int = 0
    seconds: float = 0.0
    mirrored: int = 0


@dataclasses.dataclass
class FlowStats:
    """What the progress display and the tests read (updated by the worker thread)."""

    mirrored: int = 0
    bytes: int = 0
    checkpoints: int = 0
    synced_groups: int = 0
    errors: int = 0
    last_error: str = ""
    #: Exactly once: transactional producers replaced (fatal error or a stuck
    #: call), and how many of them are still left behind with a stuck call (0 or 1).
    producer_replacements: int = 0
    abandoned_producers: int = 0
    #: Source consumers replaced after a fatal error (a fenced static member).
    consumer_replacements: int = 0
    state: str = "starting"
    topics: dict[str, str] = dataclasses.field(default_factory=dict)
    lag: dict[tuple[str, int], PartitionLag] = dataclasses.field(default_factory=dict)



class Flow(ExactlyOnceSteps):
    """One source->target flow, run by `run()` until `stop` is set."""

    def __init__(self, flow: FlowConfig, stop: threading.Event, say: Callable[[str], None] = print,
                 instance: str | None = None) -> None:
        self.cfg = flow
        self.stop = stop
        self.say = say
        self.instance = instance
        self.stats = FlowStats()
        self.policy = flow.policy
        self.syncs_topic = self.policy.offset_syncs_topic(flow.target)
        self.checkpoints_topic = self.policy.checkpoints_topic(flow.source)
        self.emitter = OffsetSyncEmitter(flow.max_offset_lag)
        self.store = OffsetSyncStore()
        self.tracker = CheckpointTracker()
        self.topic_map: dict[str, str] = {}
        self._subscribed: list[str] = []
        self._assigned: set[tuple[str, int]] = set()
        self._blocked: dict[tuple[str, int], tuple[int, str]] = {}
        self._backoff = Backoff()  # exactly once: a refusal aborts the whole batch
        self._backoffs: dict[tuple[str, int], Backoff] = {}
        self._paused: dict[tuple[str, int], float] = {}
        #: Per source partition, (offset, timestamp ms) of the records read
        #: and not yet committed as copied, oldest first: the lag's seconds.
        self._uncopied: dict[tuple[str, int], collections.deque[tuple[int, int]]] = {}
        #: The timestamp of a record not yet read, (partition, offset) -> ms, from `_probe_timestamp`.
        self._probed: dict[tuple[str, int], tuple[int, int | None]] = {}
        self._lag_probe: Consumer | None = None
        #: Per source partition, when the consumer last gave a record, and that record's timestamp.
        self._last_read: dict[tuple[str, int], tuple[float, int]] = {}
        self._txn_offsets: dict[tuple[str, int], int] = {}
        self._acked: dict[tuple[str, int], int] = {}
        #: Per source partition, the next offset whose copy is committed (on the
        #: target with a transaction, or in the source group): what the lag counts from.
        self._done: dict[tuple[str, int], int] = {}
        self._stored: dict[tuple[str, int], int] = {}
        self._renewed = False
        self._consumer_failed: KafkaError | None = None
        self._stuck: threading.Thread | None = None
        self._abandoned = None  # an `eos.AbandonedProducer` still closing
        #: When a list (`raftka bench mirror`): per acknowledged record, the
        #: ms from its source timestamp to the target's acknowledgement.
        self.ack_lag_ms: list[float] | None = None

    # --- clients ----------------------------------------------------------

    def _client(self, cls: type, kind: str, on_target: bool, config: dict[str, Any]) -> Any:
        """A confluent-kafka client: the mirror's `config` with the user's
        `<alias>.*` settings for this kind of client over it; a bad one
        stops the flow with a message naming its key."""
        c = self.cfg
        alias = c.target if on_target else c.source
        user = c.target_client(kind) if on_target else c.source_client(kind)
        try:
            return cls({**config, **user})
        except (KafkaException, ValueError, TypeError) as exc:
            text = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            named = [k for k in sorted(user) if k in text] or sorted(user)
            keys = ", ".join(f"{alias}.{k}" if k in _common_keys(c, on_target) else f"{alias}.{kind}.{k}"
                             for k in named)
            raise MirrorError(f"the {kind} client of {alias} refused its settings ({keys}): {text}; "
                              "fix or remove the key (confluent-kafka/librdkafka setting names)") from None

    def _clients(self) -> None:
        c = self.cfg
        self.src_admin = self._client(AdminClient, "admin", False,
                                      {"bootstrap.servers": c.source_bootstrap, "logger": _quiet("src-admin")})
        self.tgt_admin = self._client(AdminClient, "admin", True,
                                      {"bootstrap.servers": c.target_bootstrap, "logger": _quiet("tgt-admin")})
        self.topics = TopicFollower(c, self.src_admin, self.tgt_admin, self.say, self._error)
        consumer_config = {
            "bootstrap.servers": c.source_bootstrap, "group.id": c.mirror_group,
            "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "logger": _quiet("consumer"),
            "fetch.wait.max.ms": 100, "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
        }
        if self.instance is not None:
            # Static membership (KIP-345): a restarted process takes its own
            # partitions back at once, without waiting out the dead one's session.
            consumer_config["group.instance.id"] = f"{c.mirror_group}-{self.instance}"
        self._consumer_config = consumer_config
        self.consumer = self._client(Consumer, "consumer", False, consumer_config)
        producer = {
            "bootstrap.servers": c.target_bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES, "logger": _quiet("producer"),
        }
        self.positions = None
        self._producer_config = producer
        if c.exactly_once:
            producer["transactional.id"] = f"{c.mirror_group}-{self.instance or 0}"
            # Exactly once, the source positions commit on the target, in the
            # copy's transaction, as MM2 keeps them in the target's offsets
            # store: this consumer of the target (it never joins its group, so
            # its metadata carries no generation to fence) names the group in
            # send_offsets_to_transaction and reads the positions back after a
            # restart. read_committed: an open transaction's offsets are waited
            # for, never read half done (KIP-447's require_stable).
            self.positions = self._client(Consumer, "consumer", True, {
                "bootstrap.servers": c.target_bootstrap, "group.id": c.mirror_group,
                "enable.auto.commit": False, "isolation.level": "read_committed",
                "logger": _quiet("positions"),
            })
        self.producer = self._client(Producer, "producer", True, producer)
        self.sync_producer = self._client(Producer, "producer", False, {
            "bootstrap.servers": c.source_bootstrap, "acks": "all", "linger.ms": 20,
            "logger": _quiet("sync-producer")})
        self.aux_producer = self._client(Producer, "producer", True, {
            "bootstrap.servers": c.target_bootstrap, "acks": "all", "linger.ms": 20,
            "logger": _quiet("aux-producer")})
        self.sync_reader = self._client(Consumer, "consumer", False, {
            "bootstrap.servers": c.source_bootstrap, "group.id": f"{c.mirror_group}-syncs-reader",
            "enable.auto.commit": False, "logger": _quiet("sync-reader"), "fetch.wait.max.ms": 100,
        })

    def _reachable(self, admin: AdminClient, alias: str, bootstrap: str) -> Any:
        """The cluster's metadata, retrying with backoff (and a message each time) until it answers."""
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                return admin.list_topics(timeout=REACH_TIMEOUT_S)
            except KafkaException as exc:
                self._error(f"cluster {alias} at {bootstrap} does not answer ({exc.args[0].str()}); "
                            f"retrying in {backoff.delay:.0f} s")
                self.stop.wait(backoff.next())
        return None

    def _error(self, message: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = message
        self.say(f"[{self.cfg.name}] {message}")

    # --- topics -----------------------------------------------------------

    def _ensure_internal(self) -> None:
        c = self.cfg
        compact = {"cleanup.policy": "compact"}
        self.topics.create(self.src_admin, c.source, [NewTopic(self.syncs_topic, 1, c.internal_replication_factor,
                                                         config=compact)])
        wanted = [NewTopic(self.checkpoints_topic, 1, c.internal_replication_factor, config=compact)]
        if c.emit_heartbeats:
            wanted.append(NewTopic(HEARTBEATS_TOPIC, 1, c.internal_replication_factor, config=compact))
        self.topics.create(self.tgt_admin, c.target, wanted)

    def refresh_topics(self) -> bool:
        """Bring the target's topics in line with the source's; True if both answered."""
        src = self._reachable(self.src_admin, self.cfg.source, self.cfg.source_bootstrap)
        tgt = self._reachable(self.tgt_admin, self.cfg.target, self.cfg.target_bootstrap)
        if src is None or tgt is None:
            return False
        ready = self.topics.follow(src, tgt, self.policy)
        # A topic whose metadata carries an error during a fault (no leader for a
        # moment) is still there: keep copying it rather than drop the subscription.
        kept = {s: t for s, t in self.topic_map.items() if s in src.topics and src.topics[s].error is not None
                and t in tgt.topics}
        ready = {**kept, **ready}
        self.topic_map = ready
        self.stats.topics = dict(ready)
        topics = sorted(ready)
        if topics != self._subscribed:
            if topics:
                self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                        on_lost=self._on_revoke)
            elif self._subscribed:
                self.consumer.unsubscribe()
            self._subscribed = topics
        return True

    # --- rebalance --------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced consumer's last callbacks (`_renew_consumer`)
        self._assigned |= {(p.topic, p.partition) for p in partitions}
        if self.positions is not None:
            # Exactly once: start where the last committed transaction left off.
            backoff = Backoff()
            while not self.stop.is_set():
                try:
                    consumer.assign(self._target_positions(partitions))
                    return
                except KafkaException as exc:
                    # Assigned without these positions the consumer would start from the source group's.
                    self._error(f"cannot read the positions committed on {self.cfg.target} for the assigned "
                                f"partitions ({exc.args[0].str()}); retrying in {backoff.delay:.0f} s")
                    self.stop.wait(backoff.next())

    def _target_positions(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The source positions committed on the target with the last
        transaction, or the beginning for a partition never copied."""
        committed = self.positions.committed([TopicPartition(p.topic, p.partition) for p in partitions],
                                             timeout=ADMIN_TIMEOUT_S)
        return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                for tp in committed]

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced consumer's last callbacks (`_renew_consumer`)
        # Finish what was sent and commit it before another process takes the partitions.
        if not self.cfg.exactly_once:
            self.producer.flush(30)
            self._commit()
        for p in partitions:
            self._forget((p.topic, p.partition))

    def _forget(self, tp: tuple[str, int]) -> None:
        """A partition no longer this process's."""
        self._assigned.discard(tp)
        self.emitter.forget(tp)
        self._blocked.pop(tp, None)
        self._paused.pop(tp, None)
        self._backoffs.pop(tp, None)
        self.stats.lag.pop(tp, None)
        self._done.pop(tp, None)
        self._uncopied.pop(tp, None)
        self._last_read.pop(tp, None)

    # --- the copy ---------------------------------------------------------

    def _delivered(self, source: tuple[str, int], offset: int, timestamp: int, size: int) -> Callable:
        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                if source not in self._blocked or offset < self._blocked[source][0]:
                    self._blocked[source] = (offset, f"{err.name()}: {err.str()}")
                return
            blocked = self._blocked.get(source)
            if blocked is not None and offset >= blocked[0]:
                return  # an earlier record of this partition failed: it, and all after it, go again
            if source in self._backoffs:
                del self._backoffs[source]
            self._backoff.reset()
            if self.ack_lag_ms is not None:
                self.ack_lag_ms.append(time.time() * 1000 - timestamp)
            self.stats.mirrored += 1
            self.stats.bytes += size
            lag = self.stats.lag.setdefault(source, PartitionLag())
            lag.mirrored += 1
            if self.cfg.exactly_once:
                self._txn_offsets[source] = offset + 1
            else:
                self._acked[source] = offset + 1  # stored in one call per loop turn (`_store_acked`)
            sync = self.emitter.acked(source, offset, msg.offset())
            if sync is not None:
                self._send_sync(sync)
        return report

    def _send_sync(self, sync: OffsetSync) -> None:
        self.sync_producer.produce(self.syncs_topic, key=sync.key(), value=sync.value(), partition=0)

    def _forward(self, msg: Any) -> None:
        tp = (msg.topic(), msg.partition())
        value, key = msg.value(), msg.key()
        ts_type, ts = msg.timestamp()
        size = len(value or b"") + len(key or b"")
        while True:
            try:
                self.producer.produce(
                    self.topic_map[tp[0]], value=value, key=key, partition=tp[1], headers=msg.headers(),
                    timestamp=ts if ts_type != 0 else 0,
                    on_delivery=self._delivered(tp, msg.offset(), ts, size))
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:
                # refused before sending (e.g. larger than the producer may send): same path as a refusal
                err = exc.args[0]
                if tp not in self._blocked or msg.offset() < self._blocked[tp][0]:
                    self._blocked[tp] = (msg.offset(), f"{err.name()}: {err.str()}")
                return

    def _renew_consumer(self) -> None:
        """A fatal consumer error (e.g. this static member fenced by the source's
        group coordinator after a failover mistook its rejoin for another
        member's) ends that consumer for good: a new one joins, and its
        partitions resume from the last committed positions."""
        err, self._consumer_failed = self._consumer_failed, None
        self._error(f"the consumer of {self.cfg.source} failed for good ({err.name()}: {err.str()}); starting a "
                    "new one (its partitions resume from the last committed positions)")
        if not self.cfg.exactly_once:
            try:
                # Deliver what was sent; what the old consumer had not committed is copied again (at least once).
                self.producer.flush(30)
            except (KafkaException, RuntimeError):
                pass
        old, self.consumer = self.consumer, self._client(Consumer, "consumer", False, self._consumer_config)
        self.stats.consumer_replacements += 1
        for tp in list(self._assigned):
            self._forget(tp)
        self._acked, self._stored = {}, {}
        self._subscribed = []
        # Its close() may wait for the coordinator; its callbacks are ignored (`_on_revoke`).
        threading.Thread(target=self._close_quietly, args=(old,), name="mirror-old-consumer", daemon=True).start()
        self.refresh_topics()

    @staticmethod
    def _close_quietly(client: Any) -> None:
        try:
            client.close()
        except (KafkaException, RuntimeError):
            pass

    def _retry_blocked(self) -> None:
        """Records the target refused: drain, say which and why, and set each
        such partition back to its refused record, paused for its backoff
        (the other partitions go on)."""
        self.producer.flush(30)
        blocked, self._blocked = self._blocked, {}
        now = time.monotonic()
        for tp, (offset, reason) in sorted(blocked.items()):
            backoff = self._backoffs.setdefault(tp, Backoff())
            delay = backoff.next()
            self._error(f"{self.topic_map.get(tp[0], tp[0])}[{tp[1]}] on {self.cfg.target} refused the record "
                        f"{tp[0]}[{tp[1]}]@{offset}: {reason}; retrying it (and all after it) in {delay:.0f} s")
            partition = TopicPartition(tp[0], tp[1], offset)
            try:
                self.consumer.pause([partition])
                self.consumer.seek(partition)
                self._paused[tp] = now + delay
            except KafkaException:
                pass  # the partition moved to another process in the meantime; it resumes from the commit

    def _resume_due(self) -> None:
        now = time.monotonic()
        for tp, at in sorted(self._paused.items()):
            if at <= now:
                del self._paused[tp]
                try:
                    self.consumer.resume([TopicPartition(tp[0], tp[1])])
                except KafkaException:
                    pass  # revoked meanwhile

    def _retry_batch(self) -> None:
        """Exactly once: the aborted batch's refusals, then one backoff for the flow."""
        for tp, (offset, reason) in sorted(self._blocked.items()):
            if tp == ("", -1):
                self._error(f"{reason}; the transaction is aborted and its records copied again in "
                            f"{self._backoff.delay:.0f} s")
                continue
            self._error(f"{self.topic_map.get(tp[0], tp[0])}[{tp[1]}] on {self.cfg.target} refused the record "
                        f"{tp[0]}[{tp[1]}]@{offset}: {reason}; the transaction is aborted and retried in "
                        f"{self._backoff.delay:.0f} s")
        self._blocked = {}
        self.stop.wait(self._backoff.next())

    def _store_acked(self) -> None:
        """Store the acknowledged source offsets with the consumer, for the next commit."""
        if not self._acked:
            return
        acked, self._acked = self._acked, {}
        self._stored.update(acked)
        offsets = [TopicPartition(t, p, o) for (t, p), o in acked.items() if (t, p) in self._assigned]
        if offsets:
            try:
                self.consumer.store_offsets(offsets=offsets)
            except KafkaException:
                pass  # a partition was revoked in between: its new owner resumes from the last commit

    def _commit(self) -> None:
        self._store_acked()
        for sync in self.emitter.pending():
            self._send_sync(sync)
        try:
            self.consumer.commit(asynchronous=False)
            self._done.update((tp, o) for tp, o in self._stored.items() if tp in self._assigned)
            self._stored = {}
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                self._error(f"cannot commit the source offsets on {self.cfg.source}: {exc.args[0].str()}")
        self.sync_producer.poll(0)

    def _copy_batch(self, messages: list[Any]) -> None:
        read_at = time.monotonic()
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal() or err.code() == KafkaError._FATAL:
                    self._consumer_failed = err  # the consumer is replaced after this batch (`_renew_consumer`)
                elif err.code() != KafkaError._PARTITION_EOF:
                    self._error(f"reading {self.cfg.source}: {err.str()}")
                continue
            tp = (msg.topic(), msg.partition())
            if tp in self._blocked:
                continue  # sought back to the refused record: this one comes again after it
            uncopied = self._uncopied.get(tp)
            if uncopied is None:
                uncopied = self._uncopied[tp] = collections.deque()
            ts = msg.timestamp()[1]
            if not uncopied or msg.offset() > uncopied[-1][0]:  # a rewound batch's records are there already
                uncopied.append((msg.offset(), ts))
            self._last_read[tp] = (read_at, ts)
            if tp[0] not in self.topic_map:
                # A topic refresh during a fault of either cluster did not confirm the target
                # topic: the record waits (the consumer is sought back to it), never skipped.
                self._blocked[tp] = (msg.offset(), "the target topic was not confirmed at the last topic refresh")
                continue
            self._forward(msg)
        self.producer.poll(0)
        self._store_acked()


    def _read_syncs(self) -> None:
        for msg in self.sync_reader.consume(1000, 0):
            if msg.error() is None and msg.key() and msg.value():
                try:
                    self.store.add(OffsetSync.decode(msg.key(), msg.value()))
                except struct.error:
                    pass  # not an offset sync (someone else's record): ignored, as MM2 does

    def emit_checkpoints(self) -> list:
        self._read_syncs()
        try:
            groups = self.src_admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result(ADMIN_TIMEOUT_S + 5)
        except KafkaException as exc:
            self._error(f"cannot list the consumer groups of {self.cfg.source}: {exc.args[0].str()}")
            return []
        own = {self.cfg.mirror_group, f"{self.cfg.mirror_group}-syncs-reader"}
        names = sorted(g.group_id for g in groups.valid if self.cfg.groups.matches(g.group_id) and g.group_id not in own)
        written = []
        for group in names:
            try:
                result = self.src_admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)], request_timeout=ADMIN_TIMEOUT_S)[group].result(
                        ADMIN_TIMEOUT_S + 5)
            except KafkaException as exc:
                self._error(f"cannot read the offsets of group {group} on {self.cfg.source}: {exc.args[0].str()}")
                continue
            committed = {(p.topic, p.partition): (p.offset, p.metadata or "") for p in result.topic_partitions
                         if (p.topic, p.partition) in self._assigned and p.error is None}
            for cp in self.tracker.checkpoints(group, committed, self.topic_map, self.store):
                self.aux_producer.produce(self.checkpoints_topic, key=cp.key(), value=cp.value(), partition=0)
                written.append(cp)
        self.aux_producer.flush(30)
        self.stats.checkpoints += len(written)
        return written

    def sync_group_offsets(self, checkpoints: list) -> None:
        self.stats.synced_groups += self.topics.sync_group_offsets(checkpoints)

    def _heartbeat(self) -> None:
        key = struct.pack(">h", len(self.cfg.source)) + self.cfg.source.encode() + struct.pack(
            ">h", len(self.cfg.target)) + self.cfg.target.encode()
        value = struct.pack(">hq", 0, int(time.time() * 1000))
        self.aux_producer.produce(HEARTBEATS_TOPIC, key=key, value=value, partition=0)
        self.aux_producer.poll(0)

    def _update_lag(self) -> None:
        """Records behind: the source's end minus the next offset whose copy is
        committed (not the consumer's position, which runs ahead of what the
        target holds). Seconds behind: the age of the oldest record not yet
        copied (its source timestamp; MM2's replication latency), 0 when none is."""
        now_ms = time.time() * 1000
        for tp in sorted(self._assigned):
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(*tp), timeout=2, cached=False)
                if tp not in self._done:
                    reader = self.positions if self.positions is not None else self.consumer
                    committed = reader.committed([TopicPartition(*tp)], timeout=2)[0].offset
                    self._done[tp] = committed if committed >= 0 else low
            except KafkaException:
                continue
            lag = self.stats.lag.setdefault(tp, PartitionLag())
            done = max(self._done[tp], low)
            lag.records = max(0, high - done)
            uncopied = self._uncopied.get(tp)
            while uncopied and uncopied[0][0] < done:
                uncopied.popleft()
            oldest = None
            if lag.records:
                last = self._last_read.get(tp)
                if uncopied:
                    oldest = uncopied[0][1]  # read, not committed as copied yet
                elif last is not None and time.monotonic() - last[0] < PROBE_AFTER_S:
                    # Not read yet, but the consumer is reading: the next record is
                    # no older than the last one it gave (a backlog being copied).
                    oldest = last[1]
                else:
                    oldest = self._probe_timestamp(tp, done)  # the consumer is not reading: ask the source
            lag.seconds = max(0.0, (now_ms - oldest) / 1000) if oldest and oldest > 0 else 0.0

    def _probe_timestamp(self, tp: tuple[str, int], offset: int) -> int | None:
        """The source timestamp of the first record at or after `offset` (kept
        until the copy passes it), None if the source does not give it within 1 s."""
        known = self._probed.get(tp)
        if known is not None and known[0] == offset:
            return known[1]
        if self._lag_probe is None:
            c = self.cfg
            self._lag_probe = self._client(Consumer, "consumer", False, {
                "bootstrap.servers": c.source_bootstrap, "group.id": f"{c.mirror_group}-lag",
                "enable.auto.commit": False, "isolation.level": "read_committed",
                "logger": _quiet("lag-probe"), "fetch.wait.max.ms": 100})
        try:
            self._lag_probe.assign([TopicPartition(tp[0], tp[1], offset)])
            msgs = self._lag_probe.consume(1, 1.0)
        except KafkaException:
            return None
        if not msgs or msgs[0].error() is not None:
            return None
        self._probed[tp] = (offset, msgs[0].timestamp()[1])
        return self._probed[tp][1]

    # --- the loop -----------------------------------------------------------

    def run(self) -> None:
        self._clients()
        if self.cfg.exactly_once:
            self._init_transactions()
        self.sync_reader.assign([TopicPartition(self.syncs_topic, 0, OFFSET_BEGINNING)])
        while not self.stop.is_set() and not self.refresh_topics():
            pass
        if self.stop.is_set():
            return self._close()
        self._ensure_internal()
        if self.cfg.exactly_once:
            self._check_aborts_hidden()
        self.stats.state = "mirroring"
        self.say(f"[{self.cfg.name}] mirroring {len(self.topic_map)} topics "
                 f"({'exactly once' if self.cfg.exactly_once else 'at least once'}): "
                 + ", ".join(f"{s} -> {t}" for s, t in sorted(self.topic_map.items())))
        now = time.monotonic()
        next_refresh = now + self.cfg.refresh_interval_s
        next_flush = now + self.cfg.flush_interval_s
        next_checkpoint = now + self.cfg.checkpoint_interval_s
        next_group_sync = now + self.cfg.sync_group_offsets_interval_s
        next_heartbeat = now
        next_lag = now
        unassigned_since = now
        while not self.stop.is_set():
            # A short wait: delivery reports (and so source commits) are served between two consumes.
            try:
                messages = self.consumer.consume(500, 0.02) if self._subscribed else []
            except KafkaException as exc:
                messages = []
                if exc.args[0].fatal() or exc.args[0].code() == KafkaError._FATAL:
                    self._consumer_failed = exc.args[0]
                else:
                    self._error(f"reading {self.cfg.source}: {exc.args[0].str()}")
            if not self._subscribed:
                self.stop.wait(0.1)
            if self.cfg.exactly_once and messages:
                self._copy_transaction(messages)
            else:
                self._copy_batch(messages)
            if self._blocked:
                self._retry_blocked()
            if self._consumer_failed is not None:
                self._renew_consumer()
            if self._paused:
                self._resume_due()
            now = time.monotonic()
            if now >= next_flush and not self.cfg.exactly_once:
                self._commit()
                next_flush = now + self.cfg.flush_interval_s
            if now >= next_heartbeat and self.cfg.emit_heartbeats:
                self._heartbeat()
                next_heartbeat = now + self.cfg.heartbeat_interval_s
            if now >= next_lag:
                self._reap_abandoned()
                self._update_lag()
                next_lag = now + 1.0
            if self._assigned or not self._subscribed:
                unassigned_since = now
            elif now - unassigned_since > UNASSIGNED_WARNING_S:
                # librdkafka keeps its group errors to itself; the user sees only that nothing moves.
                self._error(f"no partition of {self.cfg.source} assigned to this process after "
                            f"{UNASSIGNED_WARNING_S:.0f} s: either other mirror processes in group "
                            f"{self.cfg.mirror_group} hold them all, or {self.cfg.source}'s group coordinator "
                            "does not answer (is __consumer_offsets available there?)")
                unassigned_since = now
            if now >= next_checkpoint and self.cfg.emit_checkpoints:
                self.emit_checkpoints()
                if self.cfg.sync_group_offsets and now >= next_group_sync:
                    self.sync_group_offsets(self._latest_checkpoints())
                    next_group_sync = now + self.cfg.sync_group_offsets_interval_s
                next_checkpoint = now + self.cfg.checkpoint_interval_s
            if now >= next_refresh:
                self.refresh_topics()
                next_refresh = now + self.cfg.refresh_interval_s
        self._close()

    def _latest_checkpoints(self) -> list:
        return self.tracker.latest(self.topic_map)

    def _close(self) -> None:
        self.stats.state = "stopping"
        try:
            if not self.cfg.exactly_once:
                self.producer.flush(30)
                if self._subscribed:
                    self._commit()
            self.consumer.close()
        except (KafkaException, RuntimeError):
            pass
        self.sync_producer.flush(10)
        self.aux_producer.flush(10)
        self.sync_reader.close()
        if self.positions is not None:
            self.positions.close()
        if self._lag_probe is not None:
            self._lag_probe.close()
        self.stats.state = "stopped"
