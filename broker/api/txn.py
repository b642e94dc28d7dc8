"""The transaction coordinator's APIs: InitProducerId with a transactional
id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions,
ListTransactions.

Theory of operation
-------------------
Each handler turns the kio request into calls of the pure
`TransactionCoordinatorShard` of the transactional id's
`__transaction_state` partition, through `TransactionCoordinatorRuntime`
(`broker.shell.txn_runtime`), which answers only once the step's records
are committed. A transactional id whose partition is not led here is
answered NOT_COORDINATOR (the client looks its coordinator up again), one
still loading COORDINATOR_LOAD_IN_PROGRESS.

InitProducerId without a transactional id is the idempotent producer's:
`broker.api.admin` answers it. With one, a producer id is allocated from
the controller's block first when the shard will need one (a new
transactional id, or an exhausted epoch).

PRODUCER_FENCED (KIP-588) goes only to clients that know it:
InitProducerId v4+, AddPartitionsToTxn v2+, AddOffsetsToTxn v2+, EndTxn
v2+; older versions get INVALID_PRODUCER_EPOCH, as Kafka's broker does.

AddPartitionsToTxn v4+ (KIP-890) is the broker-to-broker form: several
transactions per request, each either added or, with `verify_only`,
checked (a partition not in the transaction answers TRANSACTION_ABORTABLE).
A v5 add comes from a partition leader (Produce v12) or a group
coordinator (TxnOffsetCommit v5) on behalf of a transactions v2 client,
which sends no AddPartitionsToTxn/AddOffsetsToTxn of its own.

EndTxn v5 is transactions v2 (KIP-890 part 2): the coordinator bumps the
producer epoch with every commit or abort and answers the producer id and
epoch to go on with (`TransactionCoordinatorShard.end_txn_v2`).
"""

from __future__ import annotations

import datetime
import re

from kio.schema.errors import ErrorCode

from broker.api import admin
from broker.api.kio_util import build, response_module
from broker.core.group import OFFSETS_TOPIC_NAME, partition_for_group
from broker.core.txn import TxnState, partition_for_transactional_id
from broker.shell.txn_runtime import NotCoordinator

_NO_THROTTLE = datetime.timedelta(0)
#: The start time of no transaction. Kafka sends -1; kio (raftka's own
#: client and tools) refuses to decode a negative timestamp, so raftka sends
#: the epoch itself, which no real transaction started at.
_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)

#: API key -> (min, max) version served. InitProducerId v6 (KIP-939's
#: two-phase commit) is left out.
TXN_API_VERSIONS = {
    22: (0, 5),   # InitProducerId
    24: (0, 5),   # AddPartitionsToTxn
    25: (0, 4),   # AddOffsetsToTxn
    26: (0, 5),   # EndTxn
    65: (0, 0),   # DescribeTransactions
    66: (0, 1),   # ListTransactions
}
#: The first version of each API that may answer PRODUCER_FENCED.
_FENCED_SINCE = {22: 4, 24: 2, 25: 2, 26: 2}


def _client_error(request, error: ErrorCode) -> ErrorCode:
    header = request.header
    if error == ErrorCode.producer_fenced and header.api_version < _FENCED_SINCE.get(header.api_key, 0):
        return ErrorCode.invalid_producer_epoch
    return error


def _runtime(broker):
    return broker.txn_coordinator


# --- InitProducerId ------------------------------------------------------


async def handle_init_producer_id(broker, ctx, request):
    body = request.body
    if body.transactional_id is None:
        return await admin.handle_init_producer_id(broker, ctx, request)
    mod = response_module(request.header)
    tid = body.transactional_id
    timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
    producer_id = getattr(body, "producer_id", -1)
    producer_epoch = getattr(body, "producer_epoch", -1)

    def respond(error: ErrorCode, pid: int = -1, epoch: int = -1):
        return build(mod.InitProducerIdResponse, throttle_time=_NO_THROTTLE,
                     error_code=_client_error(request, error), producer_id=pid, producer_epoch=epoch)

    runtime = _runtime(broker)
    try:
        runner = runtime.runner_for(tid)
        new_producer_id = None
        if runner.shard.needs_producer_id(tid, producer_id, producer_epoch):
            error, new_producer_id = await admin.next_producer_id(broker)
            if error != ErrorCode.none:
                return respond(error)
        answer = await runtime.call(runner, lambda shard, now: shard.init_producer_id(
            tid, timeout_ms, producer_id, producer_epoch, now, new_producer_id))
    except NotCoordinator as exc:
        return respond(exc.error)
    if answer.error != ErrorCode.none:
        return respond(answer.error)
    return respond(ErrorCode.none, answer.producer_id, answer.producer_epoch)


