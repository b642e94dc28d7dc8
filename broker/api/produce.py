"""Produce: append client batches to partition leaders (the hot path).

Theory of operation
-------------------
For each partition of the request: check leadership (and, for acks=all,
`min.insync.replicas`), check that exactly one batch came, check every
record in it (`storage.record_validation`, Kafka's LogValidator: a batch
whose records do not parse is refused whole, INVALID_RECORD with the
record's index, KIP-467), and append it with `Log.append`, which checks the
batch header and CRC and assigns offsets by rewriting the base offset. The appends of one
connection happen in request order (`ctx.in_order`), as Kafka's one-request-
at-a-time connections guarantee, so an idempotent producer's sequence
numbers land in order.

- acks=0: no response. As Kafka does, a failed partition closes the
  connection instead, the only signal such a producer gets.
- acks=1: answer after the local append.
- acks=all (-1): answer once the HW passes every appended partition's new
  log end offset, or after the request's timeout with REQUEST_TIMED_OUT for
  the partitions still short (Kafka's DelayedProduce). With one replica the
  HW moves with the append, so this answers at once; with replication the
  wait is real and is woken by follower fetches moving the HW.

The handler answers at once when it can (the hot path: no task, no
scheduling). If every earlier request of the connection is done
(`ctx.in_turn`), it appends right away and returns the response; an
acks=all request whose partitions still wait for the HW returns a
coroutine that waits. If an earlier request is still being handled, the
whole request runs as a coroutine that waits its turn (`ctx.in_order`).

A request of a transactional producer (it names a transactional id) whose
batch would open a transaction on a partition first waits for the
coordinator to confirm the partition is in that transaction
(`broker.api.txn_verification`, KIP-890), then runs in its turn like any
other; a partition the coordinator does not confirm answers its error
without an append. From Produce v12 (transactions v2) the leader adds the
partition to the transaction instead of verifying it: such a client sends
no AddPartitionsToTxn of its own.

From v13 the request names topics by id (KIP-516): they are looked up in
the broker's metadata image first, and an id it does not know is answered
with UNKNOWN_TOPIC_ID on each of its partitions (the client refreshes its
metadata). From v10 a partition answered NOT_LEADER_OR_FOLLOWER or
FENCED_LEADER_EPOCH names the leader the image has, and the response
carries that leader's endpoint (KIP-951, `broker.api.leader_endpoints`),
so the producer goes there without asking for metadata first.

The request's records are views of the connection's receive buffer
(`common.wire.produce_request`); `Log.append` writes them before the
handler returns and keeps no reference. The response is encoded by hand
(`broker.api.codec.encode_produce_response`).
"""

from __future__ import annotations

import logging

import trio
from kio.schema.errors import ErrorCode

from broker.api.codec import (
    PRODUCE_LEADER_VERSION,
    PRODUCE_TOPIC_ID_VERSION,
    ProducePartitionResult,
    encode_produce_response,
)
from broker.api.leader_endpoints import LEADER_MOVED, current_leader, node_endpoints
from broker.api.txn_verification import unverified, verify
from broker.shell.hosted_partition import HostedPartition, wait_for_acks
from common.security.acl import Operation

_log = logging.getLogger("broker.produce")

#: (topic name, or topic id from v13) -> its partitions' results, in request order.
Results = list[tuple[object, list[ProducePartitionResult]]]
#: acks=all partitions still waiting: (index into results, position, partition,
#: required offset, the leader epoch the batch was appended in).
#: The first Produce version of transactions v2 (KIP-890 part 2).
TRANSACTIONS_V2_PRODUCE_VERSION = 12

Waiting = list[tuple[int, int, HostedPartition, int, int]]


