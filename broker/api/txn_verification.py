"""KIP-890 partition-side verification: before a transactional producer's
batch opens a transaction on a partition, its leader asks the producer's
transaction coordinator whether the partition is in that producer's
ongoing transaction (AddPartitionsToTxn v4 with `verify_only`), so that a
late write of a transaction already committed or aborted (a retry stuck in
the network, a zombie) cannot open a transaction that nobody will ever end
(a hanging transaction: the LSO would stay behind it).

The produce path (`broker.api.produce`) calls `unverified` for each
request that names a transactional id (with
`transaction.partition.verification.enable`, on by default, as Kafka):
the partitions whose batch would open an unverified transaction. If there
are any, the request waits for `verify`, which asks the coordinator once
per (producer id, epoch): a partition the coordinator confirms is marked
verified (`ReplicaManager.mark_txn_verified`) and its batch is appended;
the others answer the coordinator's error: INVALID_TXN_STATE for a
partition not in the ongoing transaction (the coordinator's
TRANSACTION_ABORTABLE, which Produce v9 clients do not know), the fencing
errors as they are, and NOT_ENOUGH_REPLICAS (retriable: the client sends
the batch again) when the coordinator cannot answer now. Once verified,
the partition's producer state requires verification for each of that
producer's later transactions (`storage.producer_state`), so a batch that
arrives after the marker of the transaction it was verified for is refused
at the append as well.

A request without a transactional id (a raw idempotent producer id used
transactionally, as the partition-side tests do) is not verified: there is
no coordinator to ask, as in Kafka.

Transactions v2 (Produce v12+, KIP-890 part 2): the client sends no
AddPartitionsToTxn; the leader adds the partition to the transaction
itself, with the same round trip (AddPartitionsToTxn v5, not verify-only),
whatever `transaction.partition.verification.enable` says. Since the
coordinator bumped the producer epoch at the end of the previous
transaction, a late write of that transaction names a stale epoch and is
fenced, here and at the partition (whose marker carried the new epoch).
"""

from __future__ import annotations

import logging

import trio
from kio.schema.add_partitions_to_txn.v4 import request as apt_req
from kio.schema.add_partitions_to_txn.v5 import request as apt_req_v5
from kio.schema.errors import ErrorCode

from broker.api.kio_util import response_module
from broker.api.txn import add_partitions, coordinator_partition, offsets_partition
from broker.core.group import OFFSETS_TOPIC_NAME
from broker.core.group.responses import txn_offset_commit_response
from broker.core.txn.config import TRANSACTION_STATE_TOPIC_NAME
from broker.shell.coordinator_runtime import handle_group_request
from common.wire import ConnectionFailedError
from storage.batch import parse_header

_log = logging.getLogger("broker.txn_verification")

VERIFY_TIMEOUT_MS = 5000
#: Kafka's add.partitions.to.txn.retry.backoff.ms and .max.ms defaults:
#: how long a CONCURRENT_TRANSACTIONS answer is retried here first.
CONCURRENT_RETRY_BACKOFF_MS = 20
CONCURRENT_RETRY_MAX_MS = 100
BATCH_HEADER_BYTES = 61
#: The coordinator cannot answer now: the client retries the batch.
_RETRIABLE = {ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
              ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions,
              ErrorCode.request_timed_out}

Partition = tuple[str, int]


def unverified(broker, body, add: bool = False) -> dict[Partition, tuple[int, int]]:
    """The partitions of a Produce request whose transactional batch would
    open a transaction the coordinator has not verified: (producer id,
    epoch) each. `add`: a transactions v2 request (module doc)."""
    if not body.transactional_id or not (
            add or broker.config.txn_coordinator.transaction_partition_verification_enable):
        return {}
    partitions = broker.replicas.partitions
    out: dict[Partition, tuple[int, int]] = {}
    for topic_data in body.topic_data:
        for p in topic_data.partition_data:
            records = p.records
            if records is None or len(records) < BATCH_HEADER_BYTES:
                continue
            header = parse_header(records)
            if not header.is_transactional or header.is_control or header.producer_id < 0:
                continue
            hp = partitions.get((topic_data.name, p.index))
            if hp is None or not hp.state.is_leader or hp.log.producer_state is None:
                continue  # the append answers for it
            state = hp.log.producer_state
            if state.check_epoch(header.producer_id, header.producer_epoch).error:
                continue  # a stale epoch: the append refuses it, no need to ask
            if state.needs_verification(header.producer_id, header.producer_epoch):
                out[(topic_data.name, p.index)] = (header.producer_id, header.producer_epoch)
    return out


