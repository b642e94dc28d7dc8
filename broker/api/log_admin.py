"""DeleteRecords, DescribeLogDirs and AlterReplicaLogDirs: admin requests a
broker answers from the logs it hosts.

Theory of operation
-------------------
* DeleteRecords (KIP-107) is sent to each partition's leader. The leader
  moves its log start offset up to the given offset (-1: the high
  watermark), durably, and answers the new log start as the low
  watermark. Consumers can no longer read below it (a Fetch there is
  OFFSET_OUT_OF_RANGE, ListOffsets EARLIEST answers it); the segments
  wholly below it go at the next retention pass. Followers learn the new
  log start from each Fetch response and move theirs (at most to their
  own log end), and name the partition in their next Fetch with their new
  log start. As Kafka's DelayedDeleteRecords, the answer waits until the
  low watermark (the smallest log start offset of the leader and its
  in-sync followers) has reached the deletion, so that a leader elected
  right after the answer has the records deleted too; then it answers the
  low watermark. Not there within the request's timeout: REQUEST_TIMED_OUT
  (the leader's deletion stays, the followers still follow it); the
  leadership lost meanwhile: NOT_LEADER_OR_FOLLOWER.
* DescribeLogDirs lists every `log.dirs` directory with the partitions in
  it, their size on disk and offset lag (how far the replica's log end is
  behind the high watermark; 0 on a leader), and the disk's total and
  usable bytes. A log dir taken offline by a disk failure is listed with
  error KAFKA_STORAGE_ERROR and no partitions, as Kafka lists it.
* AlterReplicaLogDirs: a replica already in the named dir is answered
  NONE (a no-op, as in Kafka), a dir not in `log.dirs` LOG_DIR_NOT_FOUND.
  A replica in another of this broker's dirs is moved there through a
  future log, copied while the partition takes appends and swapped in once
  caught up (`broker.shell.log_dir_mover`): the answer is NONE once the
  move started, as Kafka answers. While it runs, DescribeLogDirs lists the
  future replica under the target dir with `is_future_key` true and its
  offset lag. A new replica's dir is the one with fewest partitions.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil

import trio
from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
from common.security.acl import Operation, ResourceType

_NO_THROTTLE = datetime.timedelta(0)
_HIGH_WATERMARK = -1
#: How often a waiting DeleteRecords looks at the followers' log starts
#: again (a follower's Fetch after the deletion reports its new one).
_LOW_WATERMARK_POLL_S = 0.02

_log = logging.getLogger("broker.log_admin")


def _delete_one(broker, topic: str, partition: int, offset: int) -> tuple[ErrorCode, int]:
    """Move the leader's log start; (error, the offset the low watermark must reach)."""
    hp = broker.replicas.partitions.get((topic, partition))
    if hp is None:
        known = broker.image.topic(topic)
        return (ErrorCode.not_leader_or_follower if known is not None and partition in known.partitions
                else ErrorCode.unknown_topic_or_partition), -1
    if not hp.state.is_leader:
        return ErrorCode.not_leader_or_follower, -1
    high_watermark = hp.state.high_watermark
    target = high_watermark if offset == _HIGH_WATERMARK else offset
    if target < 0 or target > high_watermark:
        # Kafka: only committed records can be deleted.
        return ErrorCode.offset_out_of_range, -1
    try:
        if hp.log.maybe_increment_log_start_offset(target):
            _log.info("%s-%d: log start offset moved to %d (DeleteRecords)", topic, partition, target)
            hp.notify()
    except OSError as exc:
        _log.error("%s-%d: DeleteRecords to %d failed: %s", topic, partition, target, exc)
        return ErrorCode.kafka_storage_error, -1
    # A request below the log start already moved (an earlier deletion) waits for that one.
    return ErrorCode.none, max(target, hp.log.log_start_offset)


def _low_watermark(broker, topic: str, partition: int, leader_epoch: int) -> int | None:
    """The partition's low watermark here, or None when this broker no
    longer leads it in `leader_epoch`."""
    hp = broker.replicas.partitions.get((topic, partition))
    if hp is None or not hp.state.is_leader or hp.state.leader_epoch != leader_epoch:
        return None
    return hp.state.leader.low_watermark(hp.log.log_start_offset)