def handle_produce(broker, ctx, request, throttle_ms=None):
    """The response, None (acks=0), or a coroutine giving one of them."""
    if throttle_ms is None and broker.produce_quotas is not None:
        throttle_ms = broker.produce_quotas.record(ctx.principal, request.header.client_id, request.size_bytes,
                                                   trio.current_time())
        if throttle_ms:
            return _throttled(broker, ctx, request, throttle_ms)
    body = request.body
    if request.header.api_version >= PRODUCE_TOPIC_ID_VERSION:
        body = _names_from_ids(broker, body)
    acks = body.acks
    if acks not in (0, 1, -1):
        results = [(_key(t), [ProducePartitionResult(p.index, ErrorCode.invalid_required_acks)
                              for p in t.partition_data]) for t in body.topic_data]
        return _respond(broker, request, results, True, throttle_ms, ctx)
    denied = None
    if broker.authorizer.enabled:
        # WRITE on each topic; the others are appended (Kafka answers per topic).
        topics = broker.authorizer.denied_topics(
            ctx, (t.name for t in body.topic_data if t.name is not None), Operation.WRITE)
        if topics:
            denied = {(t.name, p.index): ErrorCode.topic_authorization_failed
                      for t in body.topic_data if t.name in topics for p in t.partition_data}
    if body.transactional_id:
        # Produce v12+: a transactions v2 client; the leader adds the partition.
        add = request.header.api_version >= TRANSACTIONS_V2_PRODUCE_VERSION
        needed = unverified(broker, body, add)
        if needed:
            return _verify_then_handle(broker, ctx, request, body, needed, add, denied, throttle_ms)
    if denied:
        return _handle_in_turn(broker, ctx, request, body, denied, throttle_ms)
    if not ctx.in_turn(request):
        return _handle_in_turn(broker, ctx, request, body, None, throttle_ms)
    try:
        results, waiting, any_error = _append(broker, body)
    finally:
        ctx.end_turn(request)
    if waiting:
        return _respond_when_replicated(broker, ctx, request, results, waiting, any_error, throttle_ms)
    if acks and not any_error and not throttle_ms:
        return encode_produce_response(request.header, results)  # the hot path
    return _respond(broker, request, results, any_error, throttle_ms, ctx)


def _names_from_ids(broker, body):
    """A v13 body with each topic's name looked up by its id; an unknown id
    keeps name None (`_append` answers UNKNOWN_TOPIC_ID)."""
    topics_by_id = broker.image.topics_by_id
    topics = []
    for t in body.topic_data:
        topic_image = topics_by_id.get(t.topic_id)
        topics.append(t._replace(name=topic_image.name) if topic_image is not None else t)
    return body._replace(topic_data=tuple(topics))


def _key(topic_data):
    """How the response names a topic: as the request did (by id from v13)."""
    return topic_data.topic_id if topic_data.topic_id is not None else topic_data.name


async def _verify_then_handle(broker, ctx, request, body, needed, add=False, denied=None, throttle_ms=None):
    # Verified before the turn is taken: the later requests of the
    # connection wait for this one's turn anyway, not for its verification
    # round trip unless they come after it.
    refused = await verify(broker, body.transactional_id, needed, add)
    if denied:
        refused = {**(refused or {}), **denied}
    return await _handle_in_turn(broker, ctx, request, body, refused, throttle_ms)


async def _handle_in_turn(broker, ctx, request, body, refused=None, throttle_ms=None):
    async with ctx.in_order(request):
        results, waiting, any_error = _append(broker, body, refused)
    if waiting:
        return await _respond_when_replicated(broker, ctx, request, results, waiting, any_error, throttle_ms)
    return _respond(broker, request, results, any_error, throttle_ms, ctx)


