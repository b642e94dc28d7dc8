"""Fetch: hand consumers (and, later, followers) file slices of their partitions.

Theory of operation
-------------------
A Fetch names partitions and offsets. For each, in request order:

1. Find the hosted partition; check the client's `current_leader_epoch`
   (KIP-320) and leadership (`PartitionState.fetch_error`).
2. Check the offset against [log start, log end] (OFFSET_OUT_OF_RANGE).
3. Read whole batches from the offset up to the bound: the HW for
   `read_uncommitted`, the LSO for `read_committed` (with the aborted
   transactions overlapping the records sent, from the segments'
   `.txnindex`), the LEO for a follower. The read is limited by the partition's
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

Fetch sessions (KIP-227, `broker.shell.fetch_session`): a follower asking for
one (session epoch 0) gets one; its incremental fetches name only the
partitions whose position changed, and are answered with only the
partitions that have something new: the ones named and the ones the
session marked dirty. A parked incremental fetch waits on its session, not
on each partition. A consumer asking for a session gets session id 0 and
keeps sending full fetches.

Topic ids (KIP-516, Fetch v13+): a request names topics by id, resolved
through the broker's metadata image; an id the image does not know gets
UNKNOWN_TOPIC_ID for each of its partitions (the client refreshes its
metadata), and the answer names topics by the ids asked for. From v15 the
follower's id is in `replica_state` (KIP-903); from v16 an answer with
NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH carries the endpoints of the
leaders it names (KIP-951), so the client goes there without a Metadata
round first.

A response goes out at once, whatever `min_bytes` says, when a partition
errored or has a DivergingEpoch for the follower (as Kafka's DelayedFetch:
the follower must truncate before it can fetch anything).
"""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode

from broker.api.codec import (
    FETCH_TOPIC_ID_VERSION,
    FetchPartitionResult,
    encode_fetch_response,
    records_size,
)
from broker.api.leader_endpoints import LEADER_MOVED, node_endpoints
from broker.core.replication import NO_EPOCH
from broker.shell.hosted_partition import HostedPartition, wait_for_change
from common.security.acl import Operation, ResourceType
from common.wire import FileSlice, duration_ms
from storage.errors import OffsetOutOfRangeError, StorageError

#: Positions in a topic's `broker.replicas.topic_stats` list (`broker.shell.metrics.TopicStats`).
_BYTES_OUT, _REPLICATION_BYTES_OUT = 2, 4

READ_COMMITTED = 1
#: Error codes the per-partition paths compare with, read once (an enum
#: member's lookup on its class costs 0.1 us here).
_NONE = ErrorCode.none
_UNKNOWN_LEADER_EPOCH = ErrorCode.unknown_leader_epoch
_UNKNOWN_TOPIC_ID = ErrorCode.unknown_topic_id
#: The partition errors whose `current_leader` a v16+ answer gives the endpoint of (KIP-951).
_LEADER_MOVED = LEADER_MOVED
#: The Fetch version from which the follower's id is in `replica_state` (KIP-903).
_REPLICA_STATE_VERSION = 15
#: The first Fetch version with `node_endpoints` in its answer (KIP-951).
_NODE_ENDPOINTS_VERSION = 16


