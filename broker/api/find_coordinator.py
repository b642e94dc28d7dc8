"""FindCoordinator, and `__consumer_offsets` created on first use.

Theory of operation
-------------------
A group's coordinator is the leader of partition
`partition_for_group(group_id, N)` of `__consumer_offsets`, N being the
topic's partition count (`offsets.topic.num.partitions` when it was
created). FindCoordinator answers with that broker's endpoint on this
listener, or COORDINATOR_NOT_AVAILABLE while the topic, the partition's
leader or its endpoint is missing (the client retries).

The first FindCoordinator for a group, on any broker, creates the topic
through the controller, as Kafka's `AutoTopicCreationManager` does:
`offsets.topic.num.partitions` partitions, `offsets.topic.replication.factor`
replicas, compacted (`offsets_topic_configs`). As in Kafka, a replication
factor larger than the number of live brokers is not quietly lowered: the
controller refuses, the answer stays COORDINATOR_NOT_AVAILABLE, and the
log says which key to lower (a single-broker cluster needs
`offsets.topic.replication.factor=1`). While this broker's image shows
fewer unfenced brokers than that factor, the controller is not asked at
all: the answer is COORDINATOR_NOT_AVAILABLE with a message naming the
key, and the warning is logged once until the broker count changes.
Clients retry FindCoordinator several times a second, and a CreateTopics
round trip to the controller each time was a tenth of a consumer's
broker CPU. One creation is in flight per broker at a time; the answer
waits up to `metadata_wait_ms` for the new topic to reach this broker's
image.

Key type 1 (a transactional id) is answered the same way from
`__transaction_state`: the leader of partition
`partition_for_transactional_id(key, N)`, the topic created on first use
with `transaction.state.log.num.partitions` partitions,
`transaction.state.log.replication.factor` replicas and
`min.insync.replicas` = `transaction.state.log.min.isr`, compacted.

Versions: v0 (a group key), v1-v3 (key types), v4+ (KIP-699: several keys
of one type per request, one answer each).
"""

from __future__ import annotations

import datetime
import logging

import trio
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from broker.shell.controller_channel import ControllerUnavailableError
from broker.core.group import OFFSETS_TOPIC_NAME, offsets_topic_configs, partition_for_group
from broker.core.txn import TRANSACTION_STATE_TOPIC_NAME, partition_for_transactional_id
from broker.api.kio_util import build, response_module
from broker.api.metadata import live_brokers
from common.wire import ConnectionFailedError

GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE = 0, 1
FIND_COORDINATOR_MIN_VERSION, FIND_COORDINATOR_MAX_VERSION = 0, 5
_NO_THROTTLE = datetime.timedelta(0)

_log = logging.getLogger("broker.coordinator")


class Found:
    __slots__ = ("error", "message", "node_id", "host", "port")

    def __init__(self, error: ErrorCode, message: str | None = None, node_id: int = -1, host: str = "",
                 port: int = -1) -> None:
        self.error, self.message, self.node_id, self.host, self.port = error, message, node_id, host, port


async def handle_find_coordinator(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    key_type = getattr(body, "key_type", GROUP_KEY_TYPE)
    if hasattr(body, "coordinator_keys"):
        coordinators = []
        for key in body.coordinator_keys:
            found = await find_coordinator(broker, key_type, key)
            coordinators.append(build(mod.Coordinator, key=key, node_id=found.node_id, host=found.host,
                                      port=found.port, error_code=found.error, error_message=found.message))
        return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, coordinators=tuple(coordinators))
    found = await find_coordinator(broker, key_type, body.key)
    return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, error_code=found.error,
                 error_message=found.message, node_id=found.node_id, host=found.host, port=found.port)