def _append(broker, body, refused=None) -> tuple[Results, Waiting, bool]:
    """`refused`: partitions answered with an error instead of appended
    (their transaction's coordinator did not confirm them)."""
    acks = body.acks
    now_ms = broker.clock_ms()
    image = broker.image
    append = broker.replicas.append_to_leader
    results: Results = []
    waiting: Waiting = []
    any_error = False
    for topic_data in body.topic_data:
        partition_results = []
        name = topic_data.name
        if name is None:  # v13: a topic id the image does not know
            any_error = True
            results.append((topic_data.topic_id, [ProducePartitionResult(p.index, ErrorCode.unknown_topic_id)
                                                  for p in topic_data.partition_data]))
            continue
        for p in topic_data.partition_data:
            if refused and (name, p.index) in refused:
                any_error = True
                partition_results.append(ProducePartitionResult(p.index, refused[(name, p.index)]))
                continue
            result, hp, required = append(image, name, p.index, p.records, acks, now_ms)
            if result.error_code:
                any_error = True
            elif acks == -1 and hp is not None:
                # The epoch of this append: a leadership change before the HW
                # passes it fails the request (a new leader may have truncated it).
                waiting.append((len(results), len(partition_results), hp, required, hp.state.leader.leader_epoch))
            partition_results.append(result)
        results.append((_key(topic_data), partition_results))
    return results, waiting, any_error


def _throttled(broker, ctx, request, throttle_ms: int):
    """The response with `throttle_ms` in it; the connection reads nothing more for that long."""
    ctx.mute(throttle_ms / 1000)
    return handle_produce(broker, ctx, request, throttle_ms)


def _respond(broker, request, results: Results, any_error: bool, throttle_ms=None, ctx=None):
    if request.body.acks == 0:
        if any_error:
            _log.info("closing connection %d from %s: an acks=0 produce failed", ctx.connection_id, ctx.peer)
            ctx.close()
        return None
    endpoints = ()
    if any_error and request.header.api_version >= PRODUCE_LEADER_VERSION:
        endpoints = _name_leaders(broker, results)
    return encode_produce_response(request.header, results, endpoints, throttle_ms or 0)


def _name_leaders(broker, results: Results) -> list[tuple[int, str, int, str | None]]:
    """Fill in `current_leader` of each partition whose leader moved (KIP-951),
    from the image; the endpoints of the leaders named."""
    image = broker.image
    leaders = set()
    for key, partitions in results:
        topic_id = key if not isinstance(key, str) else image.topic_ids_by_name.get(key)
        for i, p in enumerate(partitions):
            if p.error_code in LEADER_MOVED and p.current_leader is None:
                leader = current_leader(image, topic_id, p.partition)
                if leader is not None:
                    partitions[i] = p._replace(current_leader=leader)
                    leaders.add(leader[0])
    return node_endpoints(broker, sorted(leaders))


async def _respond_when_replicated(broker, ctx, request, results: Results, waiting: Waiting, any_error: bool,
                                   throttle_ms=None):
    """`any_error`: a partition already failed before the wait."""
    deadline = trio.current_time() + request.body.timeout.total_seconds()
    errored = await _await_high_watermark(results, waiting, deadline)
    return _respond(broker, request, results, errored or any_error, throttle_ms, ctx)


async def _await_high_watermark(results, waiting, deadline: float) -> bool:
    """Park until each partition's HW reaches its required offset (or it
    fails), then fill in the final error codes: whether any partition failed."""
    errored = False
    while True:
        pending = []
        for entry in waiting:
            topic_index, position, hp, required, append_epoch = entry
            error = hp.state.acks_all_status(required, append_epoch)
            if error is None:
                pending.append(entry)
            elif error is not ErrorCode.none:
                _set_error(results, topic_index, position, error)
                errored = True
        waiting = pending
        if not waiting or trio.current_time() >= deadline:
            break
        await wait_for_acks(((entry[2], entry[3], entry[4]) for entry in waiting), deadline)
    for topic_index, position, *_ in waiting:
        _set_error(results, topic_index, position, ErrorCode.request_timed_out)
        errored = True
    return errored


def _set_error(results, topic_index: int, position: int, error: ErrorCode) -> None:
    partitions = results[topic_index][1]
    partitions[position] = ProducePartitionResult(partitions[position].partition, error)