def handle_fetch(broker, ctx, request, quota_checked=False):
    """The response, or (long poll) a coroutine giving it."""
    body = request.body
    header = request.header
    version = header.api_version
    session_epoch = getattr(body, "session_epoch", -1)
    replica_id = body.replica_state.replica_id if version >= _REPLICA_STATE_VERSION \
        else getattr(body, "replica_id", -1)
    if broker.fetch_quotas is not None and not quota_checked and replica_id < 0:
        return _fetch_within_quota(broker, ctx, request)
    # Sessions are for followers at v12, the version raftka's followers
    # send: a session keeps each partition's last fetched epoch (KIP-595),
    # which v7-v11 do not carry, and names topics as v12 does. Any other
    # follower is served in full, told by session id 0 that none was made
    # (KIP-227 lets a broker decline).
    session_owner = replica_id if version == 12 else -1
    error, session = broker.fetch_sessions.open_for(getattr(body, "session_id", 0), session_epoch, session_owner,
                                                    broker.clock_ms)
    if error is not ErrorCode.none:
        return encode_fetch_response(header, error, 0, [])
    denied = frozenset()
    if broker.authorizer.enabled:
        if replica_id >= 0:
            # A follower's fetch: CLUSTER_ACTION on the cluster (Kafka's rule for inter-broker requests).
            if not broker.authorizer.allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, "kafka-cluster"):
                return encode_fetch_response(header, ErrorCode.cluster_authorization_failed, 0, [])
        else:
            names = _topic_names(broker, body, version)
            denied = frozenset(broker.authorizer.denied_topics(ctx, (n for n in names if n is not None),
                                                               Operation.READ))
            if denied and all(n in denied for n in names):
                by_id = version >= FETCH_TOPIC_ID_VERSION
                topics = [(t.topic_id if by_id else t.topic,
                           [FetchPartitionResult(fp.partition, ErrorCode.topic_authorization_failed)
                            for fp in t.partitions]) for t in body.topics]
                return encode_fetch_response(header, ErrorCode.none, 0, topics)
    if session is not None:
        return _session_fetch(broker, session, body, header, full=session_epoch == 0)
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    topics, size, errored, _ = _read(broker, body, replica_id, read_committed, version, denied)
    if size >= body.min_bytes or errored:
        return _respond(broker, header, topics, errored)
    max_wait_ms = duration_ms(body.max_wait)
    if max_wait_ms <= 0:
        return encode_fetch_response(header, ErrorCode.none, 0, topics)
    deadline = trio.current_time() + max_wait_ms / 1000
    return _long_poll(broker, body, header, replica_id, read_committed, deadline)


async def _fetch_within_quota(broker, ctx, request):
    """A consumer's fetch under a `consumer_byte_rate` quota, as Kafka answers
    it: the response's bytes count against the quota; one that takes the
    client over is not sent -- an empty response carries throttle_time_ms
    instead, its bytes are not counted, and the connection is muted that long."""
    response = handle_fetch(broker, ctx, request, True)
    if not isinstance(response, list):
        response = await response
    quotas = broker.fetch_quotas
    if quotas is None:
        return response
    size = int.from_bytes(response[0], "big")  # the frame's size prefix
    throttle_ms = quotas.record(ctx.principal, request.header.client_id, size, trio.current_time())
    if not throttle_ms:
        return response
    quotas.record(ctx.principal, request.header.client_id, -size, trio.current_time())
    ctx.mute(throttle_ms / 1000)
    return encode_fetch_response(request.header, ErrorCode.none, 0, [], throttle_ms=throttle_ms)


def _session_fetch(broker, session, body, header, full: bool):
    """A follower's fetch in `session`: a full one (it was just created:
    every partition named is answered) or an incremental one."""
    named = session.begin_fetch(body.topics, () if full else body.forgotten_topics_data, broker.clock_ms(),
                                incremental=not full)
    answer: dict = {}
    candidates = list(session.partitions.values()) if full else list({**dict.fromkeys(named), **session.dirty})
    size, now = _read_session(broker, session, candidates, answer, body.max_bytes, header.api_version, full)
    max_wait_ms = duration_ms(body.max_wait)
    if now or size >= body.min_bytes or max_wait_ms <= 0:
        return _session_response(header, session, answer)
    return _session_long_poll(broker, session, body, header, answer, size, trio.current_time() + max_wait_ms / 1000)


async def _session_long_poll(broker, session, body, header, answer: dict, size: int, deadline: float):
    now = False
    while not (now or size >= body.min_bytes or trio.current_time() >= deadline):
        with trio.move_on_at(deadline):
            await session.changed.wait()
        if session.dirty:
            size, now = _read_session(broker, session, list(session.dirty), answer, body.max_bytes,
                                      header.api_version, False)
        else:  # set, then emptied by another fetch of the session (or its close): wait again
            session.changed = trio.Event()
    return _session_response(header, session, answer)