async def verify(broker, transactional_id: str, partitions: dict[Partition, tuple[int, int]], add: bool = False
                 ) -> dict[Partition, ErrorCode]:
    """Ask the coordinator about `partitions` (`add`: add them to the
    transaction, for a transactions v2 client); mark the confirmed ones
    verified; the errors of the others (module doc)."""
    by_producer: dict[tuple[int, int], set[Partition]] = {}
    for tp, producer in partitions.items():
        by_producer.setdefault(producer, set()).add(tp)
    refused: dict[Partition, ErrorCode] = {}
    for (producer_id, producer_epoch), tps in by_producer.items():
        answers = await _ask(broker, transactional_id, producer_id, producer_epoch, tps, add)
        backoff_ms = CONCURRENT_RETRY_BACKOFF_MS
        waited_ms = 0
        while ErrorCode.concurrent_transactions in answers.values() and waited_ms < CONCURRENT_RETRY_MAX_MS:
            # The producer's previous transaction is still completing (with
            # transactions v2 the client starts the next one as soon as
            # EndTxn answers): ask again shortly, as Kafka's
            # add.partitions.to.txn.retry.backoff.ms, before the client has to.
            await trio.sleep(backoff_ms / 1000)
            waited_ms += backoff_ms
            backoff_ms = min(2 * backoff_ms, CONCURRENT_RETRY_MAX_MS - waited_ms) or 1
            answers = await _ask(broker, transactional_id, producer_id, producer_epoch, tps, add)
        for tp in tps:
            error = answers.get(tp, ErrorCode.not_enough_replicas)
            if error == ErrorCode.none:
                if not broker.replicas.mark_txn_verified(tp[0], tp[1], producer_id, producer_epoch):
                    refused[tp] = ErrorCode.not_leader_or_follower
            elif error in _RETRIABLE:
                refused[tp] = ErrorCode.not_enough_replicas
            elif error == ErrorCode.transaction_abortable:
                refused[tp] = ErrorCode.invalid_txn_state
            else:
                refused[tp] = error
    return refused


async def _ask(broker, transactional_id: str, producer_id: int, producer_epoch: int,
               tps: set[Partition], add: bool = False) -> dict[Partition, ErrorCode]:
    retry = dict.fromkeys(tps, ErrorCode.coordinator_not_available)
    partition = coordinator_partition(broker, transactional_id)
    topic = broker.image.topic(TRANSACTION_STATE_TOPIC_NAME)
    if partition is None or topic is None or partition not in topic.partitions:
        return retry
    leader = topic.partitions[partition].leader
    if leader < 0:
        return retry
    if leader == broker.node_id:
        return await add_partitions(broker, transactional_id, producer_id, producer_epoch, frozenset(tps),
                                    verify_only=not add, check_exists=False, transaction_version=2 if add else 0)
    by_topic: dict[str, list[int]] = {}
    for name, index in sorted(tps):
        by_topic.setdefault(name, []).append(index)
    # v5 (a broker adding for a transactions v2 client) when adding, v4
    # when verifying: the version is what tells the coordinator.
    req = apt_req_v5 if add else apt_req
    request = req.AddPartitionsToTxnRequest(transactions=(req.AddPartitionsToTxnTransaction(
        transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch, verify_only=not add,
        topics=tuple(req.AddPartitionsToTxnTopic(name=name, partitions=tuple(ps))
                     for name, ps in by_topic.items())),))
    try:
        response = await broker.txn_coordinator.markers.request(leader, request, VERIFY_TIMEOUT_MS)
    except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
        _log.info("verifying %s with its coordinator (broker %d): %s", transactional_id, leader, exc)
        return retry
    if response.error_code != ErrorCode.none:
        return dict.fromkeys(tps, ErrorCode(response.error_code))
    answers: dict[Partition, ErrorCode] = {}
    for result in response.results_by_transaction:
        for topic_result in result.topic_results:
            for p in topic_result.results_by_partition:
                answers[(topic_result.name, int(p.partition_index))] = ErrorCode(p.partition_error_code)
    return answers


#: TxnOffsetCommit v4 is verified (KIP-890 part 1), v5 adds the offsets
#: partition to the transaction itself (transactions v2: the client sends
#: no AddOffsetsToTxn).
TXN_OFFSET_COMMIT_VERIFIED_VERSION = 4
TXN_OFFSET_COMMIT_V2_VERSION = 5
#: What a group client makes of a verification error: the coordinator
#: cannot answer now, so look the group coordinator up and retry (as
#: Kafka's group coordinator normalises them); the rest as they are.
_TXN_OFFSET_COMMIT_ERRORS = {ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
                             ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator}


async def verify_txn_offset_commit(broker, request) -> ErrorCode | None:
    """For TxnOffsetCommit v4+: have the transaction coordinator verify
    (v4) or add (v5) the group's `__consumer_offsets` partition for the
    producer, before the group coordinator takes the offsets; the error
    to answer every partition with, or None to go on."""
    version = request.header.api_version
    body = request.body
    add = version >= TXN_OFFSET_COMMIT_V2_VERSION
    if version < TXN_OFFSET_COMMIT_VERIFIED_VERSION or not (
            add or broker.config.txn_coordinator.transaction_partition_verification_enable):
        return None
    tp = (OFFSETS_TOPIC_NAME, offsets_partition(broker, body.group_id))
    hp = broker.replicas.partitions.get(tp)
    if hp is None or not hp.state.is_leader or hp.log.producer_state is None:
        return None  # not the group's coordinator here: the group coordinator answers
    if not hp.log.producer_state.needs_verification(body.producer_id, body.producer_epoch):
        return None
    refused = await verify(broker, body.transactional_id, {tp: (body.producer_id, body.producer_epoch)}, add)
    if tp not in refused:
        return None
    return _TXN_OFFSET_COMMIT_ERRORS.get(refused[tp], refused[tp])


async def handle_txn_offset_commit(broker, ctx, request):
    """TxnOffsetCommit: verified or added (above), then the group coordinator's."""
    error = await verify_txn_offset_commit(broker, request)
    if error is not None:
        return txn_offset_commit_response(response_module(request.header), (
            (t.name, ((p.partition_index, error) for p in t.partitions)) for t in request.body.topics))
    return await handle_group_request(broker, ctx, request)
