"""ListOffsets (offsets by time) and OffsetForLeaderEpoch (KIP-101/320).

ListOffsets answers, per partition, one of:

- `-2` EARLIEST: the log start offset, with the leader epoch of that offset;
- `-1` LATEST: the HW (read_uncommitted) or LSO (read_committed), the LEO
  for a follower; with the current leader epoch (Kafka does the same);
- `-3` MAX_TIMESTAMP (v7+, KIP-734): the record with the largest timestamp,
  found from the segment that holds it (its index remembers the offset)
  and one batch decoded;
- `-4` EARLIEST_LOCAL (v8+, KIP-405): the first offset in local storage;
  raftka has no remote (tiered) storage, so it is the log start offset;
- `-5` LATEST_TIERED (v9+, KIP-1005): the last offset copied to remote
  storage; with none, offset -1 and epoch -1, as Kafka answers for a topic
  without remote storage;
- a timestamp: the first record at or after it (`Log.offset_for_timestamp`,
  record granularity), if below the HW; else offset -1, timestamp -1.
"""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
from broker.core.replication import NO_EPOCH
from broker.shell.hosted_partition import HostedPartition
from storage.batch import iter_records
from storage.errors import StorageError
from common.security.acl import Operation

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
#: The first ListOffsets version that may ask for each special timestamp.
_EARLIEST_LOCAL_VERSION = 8
_LATEST_TIERED_VERSION = 9
LIST_OFFSETS_MIN_VERSION, LIST_OFFSETS_MAX_VERSION = 1, 9
READ_COMMITTED = 1
_NO_THROTTLE = datetime.timedelta(0)


async def handle_list_offsets(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    replica_id = body.replica_id
    version = request.header.api_version
    # DESCRIBE on each topic (Kafka's rule for ListOffsets).
    denied = broker.authorizer.denied_topics(ctx, (t.name for t in body.topics), Operation.DESCRIBE)
    topics = []
    for topic in body.topics:
        partitions = []
        seen: set[int] = set()
        for p in topic.partitions:
            if topic.name in denied:
                error, timestamp, offset, epoch = ErrorCode.topic_authorization_failed, -1, -1, NO_EPOCH
            elif p.partition_index in seen:
                # Kafka refuses a partition listed twice in one request.
                error, timestamp, offset, epoch = ErrorCode.invalid_request, -1, -1, NO_EPOCH
            else:
                seen.add(p.partition_index)
                try:
                    error, timestamp, offset, epoch = _list_offset(
                        broker, topic.name, p, replica_id, read_committed, version)
                except (StorageError, OSError) as exc:
                    # A timestamp lookup decodes stored records: a batch that
                    # does not parse fails this partition, not the request.
                    hp = broker.replicas.partitions[(topic.name, p.partition_index)]
                    error, timestamp, offset, epoch = hp.read_error(exc), -1, -1, NO_EPOCH
            partitions.append(build(mod.ListOffsetsPartitionResponse, partition_index=p.partition_index,
                                    error_code=error, timestamp=timestamp, offset=offset,
                                    leader_epoch=epoch, old_style_offsets=()))
        topics.append(mod.ListOffsetsTopicResponse(name=topic.name, partitions=tuple(partitions)))
    return build(mod.ListOffsetsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))


def _list_offset(broker, topic: str, p, replica_id: int, read_committed: bool, version: int):
    hp = broker.replicas.partitions.get((topic, p.partition_index))
    if hp is None:
        return _missing(broker, topic, p.partition_index), -1, -1, NO_EPOCH
    state = hp.state
    # replica_id -2 is Kafka's "debug" consumer, which may read any replica.
    error = state.fetch_error(getattr(p, "current_leader_epoch", NO_EPOCH), -1)
    if error is not ErrorCode.none and not (replica_id == -2 and error is ErrorCode.not_leader_or_follower):
        return error, -1, -1, NO_EPOCH
    log = hp.log
    bound = log.log_end_offset if replica_id >= 0 else state.fetch_upper_bound(read_committed)
    timestamp = p.timestamp
    if timestamp == EARLIEST_TIMESTAMP or (timestamp == EARLIEST_LOCAL_TIMESTAMP
                                           and version >= _EARLIEST_LOCAL_VERSION):
        start = log.log_start_offset
        return ErrorCode.none, -1, start, _epoch_at(hp, start)
    if timestamp == LATEST_TIMESTAMP:
        return ErrorCode.none, -1, bound, state.leader_epoch
    if timestamp == LATEST_TIERED_TIMESTAMP and version >= _LATEST_TIERED_VERSION:
        return ErrorCode.none, -1, -1, NO_EPOCH
    if timestamp == MAX_TIMESTAMP:
        found = _max_timestamp(hp, bound)
    elif timestamp < 0:
        return ErrorCode.invalid_request, -1, -1, NO_EPOCH
    else:
        found = log.offset_for_timestamp(timestamp)
    if found is None or found[0] >= bound:
        return ErrorCode.none, -1, -1, NO_EPOCH
    offset, found_timestamp = found
    return ErrorCode.none, found_timestamp, offset, _epoch_at(hp, offset)


def _missing(broker, topic: str, partition: int) -> ErrorCode:
    if broker.replicas.storage_error(topic, partition):
        return ErrorCode.kafka_storage_error  # its log could not be opened here
    topic_image = broker.image.topic(topic)
    if topic_image is not None and partition in topic_image.partitions:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.unknown_topic_or_partition


def _epoch_at(hp: HostedPartition, offset: int) -> int:
    if offset >= hp.log.log_end_offset:
        return hp.state.leader_epoch
    return hp.log.epoch_cache.epoch_for_offset(offset)


def _max_timestamp(hp: HostedPartition, bound: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record with the largest timestamp below `bound`."""
    log = hp.log
    best = None
    for segment in log.segments:
        if segment.max_timestamp < 0 or segment.next_offset <= log.log_start_offset:
            continue
        if best is None or segment.max_timestamp > best.max_timestamp:
            best = segment
    if best is None:
        return None
    found = best.find_batch(best.offset_of_max_timestamp)
    if found is None:
        return None
    position, header = found
    if best.unchecked:
        best.check_range(position, position + header.size_in_bytes)  # raises for a bad batch
    batch = best.log.pread(header.size_in_bytes, position)
    for record in iter_records(batch):
        if record.timestamp == best.max_timestamp and log.log_start_offset <= record.offset < bound:
            return record.offset, record.timestamp
    return None


async def handle_offset_for_leader_epoch(broker, ctx, request):
    """The end offset of a leader epoch: the start of the next epoch, or
    the LEO for the current one (KIP-101; consumers use it to detect log
    truncation after a leader change, KIP-320)."""
    mod = response_module(request.header)
    topics = []
    for topic in request.body.topics:
        partitions = []
        for p in topic.partitions:
            hp = broker.replicas.partitions.get((topic.topic, p.partition))
            if hp is None:
                error = _missing(broker, topic.topic, p.partition)
            else:
                error = hp.state.fetch_error(p.current_leader_epoch, -1)
            if error is not ErrorCode.none:
                partitions.append(mod.EpochEndOffset(error_code=error, partition=p.partition))
                continue
            epoch, end_offset = hp.log.end_offset_for_epoch(p.leader_epoch)
            partitions.append(mod.EpochEndOffset(error_code=ErrorCode.none, partition=p.partition,
                                                 leader_epoch=epoch, end_offset=end_offset))
        topics.append(mod.OffsetForLeaderTopicResult(topic=topic.topic, partitions=tuple(partitions)))
    return build(mod.OffsetForLeaderEpochResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))