def _session_response(header, session, answer: dict):
    topics: dict[str, list] = {}
    for sp, result in answer.items():
        topics.setdefault(sp.topic, []).append(result)
    return encode_fetch_response(header, ErrorCode.none, session.session_id, list(topics.items()))


def _read_session(broker, session, candidates, answer: dict, max_bytes: int, version: int,
                  full: bool) -> tuple[int, bool]:
    """Read `candidates` (session partitions) for the session's follower;
    put those with something new (every one when `full`) into `answer`.
    Returns (bytes in `answer`, whether to answer now: an error or a
    DivergingEpoch). See `broker.shell.fetch_session` for what stays dirty."""
    partitions = broker.replicas.partitions
    topic_stats = broker.replicas.topic_stats
    replica_id = session.replica_id
    now_ms = broker.clock_ms()
    if answer:  # a parked fetch's later pass: what it holds of other partitions counts
        rereads = set(candidates)
        total = sum(records_size(r.records) for sp, r in answer.items() if sp not in rereads)
    else:
        total = 0
    budget = max_bytes - total
    now = False
    pending = []
    throttle = broker.leader_throttle
    # Per partition, this loop reads each field of a result once (a
    # NamedTuple's attribute is a descriptor call) and looks the answer up
    # only when it may hold records from an earlier pass: it runs for each
    # of the thousands of partitions a follower names after a failover.
    for sp in candidates:
        hp = partitions.get((sp.topic, sp.partition))
        if sp.hosted is not hp:
            session.bind(sp, hp)
        if hp is None:
            answer[sp] = FetchPartitionResult(sp.partition, _not_hosted_error(broker, sp.topic, sp.partition))
            pending.append(sp)
            now = True
            continue
        state = hp.state
        leader = state.leader
        if leader is not None and sp.recorded_by is leader and replica_id in state.isr:
            # Not named since this leadership recorded the position, and in
            # the ISR (no expansion to consider): only the log and the HW
            # can have moved.
            result = _reread_for_follower(hp, sp, budget, total == 0, now_ms)
            _, error, high_watermark, _, log_start, records, _, diverging, _ = result
        else:
            result = _read_partition(hp, sp, replica_id, False, budget, total == 0, now_ms, version)
            _, error, high_watermark, _, log_start, records, _, diverging, _ = result
            if error == 0 and diverging is None:
                sp.recorded_by = leader
        if throttle is not None and records:
            result = _within_replication_throttle(throttle, hp, sp.topic, replica_id, result)
            records = result.records
        if error == _UNKNOWN_LEADER_EPOCH:
            # Our metadata is behind the follower's: we have not applied
            # the election it saw. Not an answer yet, and not dirty either:
            # applying the election notifies the partition, which marks it
            # dirty again. Kept dirty, it was read again on every wake of
            # the session, thousands of times a second on a survivor slow
            # to apply a failover's elections.
            continue
        stale = error != 0 or diverging is not None  # `_answers_at_once`
        if full or stale or records or high_watermark != sp.high_watermark_sent \
                or log_start != sp.log_start_offset_sent:
            answer[sp] = result
            sp.high_watermark_sent = high_watermark
            sp.log_start_offset_sent = log_start
            kept = records
            if records and topic_stats is not None:
                topic_stats[sp.topic][_REPLICATION_BYTES_OUT] += records_size(records)
        else:
            earlier = answer.get(sp)
            kept = earlier.records if earlier is not None else None
        if kept:
            size = records_size(kept)
            total += size
            budget -= size
        if stale:
            now = True
            pending.append(sp)
        elif sp.fetch_offset < hp.log.log_end_offset or replica_id not in state.isr:
            pending.append(sp)
    # Reading moved HWs, whose notify marked the partitions just read dirty
    # again: clear that, keeping only the ones still pending.
    dirty = session.dirty
    for sp in candidates:
        dirty.pop(sp, None)
    for sp in pending:
        dirty[sp] = None
    session.changed = trio.Event()
    return total, now


