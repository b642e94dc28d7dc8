"""The partitions this broker hosts: state, log, and who waits on them (I/O shell).

Theory of operation
-------------------
A `HostedPartition` pairs the pure `PartitionState` (role, epochs, ISR,
HW) with its `storage.Log` and with the requests parked on it. The
`ReplicaManager` keeps them, changes them when a metadata delta arrives
(`apply_delta`) and appends client batches to leaders (`append_to_leader`).

Parked requests ("purgatory", Kafka's DelayedProduce and DelayedFetch):
a long-polling Fetch and an acks=all Produce wait for *something to change*
on the partitions they touch, then re-check their own condition (enough
bytes below the HW; the HW past their last offset). Every change a parked
request could be waiting for -- an append (LEO), a HW move (an append
today, a follower's fetch once replication lands), a leadership change or
the replica stopping -- calls `HostedPartition.notify`, which sets every
parked request's `trio.Event`. A waiter registers one event with each
partition it touches (`wait_for_change`), so a Fetch over many partitions
wakes on the first of them. Deadlines are trio cancel scopes; a produce
that times out answers REQUEST_TIMED_OUT.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping

import trio
from kio.schema.errors import ErrorCode

from broker.codec import ProducePartitionResult
from broker.log_manager import LogManager, TopicPartitionName, log_config_for
from broker.partition import PartitionState
from quorum.metadata import MetadataDelta, MetadataImage
from quorum.metadata.topic_configs import TOPIC_CONFIGS
from storage.batch import LOG_APPEND_TIME, LOG_OVERHEAD, set_max_timestamp, validate_batch
from storage.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedCompressionError,
)
from storage.log import Log
from storage.producer_state import ProducerStateError

_BATCH_LENGTH = struct.Struct(">i")
_log = logging.getLogger("broker.replica_manager")


class HostedPartition:
    __slots__ = ("state", "log", "waiters", "log_append_time")

    def __init__(self, state: PartitionState, log: Log) -> None:
        self.state = state
        self.log = log
        self.waiters: set[trio.Event] = set()
        #: `message.timestamp.type=LogAppendTime`: the broker stamps batches (KIP-32).
        self.log_append_time = False

    def notify(self) -> None:
        """Wake every request parked on this partition."""
        if self.waiters:
            for event in self.waiters:
                event.set()
            self.waiters.clear()


async def wait_for_change(partitions: Iterable[HostedPartition], deadline: float) -> None:
    """Return when any of `partitions` changes, or at `deadline` (trio time)."""
    event = trio.Event()
    hosted = list(partitions)
    for hp in hosted:
        hp.waiters.add(event)
    try:
        with trio.move_on_at(deadline):
            await event.wait()
    finally:
        for hp in hosted:
            hp.waiters.discard(event)


def _topic_config(image: MetadataImage, topic: str, key: str) -> str:
    return image.topic_config(topic).get(key, TOPIC_CONFIGS[key].default)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: LogManager,
        clock_ms: Callable[[], int],
        log_defaults: Mapping[str, str],
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.clock_ms = clock_ms
        self.log_defaults = dict(log_defaults)
        self.partitions: dict[TopicPartitionName, HostedPartition] = {}

    # --- metadata ------------------------------------------------------

    def apply_delta(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """Make the hosted replicas match `image` (KIP-631's delta publishing)."""
        for stopped in delta.stopped:
            hp = self.partitions.pop((stopped.topic_name, stopped.partition), None)
            if hp is not None:
                if hp.state.topic_id != stopped.topic_id:
                    # A newer topic of the same name already took the slot.
                    self.partitions[(stopped.topic_name, stopped.partition)] = hp
                    continue
                hp.state.stop()
                hp.notify()
            if stopped.delete:
                self.log_manager.delete(stopped.topic_name, stopped.partition)
            _log.info("stopped replica %s-%d (delete=%s)", stopped.topic_name, stopped.partition, stopped.delete)
        for local in (*delta.leaders, *delta.followers):
            key = (local.topic_name, local.partition)
            hp = self.partitions.get(key)
            if hp is not None and hp.state.topic_id != local.topic_id:
                # The topic was deleted and re-created in one delta.
                self.partitions.pop(key)
                self.log_manager.delete(*key)
                hp.notify()
                hp = None
            if hp is None:
                config = log_config_for(image.topic_config(local.topic_name), self.log_defaults)
                log = self.log_manager.get_or_create(local.topic_name, local.partition, local.topic_id, config)
                state = PartitionState(local.topic_name, local.partition, local.topic_id, self.broker_id,
                                       log_start_offset=log.log_start_offset)
                hp = self.partitions[key] = HostedPartition(state, log)
                checkpointed_hw = self.log_manager.checkpointed_high_watermark(*key)
            else:
                checkpointed_hw = None
            self._apply_topic_configs(image, hp)
            was = (hp.state.role, hp.state.leader_epoch)
            hp.state.apply_registration(local.registration, hp.log.log_end_offset, checkpointed_hw)
            if hp.state.is_leader and hp.log.latest_epoch < hp.state.leader_epoch:
                # A new leader starts its epoch at its LEO (KIP-101), so
                # OffsetForLeaderEpoch for the previous epoch ends there.
                hp.log.epoch_cache.assign(hp.state.leader_epoch, hp.log.log_end_offset)
            if was != (hp.state.role, hp.state.leader_epoch):
                _log.info("%s-%d: %s at leader epoch %d (leader %d, ISR %s, LEO %d, HW %d)",
                          local.topic_name, local.partition, hp.state.role.value, hp.state.leader_epoch,
                          hp.state.leader_id, list(hp.state.isr), hp.log.log_end_offset, hp.state.high_watermark)
            hp.notify()

    def refresh_topic_configs(self, image: MetadataImage) -> None:
        """Adopt changed topic configs (`min.insync.replicas`,
        `message.timestamp.type`) on every hosted partition."""
        for hp in self.partitions.values():
            self._apply_topic_configs(image, hp)

    @staticmethod
    def _apply_topic_configs(image: MetadataImage, hp: HostedPartition) -> None:
        topic = hp.state.topic
        hp.state.min_insync_replicas = int(_topic_config(image, topic, "min.insync.replicas"))
        hp.log_append_time = _topic_config(image, topic, "message.timestamp.type") == "LogAppendTime"

    # --- produce -------------------------------------------------------

    def append_to_leader(
        self, image: MetadataImage, topic: str, partition: int, records, acks: int, now_ms: int
    ) -> tuple[ProducePartitionResult, HostedPartition | None, int]:
        """Append one partition's batch of a Produce request.

        Returns the result, the partition (None on error) and the offset
        the HW must pass for acks=all (the new log end offset)."""
        hp = self.partitions.get((topic, partition))
        if hp is None:
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
        try:
            if hp.log_append_time:
                # Validate before stamping: the stamp rewrites the CRC, which
                # must not bless a corrupt batch. One copy, on these topics only.
                validate_batch(records, 0, log.config.max_message_bytes, from_client=True)
                records = bytearray(records)
                set_max_timestamp(records, LOG_APPEND_TIME, now_ms)
                append_time = now_ms
            base_offset = log.append(records, now_ms, leader_epoch=hp.state.leader_epoch)
        except InvalidRecordError as exc:
            return ProducePartitionResult(partition, ErrorCode.invalid_record, error_message=str(exc)), None, -1
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
            _log.error("%s-%d: append failed: %s", topic, partition, exc)
            return ProducePartitionResult(partition, ErrorCode.kafka_storage_error, error_message=str(exc)), None, -1
        hp.state.on_leader_append(log.log_end_offset)
        hp.notify()
        result = ProducePartitionResult(partition, ErrorCode.none, base_offset, append_time, log.log_start_offset)
        return result, hp, log.log_end_offset

    # --- background ----------------------------------------------------

    def high_watermarks(self) -> dict[TopicPartitionName, int]:
        return {tp: hp.state.high_watermark for tp, hp in self.partitions.items()}

    def enforce_retention(self, now_ms: int) -> None:
        if self.log_manager.enforce_retention(now_ms):
            for hp in self.partitions.values():
                hp.state.on_log_start_offset(hp.log.log_start_offset)


def _check_one_batch(records) -> tuple[ErrorCode, str | None]:
    """Produce v3+ carries exactly one v2 batch per partition (Kafka's
    `ProduceRequest.validateRecords`); the batch itself is validated by
    `Log.append` (magic, size against max.message.bytes, CRC32C)."""
    if records is None or len(records) == 0:
        return ErrorCode.invalid_record, "a produce request must carry one record batch per partition"
    if len(records) < LOG_OVERHEAD:
        return ErrorCode.corrupt_message, f"{len(records)} bytes are too few for a record batch"
    (batch_length,) = _BATCH_LENGTH.unpack_from(records, 8)
    size = LOG_OVERHEAD + batch_length
    if size < len(records) and batch_length > 0:
        return ErrorCode.invalid_record, "produce requests v3+ may carry exactly one record batch per partition"
    return ErrorCode.none, None