async def find_coordinator(broker, key_type: int, key: str) -> Found:
    if key_type == TRANSACTION_KEY_TYPE:
        return await find_transaction_coordinator(broker, key)
    if key_type != GROUP_KEY_TYPE:
        return Found(ErrorCode.invalid_request, f"unknown coordinator key type {key_type}")
    if broker.image.topic(OFFSETS_TOPIC_NAME) is None:
        too_few = _too_few_brokers(broker)
        if too_few is not None:
            return Found(ErrorCode.coordinator_not_available, too_few)
        await ensure_offsets_topic(broker)
    image = broker.image
    topic = image.topic(OFFSETS_TOPIC_NAME)
    if topic is None:
        return Found(ErrorCode.coordinator_not_available, f"{OFFSETS_TOPIC_NAME} does not exist yet")
    partition = topic.partitions.get(partition_for_group(key, len(topic.partitions)))
    leader = -1 if partition is None else partition.leader
    for node_id, host, port, _rack in live_brokers(broker, image):
        if node_id == leader:
            return Found(ErrorCode.none, None, node_id, host, port)
    return Found(ErrorCode.coordinator_not_available,
                 f"the {OFFSETS_TOPIC_NAME} partition of this group has no live leader")


def _too_few_brokers(broker) -> str | None:
    """Why `__consumer_offsets` cannot be created now, if this broker's
    image shows fewer unfenced brokers than its replication factor."""
    wanted = broker.config.group_coordinator.offsets_topic_replication_factor
    # Every unfenced broker, whatever its listeners: the controller's count.
    live = sum(1 for b in broker.image.brokers.values() if not b.fenced)
    runtime = broker.coordinator
    if live >= wanted:
        runtime.offsets_topic_refused_at_brokers = None
        return None
    message = (f"{OFFSETS_TOPIC_NAME} needs offsets.topic.replication.factor={wanted} brokers and {live} "
               f"are live: lower offsets.topic.replication.factor or start more brokers")
    if runtime.offsets_topic_refused_at_brokers != live:
        runtime.offsets_topic_refused_at_brokers = live
        _log.warning("cannot create %s: %s; consumer groups are unavailable until then", OFFSETS_TOPIC_NAME,
                     message)
    return message


async def ensure_offsets_topic(broker) -> None:
    """Create `__consumer_offsets` through the controller, once at a time."""
    async with broker.coordinator.offsets_topic_lock:
        if broker.image.topic(OFFSETS_TOPIC_NAME) is not None:
            return
        group_config = broker.config.group_coordinator
        configs = offsets_topic_configs(group_config.offsets_topic_segment_bytes)
        request = ct_req.CreateTopicsRequest(
            topics=(ct_req.CreatableTopic(
                name=OFFSETS_TOPIC_NAME, num_partitions=group_config.offsets_topic_num_partitions,
                replication_factor=group_config.offsets_topic_replication_factor, assignments=(),
                configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in configs.items())),),
            timeout=datetime.timedelta(milliseconds=broker.config.metadata_wait_ms),
            validate_only=False,
        )
        try:
            response = await broker.controller.send(request)
        except (ControllerUnavailableError, ConnectionFailedError) as exc:
            _log.warning("creating %s: no answer from the controller: %s", OFFSETS_TOPIC_NAME, exc)
            return
        (result,) = response.topics
        if result.error_code == ErrorCode.invalid_replication_factor:
            _log.warning("cannot create %s: %s Lower offsets.topic.replication.factor (now %d) or start more "
                         "brokers; consumer groups are unavailable until then", OFFSETS_TOPIC_NAME,
                         result.error_message, group_config.offsets_topic_replication_factor)
            return
        if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            _log.warning("cannot create %s: %s %s", OFFSETS_TOPIC_NAME, ErrorCode(result.error_code).name,
                         result.error_message or "")
            return
        _log.info("created %s with %d partitions, replication factor %d", OFFSETS_TOPIC_NAME,
                  group_config.offsets_topic_num_partitions, group_config.offsets_topic_replication_factor)
        deadline = trio.current_time() + broker.config.metadata_wait_ms / 1000
        await broker.wait_for_image(lambda image: image.topic(OFFSETS_TOPIC_NAME) is not None, deadline)