def _within_replication_throttle(throttle, hp, topic: str, replica_id: int,
                                 result: FetchPartitionResult) -> FetchPartitionResult:
    """A follower's `result` under `leader.replication.throttled.rate`: a
    throttled replica out of the ISR (a reassignment's new one) gets no
    records once the leader's rate is used (it asks again); what it gets counts."""
    if replica_id in hp.state.isr or not throttle.throttled(topic, result.partition):
        return result
    clock = trio.current_time()
    if throttle.exceeded(clock):
        return result._replace(records=())
    throttle.record(records_size(result.records), clock)
    return result


def _answers_at_once(result: FetchPartitionResult) -> bool:
    """Whether `result` makes its fetch answer now, whatever `min_bytes`
    says: an error, or a DivergingEpoch the follower must truncate by."""
    return result.error_code != 0 or result.diverging_epoch is not None


def _not_hosted_error(broker, topic: str, partition: int) -> ErrorCode:
    if broker.replicas.storage_error(topic, partition):
        return ErrorCode.kafka_storage_error  # its log could not be opened here
    topic_image = broker.image.topic(topic)
    known = topic_image is not None and partition in topic_image.partitions
    return ErrorCode.not_leader_or_follower if known else ErrorCode.unknown_topic_or_partition


def _not_hosted(broker, topic: str, partition: int, version: int) -> FetchPartitionResult:
    """The answer for a partition with no replica here; from v12, with its
    leader as the image has it, so a v16+ client learns where to go
    (KIP-951)."""
    error = _not_hosted_error(broker, topic, partition)
    leader = None
    if error == ErrorCode.not_leader_or_follower and version >= 12:
        registration = broker.image.partition(broker.image.topic_ids_by_name[topic], partition)
        leader = (registration.leader, registration.leader_epoch)
    return FetchPartitionResult(partition, error, current_leader=leader)


async def _long_poll(broker, body, header, replica_id: int, read_committed: bool, deadline: float):
    # Read again first: an append may have come between the handler's
    # read and this task's start, and it would not wake the wait below.
    topics, size, errored, places = _read(broker, body, replica_id, read_committed, header.api_version)
    while not (size >= body.min_bytes or errored or trio.current_time() >= deadline):
        changed = await wait_for_change((place[0] for place in places), deadline)
        if changed:
            size, errored = _read_again(broker, body, places, changed, replica_id, read_committed,
                                        header.api_version)
    return _respond(broker, header, topics, errored)


def _respond(broker, header, topics, errored: bool):
    """The answer to a full (sessionless) fetch; from v16, with the
    endpoints of the leaders its NOT_LEADER_OR_FOLLOWER and
    FENCED_LEADER_EPOCH partitions name (only an errored answer has any)."""
    if not errored or header.api_version < _NODE_ENDPOINTS_VERSION:
        return encode_fetch_response(header, ErrorCode.none, 0, topics)
    leaders = {r.current_leader[0] for _, results in topics for r in results
               if r.current_leader is not None and r.error_code in _LEADER_MOVED and r.current_leader[0] >= 0}
    return encode_fetch_response(header, ErrorCode.none, 0, topics,
                                 node_endpoints=node_endpoints(broker, sorted(leaders)))


def _read_again(broker, body, places, changed, replica_id: int, read_committed: bool, version: int):
    """Read the `changed` partitions again into their places in the response
    (in request order, within what the unchanged ones leave of `max_bytes`):
    (bytes, any error). A parked fetch has no errored partition, so `places`
    holds every partition of its request."""
    changed_ids = {id(hp) for hp in changed}
    topic_stats = broker.replicas.topic_stats
    total = sum(records_size(results[i].records) for hp, _, results, i in places if id(hp) not in changed_ids)
    budget = body.max_bytes - total
    now_ms = broker.clock_ms() if replica_id >= 0 else -1
    throttle = broker.leader_throttle if replica_id >= 0 else None
    errored = False
    for hp, fp, results, i in places:
        if id(hp) in changed_ids:
            result = _read_partition(hp, fp, replica_id, read_committed, budget, total == 0, now_ms, version)
            if throttle is not None and result.records:
                result = _within_replication_throttle(throttle, hp, hp.state.topic, replica_id, result)
            errored = errored or _answers_at_once(result)
            size = records_size(result.records)
            if size and topic_stats is not None:
                topic_stats[hp.state.topic][_REPLICATION_BYTES_OUT if replica_id >= 0 else _BYTES_OUT] += size
            total += size
            budget -= size
            results[i] = result
    return total, errored


