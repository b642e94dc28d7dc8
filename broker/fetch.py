"""Fetch: hand consumers (and, later, followers) file slices of their partitions.

Theory of operation
-------------------
A Fetch names partitions and offsets. For each, in request order:

1. Find the hosted partition; check the client's `current_leader_epoch`
   (KIP-320) and leadership (`PartitionState.fetch_error`).
2. Check the offset against [log start, log end] (OFFSET_OUT_OF_RANGE).
3. Read whole batches from the offset up to the bound: the HW for
   `read_uncommitted`, the LSO for `read_committed` (= HW: no transactions
   yet), the LEO for a follower. The read is limited by the partition's
   `partition_max_bytes` and what is left of the response's `max_bytes`.
   As Kafka does (KIP-74), the first batch of the first partition with data
   goes out even when it is larger than either limit, so a consumer never
   stalls on a big batch; any later partition gets only batches that fit.

The records go out as `FileSlice`s of the segment files (sent with
`os.sendfile`), never read into Python.

Long poll (Kafka's DelayedFetch): if the response would carry fewer than
`min_bytes` bytes and no partition errored, the request parks on its
partitions (`wait_for_change`) until one changes (an append moving the HW,
a leadership change) or `max_wait_ms` passes. Woken, it reads again only
the partitions that changed: a follower's Fetch lists thousands of
partitions, and reading every one of them again for each produce that
wakes it made a replication round cost O(partitions). Only then is the
handler a coroutine; a fetch with data is answered at once.

Fetch sessions (KIP-227): the broker does not create sessions. A request
with session id 0 is a full fetch and gets session id 0 back, which tells
a client asking for a new session (epoch 0) that none was created, so it
keeps sending full fetches. A non-zero session id gets
FETCH_SESSION_ID_NOT_FOUND, so the client falls back to a full fetch.
"""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode

from broker.codec import FetchPartitionResult, encode_fetch_response, records_size
from broker.partition import NO_EPOCH
from broker.replica_manager import HostedPartition, wait_for_change
from raftka.wire import FileSlice
from storage.errors import OffsetOutOfRangeError

READ_COMMITTED = 1


def handle_fetch(broker, ctx, request):
    """The response, or (long poll) a coroutine giving it."""
    body = request.body
    header = request.header
    session_id = getattr(body, "session_id", 0)
    session_epoch = getattr(body, "session_epoch", -1)
    if session_id != 0:
        return encode_fetch_response(header, ErrorCode.fetch_session_id_not_found, 0, [])
    if session_epoch not in (-1, 0):
        return encode_fetch_response(header, ErrorCode.invalid_fetch_session_epoch, 0, [])
    replica_id = getattr(body, "replica_id", -1)
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    topics, size, errored, _ = _read(broker, body, replica_id, read_committed, header.api_version)
    if size >= body.min_bytes or errored:
        return encode_fetch_response(header, ErrorCode.none, 0, topics)
    max_wait_ms = int(body.max_wait.total_seconds() * 1000)
    if max_wait_ms <= 0:
        return encode_fetch_response(header, ErrorCode.none, 0, topics)
    deadline = trio.current_time() + max_wait_ms / 1000
    return _long_poll(broker, body, header, replica_id, read_committed, deadline)


async def _long_poll(broker, body, header, replica_id: int, read_committed: bool, deadline: float):
    # Read again first: an append may have come between the handler's
    # read and this task's start, and it would not wake the wait below.
    topics, size, errored, places = _read(broker, body, replica_id, read_committed, header.api_version)
    while not (size >= body.min_bytes or errored or trio.current_time() >= deadline):
        changed = await wait_for_change((place[0] for place in places), deadline)
        if changed:
            size, errored = _read_again(broker, body, places, changed, replica_id, read_committed,
                                        header.api_version)
    return encode_fetch_response(header, ErrorCode.none, 0, topics)


def _read_again(broker, body, places, changed, replica_id: int, read_committed: bool, version: int):
    """Read the `changed` partitions again into their places in the response
    (in request order, within what the unchanged ones leave of `max_bytes`):
    (bytes, any error). A parked fetch has no errored partition, so `places`
    holds every partition of its request."""
    changed_ids = {id(hp) for hp in changed}
    total = sum(records_size(results[i].records) for hp, _, results, i in places if id(hp) not in changed_ids)
    budget = body.max_bytes - total
    now_ms = broker.clock_ms() if replica_id >= 0 else -1
    errored = False
    for hp, fp, results, i in places:
        if id(hp) in changed_ids:
            result = _read_partition(hp, fp, replica_id, read_committed, budget, total == 0, now_ms, version)
            errored = errored or result.error_code != 0
            size = records_size(result.records)
            total += size
            budget -= size
            results[i] = result
    return total, errored