# --- transactions ----------------------------------------------------------


async def find_transaction_coordinator(broker, transactional_id: str) -> Found:
    if not transactional_id:
        return Found(ErrorCode.invalid_request, "a transactional id must not be empty")
    if broker.image.topic(TRANSACTION_STATE_TOPIC_NAME) is None:
        too_few = _too_few_brokers_for_transactions(broker)
        if too_few is not None:
            return Found(ErrorCode.coordinator_not_available, too_few)
        await ensure_transaction_state_topic(broker)
    image = broker.image
    topic = image.topic(TRANSACTION_STATE_TOPIC_NAME)
    if topic is None:
        return Found(ErrorCode.coordinator_not_available, f"{TRANSACTION_STATE_TOPIC_NAME} does not exist yet")
    partition = topic.partitions.get(partition_for_transactional_id(transactional_id, len(topic.partitions)))
    leader = -1 if partition is None else partition.leader
    for node_id, host, port, _rack in live_brokers(broker, image):
        if node_id == leader:
            return Found(ErrorCode.none, None, node_id, host, port)
    return Found(ErrorCode.coordinator_not_available,
                 f"the {TRANSACTION_STATE_TOPIC_NAME} partition of this transactional id has no live leader")


def _too_few_brokers_for_transactions(broker) -> str | None:
    wanted = broker.config.txn_coordinator.transaction_state_log_replication_factor
    live = sum(1 for b in broker.image.brokers.values() if not b.fenced)
    runtime = broker.txn_coordinator
    if live >= wanted:
        runtime.topic_refused_at_brokers = None
        return None
    message = (f"{TRANSACTION_STATE_TOPIC_NAME} needs transaction.state.log.replication.factor={wanted} brokers "
               f"and {live} are live: lower transaction.state.log.replication.factor or start more brokers")
    if runtime.topic_refused_at_brokers != live:
        runtime.topic_refused_at_brokers = live
        _log.warning("cannot create %s: %s; transactions are unavailable until then", TRANSACTION_STATE_TOPIC_NAME,
                     message)
    return message


async def ensure_transaction_state_topic(broker) -> None:
    """Create `__transaction_state` through the controller, once at a time."""
    runtime = broker.txn_coordinator
    async with runtime.topic_lock:
        if broker.image.topic(TRANSACTION_STATE_TOPIC_NAME) is not None:
            return
        config = broker.config.txn_coordinator
        request = ct_req.CreateTopicsRequest(
            topics=(ct_req.CreatableTopic(
                name=TRANSACTION_STATE_TOPIC_NAME, num_partitions=config.transaction_state_log_num_partitions,
                replication_factor=config.transaction_state_log_replication_factor, assignments=(),
                configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v)
                              for k, v in config.topic_configs().items())),),
            timeout=datetime.timedelta(milliseconds=broker.config.metadata_wait_ms),
            validate_only=False,
        )
        try:
            response = await broker.controller.send(request)
        except (ControllerUnavailableError, ConnectionFailedError) as exc:
            _log.warning("creating %s: no answer from the controller: %s", TRANSACTION_STATE_TOPIC_NAME, exc)
            return
        (result,) = response.topics
        if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            _log.warning("cannot create %s: %s %s (transaction.state.log.replication.factor=%d)",
                         TRANSACTION_STATE_TOPIC_NAME, ErrorCode(result.error_code).name,
                         result.error_message or "", config.transaction_state_log_replication_factor)
            return
        _log.info("created %s with %d partitions, replication factor %d", TRANSACTION_STATE_TOPIC_NAME,
                  config.transaction_state_log_num_partitions, config.transaction_state_log_replication_factor)
        deadline = trio.current_time() + broker.config.metadata_wait_ms / 1000
        await broker.wait_for_image(lambda image: image.topic(TRANSACTION_STATE_TOPIC_NAME) is not None, deadline)
