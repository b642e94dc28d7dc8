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

import dataclasses
import datetime
import logging
from collections.abc import Callable
from typing import Any

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
            found = await find_coordinator(broker, key_type, key, ctx.listener_name)
            coordinators.append(build(mod.Coordinator, key=key, node_id=found.node_id, host=found.host,
                                      port=found.port, error_code=found.error, error_message=found.message))
        return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, coordinators=tuple(coordinators))
    found = await find_coordinator(broker, key_type, body.key, ctx.listener_name)
    return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, error_code=found.error,
                 error_message=found.message, node_id=found.node_id, host=found.host, port=found.port)


@dataclasses.dataclass(frozen=True)
class InternalTopic:
    """The internal topic a coordinator keeps its state in, and how it is
    created on first use."""

    name: str
    #: The coordinator's runtime (`broker.shell.shard_host.ShardHost`).
    runtime: Any
    num_partitions: int
    replication_factor: int
    #: The broker config that sets `replication_factor`, named in errors.
    replication_factor_key: str
    configs: dict[str, str]
    #: key, partition count -> the partition that coordinates the key.
    partition_for: Callable[[str, int], int]
    #: What a key is, and what is unavailable without the topic (for messages).
    key_name: str
    serves: str


def _offsets_topic(broker) -> InternalTopic:
    config = broker.config.group_coordinator
    return InternalTopic(OFFSETS_TOPIC_NAME, broker.coordinator, config.offsets_topic_num_partitions,
                         config.offsets_topic_replication_factor, "offsets.topic.replication.factor",
                         offsets_topic_configs(config.offsets_topic_segment_bytes), partition_for_group,
                         "group", "consumer groups")


def _transaction_state_topic(broker) -> InternalTopic:
    config = broker.config.txn_coordinator
    return InternalTopic(TRANSACTION_STATE_TOPIC_NAME, broker.txn_coordinator,
                         config.transaction_state_log_num_partitions,
                         config.transaction_state_log_replication_factor, "transaction.state.log.replication.factor",
                         config.topic_configs(), partition_for_transactional_id, "transactional id", "transactions")


async def find_coordinator(broker, key_type: int, key: str, listener_name: str = "") -> Found:
    if key_type == TRANSACTION_KEY_TYPE:
        if not key:
            return Found(ErrorCode.invalid_request, "a transactional id must not be empty")
        internal = _transaction_state_topic(broker)
    elif key_type == GROUP_KEY_TYPE:
        internal = _offsets_topic(broker)
    else:
        return Found(ErrorCode.invalid_request, f"unknown coordinator key type {key_type}")
    name = internal.name
    if broker.image.topic(name) is None:
        too_few = _too_few_brokers(broker, internal)
        if too_few is not None:
            return Found(ErrorCode.coordinator_not_available, too_few)
        await ensure_internal_topic(broker, internal)
    image = broker.image
    topic = image.topic(name)
    if topic is None:
        return Found(ErrorCode.coordinator_not_available, f"{name} does not exist yet")
    partition = topic.partitions.get(internal.partition_for(key, len(topic.partitions)))
    leader = -1 if partition is None else partition.leader
    for node_id, host, port, _rack in live_brokers(broker, image, listener_name):
        if node_id == leader:
            return Found(ErrorCode.none, None, node_id, host, port)
    return Found(ErrorCode.coordinator_not_available,
                 f"the {name} partition of this {internal.key_name} has no live leader")


def _too_few_brokers(broker, internal: InternalTopic) -> str | None:
    """Why the topic cannot be created now, if this broker's image shows
    fewer unfenced brokers than its replication factor."""
    wanted = internal.replication_factor
    # Every unfenced broker, whatever its listeners: the controller's count.
    live = sum(1 for b in broker.image.brokers.values() if not b.fenced)
    runtime = internal.runtime
    if live >= wanted:
        runtime.topic_refused_at_brokers = None
        return None
    key = internal.replication_factor_key
    message = f"{internal.name} needs {key}={wanted} brokers and {live} are live: lower {key} or start more brokers"
    if runtime.topic_refused_at_brokers != live:
        runtime.topic_refused_at_brokers = live
        _log.warning("cannot create %s: %s; %s are unavailable until then", internal.name, message, internal.serves)
    return message


async def ensure_internal_topic(broker, internal: InternalTopic) -> None:
    """Create the topic through the controller, once at a time."""
    name = internal.name
    async with internal.runtime.topic_lock:
        if broker.image.topic(name) is not None:
            return
        request = ct_req.CreateTopicsRequest(
            topics=(ct_req.CreatableTopic(
                name=name, num_partitions=internal.num_partitions,
                replication_factor=internal.replication_factor, assignments=(),
                configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in internal.configs.items())),),
            timeout=datetime.timedelta(milliseconds=broker.config.metadata_wait_ms),
            validate_only=False,
        )
        try:
            response = await broker.controller.send(request)
        except (ControllerUnavailableError, ConnectionFailedError) as exc:
            _log.warning("creating %s: no answer from the controller: %s", name, exc)
            return
        (result,) = response.topics
        if result.error_code == ErrorCode.invalid_replication_factor:
            _log.warning("cannot create %s: %s Lower %s (now %d) or start more brokers; %s are unavailable until "
                         "then", name, result.error_message, internal.replication_factor_key,
                         internal.replication_factor, internal.serves)
            return
        if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            _log.warning("cannot create %s: %s %s (%s=%d)", name, ErrorCode(result.error_code).name,
                         result.error_message or "", internal.replication_factor_key, internal.replication_factor)
            return
        _log.info("created %s with %d partitions, replication factor %d", name, internal.num_partitions,
                  internal.replication_factor)
        deadline = trio.current_time() + broker.config.metadata_wait_ms / 1000
        await broker.wait_for_image(lambda image: image.topic(name) is not None, deadline)