def _read(broker, body, replica_id: int, read_committed: bool, version: int):
    """One pass over the request's partitions: (topics, bytes, any error,
    places), a place being (hosted partition, fetch partition, its topic's
    results, index there) for each partition hosted here."""
    partitions = broker.replicas.partitions
    image = broker.image
    # Only a follower's fetch needs the clock (its fetch time moves the ISR).
    now_ms = broker.clock_ms() if replica_id >= 0 else -1
    budget = body.max_bytes
    total = 0
    errored = False
    places = []
    topics = []
    for fetch_topic in body.topics:
        name = fetch_topic.topic
        results = []
        for fp in fetch_topic.partitions:
            hp = partitions.get((name, fp.partition))
            if hp is None:
                topic_image = image.topic(name)
                known = topic_image is not None and fp.partition in topic_image.partitions
                error = ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition
                results.append(FetchPartitionResult(fp.partition, error))
                errored = True
                continue
            places.append((hp, fp, results, len(results)))
            result = _read_partition(hp, fp, replica_id, read_committed, budget, total == 0, now_ms, version)
            if result.error_code:
                errored = True
            size = records_size(result.records)
            total += size
            budget -= size
            results.append(result)
        topics.append((name, results))
    return topics, total, errored, places


def _read_partition(hp: HostedPartition, fp, replica_id: int, read_committed: bool, budget: int,
                    first: bool, now_ms: int, version: int) -> FetchPartitionResult:
    state = hp.state
    error = state.fetch_error(getattr(fp, "current_leader_epoch", NO_EPOCH), replica_id)
    if error is not ErrorCode.none:
        leader = (state.leader_id, state.leader_epoch) if version >= 12 else None
        return FetchPartitionResult(fp.partition, error, current_leader=leader)
    if replica_id >= 0:
        return _read_for_follower(hp, fp, replica_id, budget, first, now_ms)
    log = hp.log
    offset = fp.fetch_offset
    hw = state.high_watermark
    lso = state.last_stable_offset
    log_start = log.log_start_offset
    aborted = () if read_committed else None
    limit = min(fp.partition_max_bytes, budget)
    if offset < log_start or offset > log.log_end_offset:
        return FetchPartitionResult(fp.partition, ErrorCode.offset_out_of_range, hw, lso, log_start)
    if limit <= 0 and not first:
        return FetchPartitionResult(fp.partition, ErrorCode.none, hw, lso, log_start, (), aborted)
    bound = state.fetch_upper_bound(read_committed, replica_id >= 0)
    try:
        slices = log.read(offset, max(limit, 1), max_offset=bound)
    except OffsetOutOfRangeError:
        return FetchPartitionResult(fp.partition, ErrorCode.offset_out_of_range, hw, lso, log_start)
    records = [FileSlice(s.file, s.position, s.size) for s in slices]
    if not first and records_size(records) > limit:
        # Only the response's first partition with data may overshoot (KIP-74).
        records = []
    return FetchPartitionResult(fp.partition, ErrorCode.none, hw, lso, log_start, records, aborted)


def _read_for_follower(hp: HostedPartition, fp, replica_id: int, budget: int, first: bool,
                       now_ms: int) -> FetchPartitionResult:
    """A follower's fetch: the replication core validates its position
    (DivergingEpoch, KIP-595) and records its LEO; reads go up to our LEO."""
    decision = hp.replicas.serve_replica_fetch(hp, replica_id, fp, now_ms)
    hw = decision.high_watermark
    log_start = decision.log_start_offset
    if decision.error != ErrorCode.none:
        state = hp.state
        return FetchPartitionResult(fp.partition, decision.error, hw, hw, log_start,
                                    current_leader=(state.leader_id, state.leader_epoch))
    if decision.diverging_epoch is not None:
        return FetchPartitionResult(fp.partition, ErrorCode.none, hw, hw, log_start,
                                    diverging_epoch=tuple(decision.diverging_epoch))
    limit = min(fp.partition_max_bytes, budget)
    if decision.read_offset < 0 or (limit <= 0 and not first):
        return FetchPartitionResult(fp.partition, ErrorCode.none, hw, hw, log_start, ())
    try:
        slices = hp.log.read(decision.read_offset, max(limit, 1), max_offset=decision.read_max_offset)
    except OffsetOutOfRangeError:
        return FetchPartitionResult(fp.partition, ErrorCode.offset_out_of_range, hw, hw, log_start)
    records = [FileSlice(s.file, s.position, s.size) for s in slices]
    if not first and records_size(records) > limit:
        records = []
    return FetchPartitionResult(fp.partition, ErrorCode.none, hw, hw, log_start, records)