async def handle_delete_records(broker, ctx, request):
    mod = response_module(request.header)
    # Kafka's rule: DELETE on each topic, refused per partition with TOPIC_AUTHORIZATION_FAILED.
    denied = broker.authorizer.denied_topics(ctx, (t.name for t in request.body.topics), Operation.DELETE)
    deadline = trio.current_time() + request.body.timeout.total_seconds()
    # (topic, partition) -> [error, low watermark]; waiting: -> (required offset, leader epoch).
    results: dict[tuple[str, int], list] = {}
    waiting: dict[tuple[str, int], tuple[int, int]] = {}
    for t in request.body.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if t.name in denied:
                results[key] = [ErrorCode.topic_authorization_failed, -1]
                continue
            error, required = _delete_one(broker, t.name, p.partition_index, p.offset)
            results[key] = [error, -1]
            if error == ErrorCode.none:
                waiting[key] = (required, broker.replicas.partitions[key].state.leader_epoch)
    while waiting:
        for key, (required, epoch) in list(waiting.items()):
            low = _low_watermark(broker, *key, epoch)
            if low is None:
                results[key] = [ErrorCode.not_leader_or_follower, -1]
                del waiting[key]
            elif low >= required:
                results[key] = [ErrorCode.none, low]
                del waiting[key]
        if not waiting:
            break
        if trio.current_time() >= deadline:
            for key, (_required, epoch) in waiting.items():
                low = _low_watermark(broker, *key, epoch)
                _log.info("%s-%d: DeleteRecords timed out waiting for the in-sync followers' log start "
                          "(low watermark %s)", *key, low)
                results[key] = [ErrorCode.request_timed_out, -1 if low is None else low]
            break
        await trio.sleep(_LOW_WATERMARK_POLL_S)
    topics = []
    for t in request.body.topics:
        parts = []
        for p in t.partitions:
            error, low = results[(t.name, p.partition_index)]
            parts.append(build(mod.DeleteRecordsPartitionResult, partition_index=p.partition_index,
                               low_watermark=low, error_code=error))
        topics.append(build(mod.DeleteRecordsTopicResult, name=t.name, partitions=tuple(parts)))
    return build(mod.DeleteRecordsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))


async def handle_describe_log_dirs(broker, ctx, request):
    mod = response_module(request.header)
    wanted = None
    if request.body.topics is not None:
        wanted = {(t.topic, p) for t in request.body.topics for p in t.partitions}
    by_dir: dict[str, dict[str, list]] = {d: {} for d in broker.log_manager.log_dirs}
    for (topic, partition), hp in sorted(broker.replicas.partitions.items()):
        if wanted is not None and (topic, partition) not in wanted:
            continue
        log = hp.log
        log_dir = os.path.dirname(os.path.abspath(log.dir_path))
        lag = 0 if hp.state.is_leader else max(0, hp.state.high_watermark - log.log_end_offset)
        by_dir.setdefault(log_dir, {}).setdefault(topic, []).append(build(
            mod.DescribeLogDirsPartition, partition_index=partition, partition_size=log.size_in_bytes,
            offset_lag=lag, is_future_key=False))
        future = broker.log_mover.future_of(topic, partition)
        if future is not None and future.log is not None:
            # Kafka's offset lag of a future replica: how far it is behind the current log's end.
            by_dir.setdefault(future.target_dir, {}).setdefault(topic, []).append(build(
                mod.DescribeLogDirsPartition, partition_index=partition, partition_size=future.log.size_in_bytes,
                offset_lag=max(0, log.log_end_offset - future.log.log_end_offset), is_future_key=True))
    results = []
    offline = broker.log_manager.offline_dirs
    for log_dir, topics in by_dir.items():
        if log_dir in offline:
            results.append(build(mod.DescribeLogDirsResult, error_code=ErrorCode.kafka_storage_error,
                                 log_dir=log_dir, topics=(), total_bytes=-1, usable_bytes=-1))
            continue
        try:
            usage = shutil.disk_usage(log_dir)
            total, usable, error = usage.total, usage.free, ErrorCode.none
        except OSError:
            total, usable, error = -1, -1, ErrorCode.kafka_storage_error
        results.append(build(mod.DescribeLogDirsResult, error_code=error, log_dir=log_dir, topics=tuple(
            build(mod.DescribeLogDirsTopic, name=name, partitions=tuple(parts)) for name, parts in topics.items()),
            total_bytes=total, usable_bytes=usable))
    return build(mod.DescribeLogDirsResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                 results=tuple(results))


async def handle_alter_replica_log_dirs(broker, ctx, request):
    mod = response_module(request.header)
    log_dirs = set(broker.log_manager.log_dirs)
    # Kafka's rule: moving replicas between dirs needs ALTER on the cluster, refused per partition.
    refused = broker.authorizer.enabled and not broker.authorizer.allowed(
        ctx, Operation.ALTER, ResourceType.CLUSTER, "kafka-cluster")
    topics: dict[str, list] = {}
    for d in request.body.dirs:
        path = os.path.abspath(d.path)
        for t in d.topics:
            for p in t.partitions:
                hp = broker.replicas.partitions.get((t.name, p))
                current = None if hp is None else os.path.dirname(os.path.abspath(hp.log.dir_path))
                if refused:
                    error = ErrorCode.cluster_authorization_failed
                elif path not in log_dirs:
                    error = ErrorCode.log_dir_not_found
                elif current == path:
                    # Already there: a no-op, as in Kafka (a move elsewhere under way is called off).
                    broker.log_mover.cancel(t.name, p)
                    error = ErrorCode.none
                elif hp is None:
                    error = ErrorCode.replica_not_available
                else:
                    broker.log_mover.move(t.name, p, path)
                    error = ErrorCode.none
                topics.setdefault(t.name, []).append(
                    build(mod.AlterReplicaLogDirPartitionResult, partition_index=p, error_code=error))
    return build(mod.AlterReplicaLogDirsResponse, throttle_time=_NO_THROTTLE, results=tuple(
        build(mod.AlterReplicaLogDirTopicResult, topic_name=name, partitions=tuple(parts))
        for name, parts in topics.items()))
