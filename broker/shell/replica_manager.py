"""The partitions this broker hosts: state, log, and who waits on them (I/O shell).

Theory of operation
-------------------
A `HostedPartition` pairs the pure partition state (the replication
core's `Partition`: role, epochs, ISR, HW) with its
`storage.Log` and with the requests parked on it. The `ReplicaManager`
keeps them, changes them when a metadata delta arrives (`apply_delta`:
become leader, become follower, stop), appends client batches to leaders
(`append_to_leader`) and acts on what the core decides (`act`): wake parked
requests, queue an AlterPartition for `broker.shell.replica_fetcher.IsrSender`,
move a follower's fetching to its new leader (`on_follow`, the
`ReplicaFetchers`). `timeline` (`broker.core.failover_timeline`) logs one line
per delta that changed leaderships: how long it took to apply, and when
its new leaders' followers fetched and committed the new epoch.

The partitions themselves and the requests parked on them are
`broker.shell.hosted_partition`; a storage error's log line and fix are
`broker.shell.storage_errors`.

A log directory that fails (EIO, unmounted, with several `log.dirs`) is
taken offline, its replicas stopped and its partitions answering
KAFKA_STORAGE_ERROR until a restart: the `ReplicaDirFailures` part of
the replica manager (`broker.shell.log_dir_failure`).
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping

import trio
from kio.schema.errors import ErrorCode

from broker.api.codec import ProducePartitionResult
from broker.core.failover_timeline import LeadershipTimeline
from broker.shell.hosted_partition import HostedPartition, LogTransactions
from broker.shell.log_dir_failure import ReplicaDirFailures
from broker.shell.log_manager import LogManager, TopicPartitionName, log_config_for
from broker.shell.storage_errors import storage_error_logger
from broker.core.replication import (
    AlterPartitionProposal,
    Partition,
    LeaderUpdate,
    ReplicaFetch,
    ReplicationConfig,
    Role,
    TopicIdPartition,
    eligible_brokers,
)
from broker.core.replication.messages import NO_UPDATE
from quorum.metadata import MetadataDelta, MetadataImage
from quorum.metadata.topic_configs import TOPIC_CONFIGS
from storage import record_validation
from storage.batch import CREATE_TIME, LOG_APPEND_TIME, LOG_OVERHEAD, set_max_timestamp, validate_batch
from storage.config import LogConfig
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
    UnsupportedCompressionError,
)
from storage.producer_state import ProducerStateError
from storage.record_validation import RecordPolicy, validate_client_batch

_BATCH_LENGTH = struct.Struct(">i")
_log = logging.getLogger("broker.replica_manager")


def _topic_config(image: MetadataImage, topic: str, key: str, defaults: Mapping[str, str] = {}) -> str:
    return image.topic_config(topic).get(key, defaults.get(key, TOPIC_CONFIGS[key].default))


class ReplicaManager(ReplicaDirFailures):
    def __init__(
        self,
        broker_id: int,
        log_manager: LogManager,
        clock_ms: Callable[[], int],
        log_defaults: Mapping[str, str],
        replication: ReplicationConfig | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.clock_ms = clock_ms
        self.log_defaults = dict(log_defaults)
        self.replication = replication or ReplicationConfig()
        self.partitions: dict[TopicPartitionName, HostedPartition] = {}
        #: The same partitions by topic id (the replication core's key).
        self.by_id: dict[TopicIdPartition, HostedPartition] = {}
        #: ISR changes to send to the controller, newest per partition.
        self.alter_partition_queue: dict[TopicIdPartition, AlterPartitionProposal] = {}
        self.alter_partition_pending = trio.Event()
        #: `(topic, partition, topic_id, leader_id, leader_epoch)` -> None:
        #: fetch the partition from `leader_id` (-1: from nowhere).
        self.on_follow: Callable[[str, int, object, int, int], None] = lambda *_: None
        #: When each delta's leadership changes took effect (one INFO line per delta).
        self.timeline = LeadershipTimeline()
        #: `eligible_brokers` of the newest delta: what every leader here holds.
        self._eligible: dict[int, int] | None = None
        #: Partitions hosted here whose log could not be opened or created (a
        #: resource limit such as EMFILE, a full or failing disk): key -> the
        #: newest delta entry for it. They answer KAFKA_STORAGE_ERROR;
        #: `retry_offline` tries them again. Every other partition serves on.
        self.offline: dict[TopicPartitionName, object] = {}
        # A failed log dir's state (`ReplicaDirFailures`).
        self.dir_offline = {}
        self.pending_dir_failures = {}
        self.dir_failed = trio.Event()
        self.on_dir_offline = lambda _dir: None
        self.log_dirs_can_go_offline = False
        #: ISR changes seen on partitions led here (metrics).
        self.isr_shrinks = 0
        self.isr_expands = 0
        #: Bytes and records in and out per topic (`broker.shell.metrics.TopicStats`),
        #: counted only when the node serves metrics (None: not counted).
        self.topic_stats: dict[str, list[int]] | None = None
        if record_validation.IMPLEMENTATION != "compiled":
            _log.warning("the records of produced batches are checked in pure Python: the "
                         "storage._record_scan extension is not built (`pip install -e .` builds it); "
                         "each record produced costs about 1.5 us more")

    # --- the core's decisions --------------------------------------------

    def act(self, hp: HostedPartition, update: LeaderUpdate) -> None:
        """Do what a `LeaderUpdate` asks: wake parked requests, queue the ISR change."""
        if update.alter_partition is not None:
            proposal = update.alter_partition
            self.alter_partition_queue[TopicIdPartition(proposal.topic_id, proposal.partition)] = proposal
            self.alter_partition_pending.set()
        if update.wake:
            hp.notify()

    def tick(self, now_ms: int, keys: Iterable[TopicIdPartition] | None = None) -> None:
        """Time passed: ISR shrink of lagging followers, AlterPartition
        retries; on every leader, or on the partitions `keys`."""
        hosted = self.partitions.values() if keys is None else (self.by_id.get(k) for k in keys)
        for hp in list(hosted):
            if hp is not None and hp.state.leader is not None:
                self.act(hp, hp.state.tick(now_ms))

    def by_topic_id(self, key: TopicIdPartition) -> HostedPartition | None:
        return self.by_id.get(key)

    def _drop(self, hp: HostedPartition) -> None:
        self.by_id.pop(TopicIdPartition(hp.state.topic_id, hp.state.partition), None)

    def serve_replica_fetch(self, hp: HostedPartition, replica_id: int, fp, now_ms: int):
        """One partition of a follower's Fetch on this leader: the core's
        decision, acted on. The caller has checked `fp`'s leader epoch and
        that `replica_id` may fetch here (`Partition.fetch_error` is none),
        so the leader's own check (`Partition.handle_replica_fetch`) is
        skipped: it is the same check, and this runs for every partition a
        follower names (thousands per fetch after a failover)."""
        fetch = ReplicaFetch(replica_id, fp.fetch_offset, getattr(fp, "last_fetched_epoch", -1),
                             getattr(fp, "current_leader_epoch", -1),
                             log_start_offset=getattr(fp, "log_start_offset", -1))
        decision = hp.state.leader.handle_replica_fetch(fetch, hp.log, now_ms)
        update = decision.update
        if update is not NO_UPDATE:
            self.act(hp, update)
        if self.timeline.watching:
            self.note_replica_fetch(hp, decision.high_watermark, now_ms)
        return decision

    def note_replica_fetch(self, hp: HostedPartition, high_watermark: int, now_ms: int) -> None:
        """For the failover timeline: a follower's fetch of `hp` was served at
        `high_watermark`. Callers call it only while `timeline.watching`: the
        check costs less than this call, per partition of every follower fetch."""
        # Keyed by the hosted partition itself: hashing a TopicIdPartition
        # hashes its UUID in Python, per partition of every follower fetch
        # while a failover's timeline is open.
        log_timeline(self.timeline.on_replica_fetch(hp, high_watermark, now_ms))

    # --- metadata ------------------------------------------------------

    def apply_delta(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Make the hosted replicas match `image` (KIP-631's delta publishing), at once."""
        for _ in self.delta_steps(image, delta):
            pass

    def delta_steps(self, image: MetadataImage, delta: MetadataDelta) -> Iterator[None]:
        """`apply_delta` one replica at a time: yields after each one it
        stopped, created or changed, so that a caller on an event loop can
        let heartbeats and the metadata fetch run between them. A delta of
        thousands of partitions (a topic created, a broker fenced) costs
        milliseconds each (opening logs, leader epoch checkpoints); done in
        one turn it held the loop past `broker.session.timeout.ms`, the
        broker was fenced, and the leadership churn fed the next big delta.
        The steps must all run, in order, before the next delta."""
        now_ms = self.clock_ms()
        for stopped in delta.stopped:
            self._stop_replica(stopped)
            yield
        eligible = eligible_brokers(image)
        settings: dict[str, tuple[int, RecordPolicy, LogConfig]] = {}
        touched = set()
        # Counted by `is`: an enum member's `value` and `__hash__` are Python code.
        new_followers = new_leaders = 0
        timeline = self.timeline
        log_timeline(timeline.begin_delta(image.offset, now_ms))
        # Followers first: a follow step is cheap (no file is written) and
        # starts the fetch an acks=all write on the new leader waits for; a
        # leader step writes its new epoch to the leader-epoch-checkpoint.
        # Kafka makes the leaders first; done that way, a delta of
        # thousands of leader changes held every follower switch until the
        # last leader step, and the first acks=all commit with it.
        for local in (*delta.followers, *delta.leaders):
            try:
                hp, role = self._apply_local(image, local, eligible, now_ms, settings)
            except OSError as exc:
                self._went_offline(local, exc)
                yield
                continue
            touched.add(hp)
            if role is not None:
                if role is Role.LEADER:
                    new_leaders += 1
                else:
                    new_followers += 1
                if hp.state.leader is not None:
                    timeline.on_leader(hp, hp.state.leader.epoch_start_offset)
                elif hp.state.leader_id >= 0:
                    timeline.on_follower(hp)
            yield
        applied_ms = self.clock_ms()
        if new_followers or new_leaders:
            became = (("follower", new_followers), ("leader", new_leaders))
            _log.info("metadata offset %d: %s (in %d ms)", image.offset,
                      ", ".join(f"became {role} of {n} partition(s)" for role, n in became if n),
                      applied_ms - now_ms)
        log_timeline(timeline.end_delta(applied_ms))
        # Brokers fenced, unfenced or shutting down change who may join an
        # ISR (KIP-841). Only then: the leaders this delta did not touch
        # already hold the same, and walking every hosted partition after
        # each of a fence's 500-partition deltas cost a broker hosting
        # 10,000 of them about 6 us per partition moved.
        if eligible != self._eligible:
            for hp in self.partitions.values():
                if hp not in touched and hp.state.leader is not None:
                    hp.state.update_eligibility(eligible)
            self._eligible = eligible

    def _went_offline(self, local, exc: OSError) -> None:
        key = (local.topic_name, local.partition)
        log_dir = self.log_manager.failed_dir(*key, exc) if self.log_dirs_can_go_offline else None
        if log_dir is not None:
            self.dir_offline[key] = log_dir
            self.disk_error(key[0], key[1], exc)
            return
        if key not in self.offline:
            storage_error_logger.report(f"{local.topic_name}-{local.partition}", "cannot open its log", exc)
        self.offline[key] = local
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            # Out of descriptors: hold fewer segment files open from now on,
            # so that the partitions after this one (and the retry) find one.
            self.log_manager.open_files.shrink(exc)

    def retry_offline(self, image: MetadataImage) -> int:
        """Try again to open the logs of the offline partitions (the
        resource may be back: files closed, space freed); how many came back."""
        if not self.offline:
            return 0
        now_ms = self.clock_ms()
        eligible = eligible_brokers(image)
        settings: dict[str, tuple[int, RecordPolicy, LogConfig]] = {}
        back = 0
        for key, local in list(self.offline.items()):
            try:
                self._apply_local(image, local, eligible, now_ms, settings)
            except OSError:
                break  # still failing: the next pass tries again
            del self.offline[key]
            back += 1
        if back:
            _log.info("%d offline partition(s) opened their logs; %d still offline", back, len(self.offline))
        return back

    def storage_error(self, topic: str, partition: int) -> bool:
        """Whether the partition is hosted here but its log is offline."""
        return (topic, partition) in self.offline or (topic, partition) in self.dir_offline

    def _stop_replica(self, stopped) -> None:
        self.offline.pop((stopped.topic_name, stopped.partition), None)
        self.dir_offline.pop((stopped.topic_name, stopped.partition), None)
        hp = self.partitions.pop((stopped.topic_name, stopped.partition), None)
        if hp is not None:
            if hp.state.topic_id != stopped.topic_id:
                # A newer topic of the same name already took the slot.
                self.partitions[(stopped.topic_name, stopped.partition)] = hp
                return
            self.on_follow(stopped.topic_name, stopped.partition, hp.state.topic_id, -1, -1)
            self._drop(hp)
            hp.state.stop()
            hp.notify()
        if stopped.delete:
            self.log_manager.delete(stopped.topic_name, stopped.partition)
        _log.info("stopped replica %s-%d (delete=%s)", stopped.topic_name, stopped.partition, stopped.delete)

    def _apply_local(self, image: MetadataImage, local, eligible, now_ms: int,
                     settings: dict[str, tuple[int, RecordPolicy, LogConfig]]) -> tuple[HostedPartition, Role | None]:
        """Create or update one hosted replica; the replica, and its new role
        if its role or leader epoch changed (logged one line per partition
        at DEBUG: a delta of 10,000 partitions is summed up in one INFO line)."""
        key = (local.topic_name, local.partition)
        hp = self.partitions.get(key)
        # `is` first: the ids come from one decoded object per topic, and
        # UUID's `__eq__` is Python code.
        if hp is not None and hp.state.topic_id is not local.topic_id and hp.state.topic_id != local.topic_id:
            # The topic was deleted and re-created in one delta.
            self.on_follow(local.topic_name, local.partition, hp.state.topic_id, -1, -1)
            self._drop(hp)
            hp.state.stop()
            self.partitions.pop(key)
            self.log_manager.delete(*key)
            hp.notify()
            hp = None
        if hp is None:
            config = log_config_for(image.topic_config(local.topic_name), self.log_defaults)
            log = self.log_manager.get_or_create(local.topic_name, local.partition, local.topic_id, config)
            state = Partition(local.topic_name, local.partition, local.topic_id, self.broker_id,
                              self.replication)
            hp = self.partitions[key] = HostedPartition(state, log, self)
            # The LSO reads the open transactions from the producer state.
            state.transactions = LogTransactions(log) if log.producer_state is not None else None
            self.by_id[TopicIdPartition(local.topic_id, local.partition)] = hp
            checkpointed_hw = self.log_manager.checkpointed_high_watermark(*key)
        else:
            checkpointed_hw = None
        self._apply_topic_configs(image, hp, settings)
        was = (hp.state.role, hp.state.leader_epoch)
        isr_was = hp.state.isr
        change = hp.state.apply_registration(local.registration, hp.log, now_ms, eligible=eligible,
                                             checkpointed_high_watermark=checkpointed_hw)
        if change.epoch_start is not None:
            # A new leader starts its epoch at its LEO (KIP-101), so
            # OffsetForLeaderEpoch for the previous epoch ends there.
            hp.log.epoch_cache.assign(*change.epoch_start)
        if change.follow is not None:
            self.on_follow(local.topic_name, local.partition, local.topic_id, *change.follow)
        self.act(hp, change.update)
        if isr_was and hp.state.isr != isr_was and hp.state.leader_id == self.broker_id:
            # Kafka's IsrShrinksPerSec/IsrExpandsPerSec, counted where the
            # partition is led, whoever decided the change (this leader's
            # AlterPartition, or the controller fencing a follower).
            if len(hp.state.isr) < len(isr_was):
                self.isr_shrinks += 1
            elif len(hp.state.isr) > len(isr_was):
                self.isr_expands += 1
        role = None
        if was != (hp.state.role, hp.state.leader_epoch):
            role = hp.state.role
            if _log.isEnabledFor(logging.DEBUG):
                _log.debug("%s-%d: %s at leader epoch %d (leader %d, ISR %s, LEO %d, HW %d)",
                           local.topic_name, local.partition, role.value, hp.state.leader_epoch,
                           hp.state.leader_id, list(hp.state.isr), hp.log.log_end_offset,
                           hp.state.high_watermark)
        hp.notify()
        return hp, role

    def refresh_topic_configs(self, image: MetadataImage) -> None:
        """Adopt changed topic configs (`min.insync.replicas`, the record
        rules: `message.timestamp.*`, `cleanup.policy`, `max.message.bytes`;
        the log's: retention, rolls, flushing) on every hosted partition."""
        settings: dict[str, tuple[int, RecordPolicy, LogConfig]] = {}
        for hp in self.partitions.values():
            self._apply_topic_configs(image, hp, settings)

    def _apply_topic_configs(self, image: MetadataImage, hp: HostedPartition,
                             settings: dict[str, tuple[int, RecordPolicy, LogConfig]]) -> None:
        """`settings`: (min.insync.replicas, record policy, log config) by topic, filled
        as topics are met (a delta of 10,000 partitions has a few topics)."""
        topic = hp.state.topic
        setting = settings.get(topic)
        if setting is None:
            topic_configs = image.topic_config(topic)
            setting = settings[topic] = (int(_topic_config(image, topic, "min.insync.replicas", self.log_defaults)),
                                         record_policy_for({**self.log_defaults, **topic_configs}),
                                         log_config_for(topic_configs, self.log_defaults))
        min_isr, hp.record_policy, log_config = setting
        if log_config != hp.log.config:
            # max.message.bytes, retention, rolls, flushing: from the next
            # append or pass (Kafka's `UnifiedLog.updateConfig`); segments
            # already written keep their index size.
            hp.log.reconfigure(log_config)
        if min_isr != hp.state.min_insync_replicas:
            hp.state.set_min_insync_replicas(min_isr)
            hp.notify()

    # --- produce -------------------------------------------------------

    def append_to_leader(
        self, image: MetadataImage, topic: str, partition: int, records, acks: int, now_ms: int
    ) -> tuple[ProducePartitionResult, HostedPartition | None, int]:
        """Append one partition's batch of a Produce request.

        Returns the result, the partition (None on error) and the offset
        the HW must pass for acks=all (the new log end offset)."""
        hp = self.partitions.get((topic, partition))
        if hp is None:
            if self.storage_error(topic, partition):
                return (ProducePartitionResult(partition, ErrorCode.kafka_storage_error,
                                               error_message="the partition's log is offline on this broker"),
                        None, -1)
            topic_image = image.topic(topic)
            known = topic_image is not None and partition in topic_image.partitions
            error = ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition
            return ProducePartitionResult(partition, error), None, -1
        error = hp.state.produce_error(acks)
        if error is not ErrorCode.none:
            return ProducePartitionResult(partition, error), None, -1
        error, message = _check_one_batch(records)
        if error is not ErrorCode.none:
            return ProducePartitionResult(partition, error, error_message=message), None, -1
        log = hp.log
        append_time = -1
        policy = hp.record_policy
        try:
            # Every record, before anything is appended (Kafka's LogValidator):
            # a batch whose records do not parse would poison the partition.
            max_timestamp = validate_client_batch(records, now_ms, policy)
            if policy.log_append_time or max_timestamp is not None:
                # Validate before stamping: the stamp rewrites the CRC, which
                # must not bless a corrupt batch. One copy, on these topics
                # (and for a CreateTime header whose max timestamp is not its
                # records', which Kafka rewrites too) only.
                validate_batch(records, 0, log.config.max_message_bytes, from_client=True)
                records = bytearray(records)
                if policy.log_append_time:
                    set_max_timestamp(records, LOG_APPEND_TIME, now_ms)
                    append_time = now_ms
                else:
                    set_max_timestamp(records, CREATE_TIME, max_timestamp)
            base_offset = log.append(records, now_ms, leader_epoch=hp.state.leader_epoch)
        except InvalidTimestampError as exc:
            return (ProducePartitionResult(partition, ErrorCode.invalid_timestamp, error_message=str(exc),
                                           record_errors=exc.record_errors), None, -1)
        except InvalidRecordError as exc:
            return (ProducePartitionResult(partition, ErrorCode.invalid_record, error_message=str(exc),
                                           record_errors=exc.record_errors), None, -1)
        except CorruptRecordError as exc:
            return ProducePartitionResult(partition, ErrorCode.corrupt_message, error_message=str(exc)), None, -1
        except RecordTooLargeError as exc:
            return ProducePartitionResult(partition, ErrorCode.message_too_large, error_message=str(exc)), None, -1
        except UnsupportedCompressionError as exc:
            return (ProducePartitionResult(partition, ErrorCode.unsupported_compression_type,
                                           error_message=str(exc)), None, -1)
        except ProducerStateError as exc:
            # OUT_OF_ORDER_SEQUENCE_NUMBER or INVALID_PRODUCER_EPOCH (KIP-98);
            # a duplicate is no error: `append` returned its first offset.
            return (ProducePartitionResult(partition, ErrorCode(exc.error_code), error_message=str(exc)),
                    None, -1)
        except OSError as exc:
            if not self.disk_error(topic, partition, exc):
                storage_error_logger.report(f"{topic}-{partition}", "append failed", exc)
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.log_manager.open_files.shrink(exc)
            return ProducePartitionResult(partition, ErrorCode.kafka_storage_error, error_message=str(exc)), None, -1
        self._appended_as_leader(hp, now_ms)
        topic_stats = self.topic_stats
        if topic_stats is not None:
            stats = topic_stats[topic]
            stats[0] += len(records)
            stats[1] += log.log_end_offset - base_offset
        result = ProducePartitionResult(partition, ErrorCode.none, base_offset, append_time, log.log_start_offset)
        return result, hp, log.log_end_offset

    def _appended_as_leader(self, hp: HostedPartition, now_ms: int) -> None:
        """After a leader append: the core's decision acted on, and every
        request parked on the partition woken (`act` wakes them itself when
        the decision says so)."""
        update = hp.state.on_leader_append(hp.log.log_end_offset, now_ms)
        self.act(hp, update)
        if not update.wake:
            hp.notify()

    # --- transaction markers --------------------------------------------

    def mark_txn_verified(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> bool:
        """KIP-890's partition-side verification, the hook: the transaction
        coordinator says `producer_id` at `producer_epoch` has an ongoing
        transaction that includes this partition. With the partition's
        `producer_state.require_verification` on, only such a producer may
        open a transaction here (`storage.producer_state`); a marker ends
        the verification. False if this broker does not lead the partition."""
        hp = self.partitions.get((topic, partition))
        if hp is None or not hp.state.is_leader or hp.log.producer_state is None:
            return False
        hp.log.producer_state.mark_verified(producer_id, producer_epoch)
        return True

    def append_coordinator_batch(self, hp: HostedPartition, batch, now_ms: int) -> tuple[ErrorCode, int]:
        """Append a batch a coordinator of this broker wrote (a
        transactional offset commit) as leader: (error, the log end
        offset after it). No sequence check (`Log.append_from_coordinator`)."""
        error = hp.state.produce_error(-1)
        if error is not ErrorCode.none:
            return error, -1
        log = hp.log
        try:
            log.append_from_coordinator(batch, now_ms, hp.state.leader_epoch)
        except ProducerStateError as exc:
            return ErrorCode(exc.error_code), -1
        except (CorruptRecordError, InvalidRecordError, RecordTooLargeError) as exc:
            _log.error("%s-%d: coordinator batch refused: %s", hp.state.topic, hp.state.partition, exc)
            return ErrorCode.invalid_record, -1
        except OSError as exc:
            _log.error("%s-%d: append failed: %s", hp.state.topic, hp.state.partition, exc)
            self.disk_error(hp.state.topic, hp.state.partition, exc)
            return ErrorCode.kafka_storage_error, -1
        self._appended_as_leader(hp, now_ms)
        return ErrorCode.none, log.log_end_offset

    def append_marker(self, hp: HostedPartition, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                      commit: bool, now_ms: int) -> tuple[ErrorCode, int]:
        """Write a COMMIT/ABORT marker as leader (WriteTxnMarkers):
        (error, the offset the HW must pass for it to be replicated)."""
        error = hp.state.produce_error(1)
        if error is not ErrorCode.none:
            return error, -1
        log = hp.log
        try:
            log.append_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms,
                              hp.state.leader_epoch)
        except ProducerStateError as exc:
            _log.info("%s-%d: marker refused: %s", hp.state.topic, hp.state.partition, exc)
            return ErrorCode(exc.error_code), -1
        except OSError as exc:
            _log.error("%s-%d: marker append failed: %s", hp.state.topic, hp.state.partition, exc)
            self.disk_error(hp.state.topic, hp.state.partition, exc)
            return ErrorCode.kafka_storage_error, -1
        self._appended_as_leader(hp, now_ms)
        return ErrorCode.none, log.log_end_offset

    # --- background ----------------------------------------------------

    def high_watermarks(self) -> dict[TopicPartitionName, int]:
        return {tp: hp.state.high_watermark for tp, hp in self.partitions.items()}