def _topic_names(broker, body, version: int) -> list:
    """The request's topic names, by id from v13 (None for an unknown id)."""
    if version < FETCH_TOPIC_ID_VERSION:
        return [t.topic for t in body.topics]
    topics_by_id = broker.image.topics_by_id
    return [getattr(topics_by_id.get(t.topic_id), "name", None) for t in body.topics]


def _read(broker, body, replica_id: int, read_committed: bool, version: int, denied: frozenset = frozenset()):
    """One pass over the request's partitions: (topics, bytes, any error,
    places), a place being (hosted partition, fetch partition, its topic's
    results, index there) for each partition hosted here."""
    partitions = broker.replicas.partitions
    topic_stats = broker.replicas.topic_stats
    stats_index = _REPLICATION_BYTES_OUT if replica_id >= 0 else _BYTES_OUT
    # Only a follower's fetch needs the clock (its fetch time moves the ISR).
    now_ms = broker.clock_ms() if replica_id >= 0 else -1
    budget = body.max_bytes
    total = 0
    errored = False
    places = []
    topics = []
    by_id = version >= FETCH_TOPIC_ID_VERSION
    # Only followers' fetches are held by a replication throttle.
    throttle = broker.leader_throttle if replica_id >= 0 else None
    for fetch_topic in body.topics:
        if by_id:
            topic_id = fetch_topic.topic_id
            topic_image = broker.image.topics_by_id.get(topic_id)
            if topic_image is None:
                topics.append((topic_id, [FetchPartitionResult(fp.partition, _UNKNOWN_TOPIC_ID)
                                          for fp in fetch_topic.partitions]))
                errored = True
                continue
            name = topic_image.name
        else:
            name = fetch_topic.topic
        results = []
        for fp in fetch_topic.partitions:
            if denied and name in denied:
                results.append(FetchPartitionResult(fp.partition, ErrorCode.topic_authorization_failed))
                errored = True
                continue
            hp = partitions.get((name, fp.partition))
            if hp is None:
                results.append(_not_hosted(broker, name, fp.partition, version))
                errored = True
                continue
            places.append((hp, fp, results, len(results)))
            result = _read_partition(hp, fp, replica_id, read_committed, budget, total == 0, now_ms, version)
            if throttle is not None and result.records:
                result = _within_replication_throttle(throttle, hp, name, replica_id, result)
            if _answers_at_once(result):
                errored = True
            size = records_size(result.records)
            if size and topic_stats is not None:
                topic_stats[name][stats_index] += size
            total += size
            budget -= size
            results.append(result)
        topics.append((topic_id if by_id else name, results))
    return topics, total, errored, places


def _read_partition(hp: HostedPartition, fp, replica_id: int, read_committed: bool, budget: int,
                    first: bool, now_ms: int, version: int) -> FetchPartitionResult:
    state = hp.state
    error = state.fetch_error(getattr(fp, "current_leader_epoch", NO_EPOCH), replica_id)
    if error is not _NONE:
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
    bound = log.log_end_offset if replica_id >= 0 else state.fetch_upper_bound(read_committed)
    try:
        slices = log.read(offset, max(limit, 1), max_offset=bound)
    except OffsetOutOfRangeError:
        return FetchPartitionResult(fp.partition, ErrorCode.offset_out_of_range, hw, lso, log_start)
    except (StorageError, OSError) as exc:
        return FetchPartitionResult(fp.partition, hp.read_error(exc), hw, lso, log_start)
    records = [FileSlice(s.file, s.position, s.size) for s in slices]
    if not first and records_size(records) > limit:
        # Only the response's first partition with data may overshoot (KIP-74).
        records = []
    if read_committed and records:
        # The aborted transactions overlapping what goes out: the consumer
        # drops their records (`storage.txn_index`).
        aborted = tuple((a.producer_id, a.first_offset) for a in log.collect_aborted_txns(offset, bound))
    return FetchPartitionResult(fp.partition, ErrorCode.none, hw, lso, log_start, records, aborted)