# --- AddPartitionsToTxn ----------------------------------------------------


def _unknown_partitions(broker, partitions) -> set[tuple[str, int]]:
    image = broker.image
    unknown = set()
    for topic, p in partitions:
        t = image.topic(topic)
        if t is None or p not in t.partitions:
            unknown.add((topic, p))
    return unknown


async def add_partitions(broker, tid: str, pid: int, epoch: int, partitions: frozenset[tuple[str, int]],
                          verify_only: bool, check_exists: bool = True, transaction_version: int = 0
                          ) -> dict[tuple[str, int], ErrorCode]:
    if not verify_only and check_exists:
        unknown = _unknown_partitions(broker, partitions)
        if unknown:
            return {tp: ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted
                    for tp in partitions}
    runtime = _runtime(broker)
    try:
        runner = runtime.runner_for(tid)
        if verify_only:
            answer = await runtime.call(runner, lambda shard, now: shard.verify_partitions(
                tid, pid, epoch, partitions))
        else:
            answer = await runtime.call(runner, lambda shard, now: shard.add_partitions(
                tid, pid, epoch, partitions, now, transaction_version))
    except NotCoordinator as exc:
        return {tp: exc.error for tp in partitions}
    return dict(answer.partitions)


def _topic_results(mod, request, errors: dict[tuple[str, int], ErrorCode]):
    by_topic: dict[str, list] = {}
    for (topic, p), error in sorted(errors.items()):
        by_topic.setdefault(topic, []).append(build(
            mod.AddPartitionsToTxnPartitionResult, partition_index=p,
            partition_error_code=_client_error(request, error)))
    return tuple(build(mod.AddPartitionsToTxnTopicResult, name=t, results_by_partition=tuple(rs))
                 for t, rs in by_topic.items())


def _partitions(topics) -> frozenset[tuple[str, int]]:
    return frozenset((t.name, int(p)) for t in topics for p in t.partitions)