def log_timeline(lines: list[str]) -> None:
    for line in lines:
        _log.info("%s", line)


def record_policy_for(configs: Mapping[str, str]) -> RecordPolicy:
    """A topic's record rules from its configs over the broker's defaults."""
    def get(key: str) -> str:
        return configs.get(key, TOPIC_CONFIGS[key].default)

    return RecordPolicy(
        max_message_bytes=int(get("max.message.bytes")),
        log_append_time=get("message.timestamp.type") == "LogAppendTime",
        compacted="compact" in {p.strip() for p in get("cleanup.policy").split(",")},
        timestamp_before_max_ms=int(get("message.timestamp.before.max.ms")),
        timestamp_after_max_ms=int(get("message.timestamp.after.max.ms")),
    )


def _check_one_batch(records) -> tuple[ErrorCode, str | None]:
    """Produce v3+ carries exactly one v2 batch per partition (Kafka's
    `ProduceRequest.validateRecords`); the batch and its records are
    validated by `validate_client_batch`, then `Log.append` (magic, size
    against max.message.bytes, CRC32C)."""
    if records is None or len(records) == 0:
        return ErrorCode.invalid_record, "a produce request must carry one record batch per partition"
    if len(records) < LOG_OVERHEAD:
        return ErrorCode.corrupt_message, f"{len(records)} bytes are too few for a record batch"
    (batch_length,) = _BATCH_LENGTH.unpack_from(records, 8)
    size = LOG_OVERHEAD + batch_length
    if size < len(records) and batch_length > 0:
        return ErrorCode.invalid_record, "produce requests v3+ may carry exactly one record batch per partition"
    return ErrorCode.none, None