def _reread_for_follower(hp: HostedPartition, sp, budget: int, first: bool, now_ms: int) -> FetchPartitionResult:
    """A session partition read again at the position its leadership
    already took into account (`_read_session`): `_read_for_follower`
    without the replication core, whose answer would be the same."""
    log = hp.log
    hw = hp.state.high_watermark
    replicas = hp.replicas
    if replicas.timeline.watching:
        replicas.note_replica_fetch(hp, hw, now_ms)
    return _follower_records(hp, sp, sp.fetch_offset, log.log_end_offset, budget, first, hw, log.log_start_offset)


def _read_for_follower(hp: HostedPartition, fp, replica_id: int, budget: int, first: bool,
                       now_ms: int) -> FetchPartitionResult:
    """A follower's fetch: the replication core validates its position
    (DivergingEpoch, KIP-595) and records its LEO; reads go up to our LEO."""
    decision = hp.replicas.serve_replica_fetch(hp, replica_id, fp, now_ms)
    hw = decision.high_watermark
    log_start = decision.log_start_offset
    if decision.error != _NONE:
        state = hp.state
        return FetchPartitionResult(fp.partition, decision.error, hw, hw, log_start,
                                    current_leader=(state.leader_id, state.leader_epoch))
    if decision.diverging_epoch is not None:
        return FetchPartitionResult(fp.partition, _NONE, hw, hw, log_start,
                                    diverging_epoch=tuple(decision.diverging_epoch))
    if decision.read_offset < 0:
        return FetchPartitionResult(fp.partition, _NONE, hw, hw, log_start, ())
    return _follower_records(hp, fp, decision.read_offset, decision.read_max_offset, budget, first, hw, log_start)


def _follower_records(hp: HostedPartition, fp, offset: int, max_offset: int, budget: int, first: bool, hw: int,
                      log_start: int) -> FetchPartitionResult:
    """A follower's answer for `fp`: the batches from `offset` below
    `max_offset` (the LEO), within its partition max bytes and what is left
    of the response's (only the first partition with data may overshoot,
    KIP-74)."""
    if offset == max_offset:
        # Caught up: `Log.read` from the log end offset returns no batch
        # (and raises nothing: the log start is never past the LEO). After
        # a failover most of a follower's partitions are answered so, twice
        # each, and the call and its checks cost more than this answer.
        return FetchPartitionResult(fp.partition, _NONE, hw, hw, log_start, ())
    limit = min(fp.partition_max_bytes, budget)
    if limit <= 0 and not first:
        return FetchPartitionResult(fp.partition, _NONE, hw, hw, log_start, ())
    try:
        slices = hp.log.read(offset, max(limit, 1), max_offset)
    except OffsetOutOfRangeError:
        return FetchPartitionResult(fp.partition, ErrorCode.offset_out_of_range, hw, hw, log_start)
    except (StorageError, OSError) as exc:
        return FetchPartitionResult(fp.partition, hp.read_error(exc), hw, hw, log_start)
    if len(slices) == 1:  # a follower that keeps up: the batches since its position, one slice
        file, position, size = slices[0]
        records = [FileSlice(file, position, size)]
    else:
        records = [FileSlice(s.file, s.position, s.size) for s in slices]
        size = records_size(records)
    if not first and size > limit:
        records = []
    return FetchPartitionResult(fp.partition, _NONE, hw, hw, log_start, records)