async def handle_add_partitions_to_txn(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    if hasattr(body, "transactions"):
        results = []
        # v5: a broker adding partitions for a transactions v2 client.
        version = 2 if request.header.api_version >= 5 else 0
        for txn in body.transactions:
            errors = await add_partitions(broker, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                           _partitions(txn.topics), txn.verify_only, transaction_version=version)
            results.append(build(mod.AddPartitionsToTxnResult, transactional_id=txn.transactional_id,
                                 topic_results=_topic_results(mod, request, errors)))
        return build(mod.AddPartitionsToTxnResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                     results_by_transaction=tuple(results))
    errors = await add_partitions(broker, body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
                                   body.v3_and_below_producer_epoch, _partitions(body.v3_and_below_topics), False)
    return build(mod.AddPartitionsToTxnResponse, throttle_time=_NO_THROTTLE,
                 results_by_topic_v3_and_below=_topic_results(mod, request, errors))


# --- AddOffsetsToTxn -------------------------------------------------------


def offsets_partition(broker, group_id: str) -> int:
    """The `__consumer_offsets` partition of a group (as the group coordinator places it)."""
    topic = broker.image.topic(OFFSETS_TOPIC_NAME)
    n = len(topic.partitions) if topic is not None else \
        broker.config.group_coordinator.offsets_topic_num_partitions
    return partition_for_group(group_id, n)


async def handle_add_offsets_to_txn(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    partition = frozenset({(OFFSETS_TOPIC_NAME, offsets_partition(broker, body.group_id))})
    # Not checked against the image, as in Kafka: `__consumer_offsets` may
    # not exist yet (the client's FindCoordinator for the group, before its
    # TxnOffsetCommit, creates it). The marker sender drops a partition
    # that still does not exist at the end: nothing can have been written there.
    errors = await add_partitions(broker, body.transactional_id, body.producer_id, body.producer_epoch,
                                   partition, False, check_exists=False)
    (error,) = errors.values()
    return build(mod.AddOffsetsToTxnResponse, throttle_time=_NO_THROTTLE, error_code=_client_error(request, error))


# --- EndTxn ----------------------------------------------------------------


async def handle_end_txn(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    runtime = _runtime(broker)
    tid = body.transactional_id
    v2 = request.header.api_version >= 5
    pid, epoch = body.producer_id, body.producer_epoch
    try:
        runner = runtime.runner_for(tid)
        if v2:
            new_producer_id = None
            if runner.shard.end_txn_needs_producer_id(tid, pid, epoch):
                error, new_producer_id = await admin.next_producer_id(broker)
                if error != ErrorCode.none:
                    return build(mod.EndTxnResponse, throttle_time=_NO_THROTTLE, error_code=error)
            answer = await runtime.call(runner, lambda shard, now: shard.end_txn_v2(
                tid, pid, epoch, body.committed, now, new_producer_id))
            return build(mod.EndTxnResponse, throttle_time=_NO_THROTTLE, error_code=answer.error,
                         producer_id=answer.producer_id, producer_epoch=answer.producer_epoch)
        error = await runtime.call(runner, lambda shard, now: shard.end_txn(
            tid, pid, epoch, body.committed, now))
    except NotCoordinator as exc:
        error = exc.error
    return build(mod.EndTxnResponse, throttle_time=_NO_THROTTLE, error_code=_client_error(request, error))


# --- DescribeTransactions / ListTransactions -----------------------------------


async def handle_describe_transactions(broker, ctx, request):
    mod = response_module(request.header)
    runtime = _runtime(broker)
    states = []
    for tid in request.body.transactional_ids:
        try:
            described = runtime.runner_for(tid).shard.describe(tid)
            error = described.error
        except NotCoordinator as exc:
            described, error = None, exc.error
        if described is None or error != ErrorCode.none:
            states.append(build(mod.TransactionState, error_code=error, transactional_id=tid, transaction_state="",
                                transaction_timeout=datetime.timedelta(0), transaction_start_time=_EPOCH, producer_id=-1, producer_epoch=-1,
                                topics=()))
            continue
        states.append(build(
            mod.TransactionState, error_code=ErrorCode.none, transactional_id=tid,
            transaction_state=described.state,
            transaction_timeout=datetime.timedelta(milliseconds=described.transaction_timeout_ms),
            transaction_start_time=_EPOCH + datetime.timedelta(milliseconds=max(described.start_timestamp_ms, 0)),
            producer_id=described.producer_id, producer_epoch=described.producer_epoch,
            topics=tuple(build(mod.TopicData, topic=t, partitions=ps) for t, ps in described.partitions)))
    return build(mod.DescribeTransactionsResponse, throttle_time=_NO_THROTTLE, transaction_states=tuple(states))


async def handle_list_transactions(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    runtime = _runtime(broker)
    states, unknown = set(), []
    for name in body.state_filters:
        state = TxnState.from_name(name)
        if state is None:
            unknown.append(name)
        else:
            states.add(state)
    if body.state_filters and not states:
        # Only unknown states asked for: nothing can match (as Kafka answers).
        return build(mod.ListTransactionsResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                     unknown_state_filters=tuple(unknown), transaction_states=())
    pattern = getattr(body, "transactional_id_pattern", None)
    matcher = re.compile(pattern) if pattern else None
    error = ErrorCode.none
    listed = []
    now_ms = broker.clock_ms()
    for runner in list(runtime.shards.values()):
        if not runner.active:
            continue
        if not runner.shard.loaded:
            error = ErrorCode.coordinator_load_in_progress
            continue
        for t in runner.shard.list_transactions(frozenset(states), frozenset(body.producer_id_filters),
                                                getattr(body, "duration_filter", -1), now_ms):
            if matcher is None or matcher.fullmatch(t.transactional_id):
                listed.append(build(mod.TransactionState, transactional_id=t.transactional_id,
                                    producer_id=t.producer_id, transaction_state=t.state))
    listed.sort(key=lambda t: t.transactional_id)
    return build(mod.ListTransactionsResponse, throttle_time=_NO_THROTTLE, error_code=error,
                 unknown_state_filters=tuple(unknown), transaction_states=tuple(listed))


def coordinator_partition(broker, transactional_id: str) -> int | None:
    n = _runtime(broker).num_partitions()
    return None if n is None else partition_for_transactional_id(transactional_id, n)


HANDLERS = {
    22: handle_init_producer_id,
    24: handle_add_partitions_to_txn,
    25: handle_add_offsets_to_txn,
    26: handle_end_txn,
    65: handle_describe_transactions,
    66: handle_list_transactions,
}
