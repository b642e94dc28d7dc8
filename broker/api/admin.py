"""Admin requests forwarded to the controller, and InitProducerId.

Theory of operation
-------------------
CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs and
IncrementalAlterConfigs are decided by the active controller (AlterConfigs,
the older whole-set form, goes as the IncrementalAlterConfigs that makes
the given set the whole set). The broker
converts the client's request to the version the controller speaks
(`controller_channel.CONTROLLER_VERSIONS`, `kio_util.convert`), sends it
through the `ControllerChannel`, and converts the answer back.

A client that creates a topic and then produces to it must find it here:
so before answering a change, the broker waits until its own metadata
image shows it (the created topics with all their partitions, the deleted
ones gone, the new partition counts, the new config values), bounded by
the request's timeout. The controller's answer is returned either way: the
change is committed, only this broker's view lags.

ElectLeaders (KIP-460), AlterPartitionReassignments and
ListPartitionReassignments (KIP-455) are forwarded the same way. An
election's answer waits until this broker's image shows the elected
leaders, so a client's next Metadata sees them; a started reassignment
until the image shows the target replicas (the switch happens later, once
they are in sync). Clients older than ElectLeaders v1 only ask for a
preferred election.

InitProducerId (non-transactional, for idempotent producers): producer ids
come from blocks the controller allocates to this broker
(AllocateProducerIds, KIP-730); a new id per request, epoch 0, as Kafka's
broker does without a transactional id. The transaction coordinator
(`broker.api.txn`) takes its producer ids from the same blocks
(`next_producer_id`).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable

import trio
from kio.schema.allocate_producer_ids.v0.request import AllocateProducerIdsRequest
from kio.schema.alter_partition_reassignments.v0.request import AlterPartitionReassignmentsRequest
from kio.schema.create_partitions.v3.request import CreatePartitionsRequest
from kio.schema.create_topics.v7.request import CreateTopicsRequest
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import IncrementalAlterConfigsRequest
from kio.schema.list_partition_reassignments.v0.request import ListPartitionReassignmentsRequest
from kio.schema.unregister_broker.v0.request import UnregisterBrokerRequest

from broker.api import configs
from broker.shell.controller_channel import ControllerUnavailableError, ask
from broker.api.kio_util import build, convert, response_class, response_module
from quorum.metadata import MetadataImage
from common.security.acl import Operation, ResourceType
from quorum.metadata.image import ConfigResource
from common.wire import ConnectionFailedError

_NO_THROTTLE = datetime.timedelta(0)
_PREFERRED = 0
_SET, _DELETE = 0, 1
#: Topic and broker configs: the resource types kept in the metadata image.
_TOPIC_RESOURCE = 2
_IMAGE_RESOURCES = (2, 4)

_log = logging.getLogger("broker.admin")


async def _forward(broker, request, target_cls):
    """The controller's answer to `request` (converted both ways), or None."""
    answer = await ask(broker.controller, convert(request.body, target_cls))
    return None if answer is None else convert(answer, response_class(request.header))


def _deadline(body) -> float:
    timeout = getattr(body, "timeout", None)
    seconds = 30.0 if timeout is None else max(0.0, timeout.total_seconds())
    return trio.current_time() + seconds


async def _settle(broker, predicate: Callable[[MetadataImage], bool], deadline: float, what: str) -> None:
    if not await broker.wait_for_image(predicate, deadline):
        _log.info("%s: committed by the controller but not in this broker's image before the timeout", what)


# --- CreateTopics --------------------------------------------------------


async def handle_create_topics(broker, ctx, request):
    body = request.body
    denied = [t.name for t in body.topics if not broker.authorizer.can_create(ctx, t.name)]
    if denied:
        # CREATE on the cluster or the topic; the others are created (Kafka answers per topic).
        mod = response_module(request.header)
        refusals = tuple(build(mod.CreatableTopicResult, name=n, topic_id=None,
                               error_code=ErrorCode.topic_authorization_failed,
                               error_message="CREATE on the cluster or the topic is needed", num_partitions=-1,
                               replication_factor=-1, configs=()) for n in denied)
        allowed = tuple(t for t in body.topics if t.name not in denied)
        if not allowed:
            return build(mod.CreateTopicsResponse, throttle_time=_NO_THROTTLE, topics=refusals)
        request = request._replace(body=dataclasses.replace(body, topics=allowed))
        response = await handle_create_topics(broker, ctx, request)
        return dataclasses.replace(response, topics=tuple(response.topics) + refusals)
    response = await _forward(broker, request, CreateTopicsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.CreateTopicsResponse, throttle_time=_NO_THROTTLE, topics=tuple(
            build(mod.CreatableTopicResult, name=t.name, topic_id=None, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer", num_partitions=-1, replication_factor=-1,
                  configs=()) for t in body.topics))
    if not body.validate_only:
        wanted = {t.name: t for t in body.topics}
        created = {r.name: _expected_partitions(r, wanted.get(r.name), broker)
                   for r in response.topics if r.error_code == ErrorCode.none}

        def shown(image: MetadataImage) -> bool:
            for name, count in created.items():
                topic = image.topic(name)
                if topic is None or len(topic.partitions) < count:
                    return False
            return True

        await _settle(broker, shown, _deadline(body), f"CreateTopics {sorted(created)}")
    return response


def _expected_partitions(result, requested, broker) -> int:
    count = getattr(result, "num_partitions", -1)
    if count is not None and count > 0:
        return count
    if requested is not None and requested.assignments:
        return len(requested.assignments)
    if requested is not None and requested.num_partitions > 0:
        return requested.num_partitions
    return 1


# --- DeleteTopics --------------------------------------------------------


def _refuse_delete_topics(broker, ctx, request):
    """TOPIC_AUTHORIZATION_FAILED for the topics without DELETE, the rest
    deleted; None if every topic may be deleted."""
    body = request.body
    image = broker.image
    if hasattr(body, "topic_names"):
        names = list(body.topic_names)
    else:
        names = [t.name if t.name is not None else getattr(image.topics_by_id.get(t.topic_id), "name", "")
                 for t in body.topics]
    denied = broker.authorizer.denied_topics(ctx, names, Operation.DELETE)
    if not denied:
        return None
    mod = response_module(request.header)
    refusals = tuple(build(mod.DeletableTopicResult, name=n, topic_id=None,
                           error_code=ErrorCode.topic_authorization_failed,
                           error_message="DELETE on the topic is needed") for n in names if n in denied)

    async def rest():
        if hasattr(body, "topic_names"):
            kept = dataclasses.replace(body, topic_names=tuple(n for n in names if n not in denied))
            empty = not kept.topic_names
        else:
            kept = dataclasses.replace(body, topics=tuple(t for t, n in zip(body.topics, names) if n not in denied))
            empty = not kept.topics
        if empty:
            return build(mod.DeleteTopicsResponse, throttle_time=_NO_THROTTLE, responses=refusals)
        response = await handle_delete_topics(broker, ctx, request._replace(body=kept))
        return dataclasses.replace(response, responses=tuple(response.responses) + refusals)

    return rest()


async def handle_delete_topics(broker, ctx, request):
    body = request.body
    if broker.authorizer.enabled:
        refused = _refuse_delete_topics(broker, ctx, request)
        if refused is not None:
            return await refused
    if hasattr(body, "topic_names"):
        forwarded = dt_req.DeleteTopicsRequest(
            topics=tuple(dt_req.DeleteTopicState(name=n, topic_id=None) for n in body.topic_names),
            timeout=body.timeout)
    else:
        forwarded = body
    try:
        answer = await broker.controller.send(convert(forwarded, dt_req.DeleteTopicsRequest))
    except (ControllerUnavailableError, ConnectionFailedError) as exc:
        _log.warning("DeleteTopics: no answer from the controller: %s", exc)
        mod = response_module(request.header)
        names = body.topic_names if hasattr(body, "topic_names") else [t.name for t in body.topics]
        return build(mod.DeleteTopicsResponse, throttle_time=_NO_THROTTLE, responses=tuple(
            build(mod.DeletableTopicResult, name=n, topic_id=None, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer") for n in names))
    response = convert(answer, response_class(request.header))
    deleted = [(r.name, getattr(r, "topic_id", None)) for r in answer.responses if r.error_code == ErrorCode.none]

    def gone(image: MetadataImage) -> bool:
        for name, topic_id in deleted:
            if topic_id is not None and topic_id.int and topic_id in image.topics_by_id:
                return False
            if topic_id is None or not topic_id.int:
                if name is not None and image.topic(name) is not None:
                    return False
        return True

    await _settle(broker, gone, _deadline(body), f"DeleteTopics {[n for n, _ in deleted]}")
    return response


# --- CreatePartitions ----------------------------------------------------


async def handle_create_partitions(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    refused = await _split_refused(
        broker, ctx, request, "topics", lambda t: t.name, Operation.ALTER,
        lambda t: build(mod.CreatePartitionsTopicResult, name=t.name, error_code=ErrorCode.topic_authorization_failed,
                        error_message="ALTER on the topic is needed"), "results", handle_create_partitions)
    if refused is not None:
        return refused
    response = await _forward(broker, request, CreatePartitionsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.CreatePartitionsResponse, throttle_time=_NO_THROTTLE, results=tuple(
            build(mod.CreatePartitionsTopicResult, name=t.name, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer") for t in body.topics))
    if not body.validate_only:
        counts = {t.name: t.count for t in body.topics}
        grown = {r.name: counts[r.name] for r in response.results
                 if r.error_code == ErrorCode.none and r.name in counts}

        def shown(image: MetadataImage) -> bool:
            for name, count in grown.items():
                topic = image.topic(name)
                if topic is None or len(topic.partitions) < count:
                    return False
            return True

        await _settle(broker, shown, _deadline(body), f"CreatePartitions {sorted(grown)}")
    return response


# --- configs -------------------------------------------------------------


async def _split_refused(broker, ctx, request, items_field: str, name_of, operation, refusal, results_field: str,
                         handler):
    """Answer the items (topics, config resources) the principal may not
    touch with `refusal(item)` and hand the rest to `handler` (Kafka answers
    per item); None when every item is allowed."""
    if not broker.authorizer.enabled:
        return None
    items = getattr(request.body, items_field) or ()
    denied = broker.authorizer.denied_topics(ctx, (n for n in map(name_of, items) if n is not None), operation)
    if not denied:
        return None
    refusals = tuple(refusal(item) for item in items if name_of(item) in denied)
    allowed = tuple(item for item in items if name_of(item) not in denied)
    if not allowed:
        return build(response_class(request.header), throttle_time=_NO_THROTTLE, **{results_field: refusals})
    response = await handler(broker, ctx, request._replace(
        body=dataclasses.replace(request.body, **{items_field: allowed})))
    return dataclasses.replace(response, **{results_field: tuple(getattr(response, results_field)) + refusals})


async def _split_cluster_refused(broker, ctx, request, operation, refusal, results_field: str, handler):
    """As `_split_refused` for the resources that are not topics (brokers,
    the every-broker default, loggers): Kafka asks `operation` on the
    cluster for them."""
    if not broker.authorizer.enabled:
        return None
    items = request.body.resources or ()
    if all(int(r.resource_type) == _TOPIC_RESOURCE for r in items) or broker.authorizer.allowed(
            ctx, operation, ResourceType.CLUSTER, "kafka-cluster"):
        return None
    refusals = tuple(refusal(r) for r in items if int(r.resource_type) != _TOPIC_RESOURCE)
    allowed = tuple(r for r in items if int(r.resource_type) == _TOPIC_RESOURCE)
    if not allowed:
        return build(response_class(request.header), throttle_time=_NO_THROTTLE, **{results_field: refusals})
    response = await handler(broker, ctx, request._replace(body=dataclasses.replace(request.body, resources=allowed)))
    return dataclasses.replace(response, **{results_field: tuple(getattr(response, results_field)) + refusals})


def _topic_resource_name(resource):
    return resource.resource_name if int(resource.resource_type) == _TOPIC_RESOURCE else None


async def handle_describe_configs(broker, ctx, request):
    mod = response_module(request.header)
    refused = await _split_refused(
        broker, ctx, request, "resources", _topic_resource_name, Operation.DESCRIBE_CONFIGS,
        lambda r: build(mod.DescribeConfigsResult, error_code=ErrorCode.topic_authorization_failed,
                        error_message="DESCRIBE_CONFIGS on the topic is needed", resource_type=r.resource_type,
                        resource_name=r.resource_name, configs=()), "results", handle_describe_configs)
    if refused is not None:
        return refused
    refused = await _split_cluster_refused(
        broker, ctx, request, Operation.DESCRIBE_CONFIGS,
        lambda r: build(mod.DescribeConfigsResult, error_code=ErrorCode.cluster_authorization_failed,
                        error_message="DESCRIBE_CONFIGS on the cluster is needed for a broker's configs",
                        resource_type=r.resource_type, resource_name=r.resource_name, configs=()),
        "results", handle_describe_configs)
    if refused is not None:
        return refused
    resources = request.body.resources or ()
    # Topics and brokers: answered here (`broker.api.configs`).
    if all(configs.is_local(r) for r in resources):
        return convert(configs.describe_locally(broker, request), response_class(request.header))
    response = await _forward(broker, request, DescribeConfigsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.DescribeConfigsResponse, throttle_time=_NO_THROTTLE, results=tuple(
            build(mod.DescribeConfigsResult, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer", resource_type=r.resource_type,
                  resource_name=r.resource_name, configs=()) for r in request.body.resources or ()))
    return response


async def _alter_configs_refused(broker, ctx, request, mod, handler):
    """The answer to an (Incremental)AlterConfigs some of whose resources
    the principal may not alter: ALTER_CONFIGS on each topic, and on the
    cluster for brokers; None when every resource is allowed."""
    refused = await _split_refused(
        broker, ctx, request, "resources", _topic_resource_name, Operation.ALTER_CONFIGS,
        lambda r: build(mod.AlterConfigsResourceResponse, error_code=ErrorCode.topic_authorization_failed,
                        error_message="ALTER_CONFIGS on the topic is needed", resource_type=r.resource_type,
                        resource_name=r.resource_name), "responses", handler)
    if refused is not None:
        return refused
    return await _split_cluster_refused(
        broker, ctx, request, Operation.ALTER_CONFIGS,
        lambda r: build(mod.AlterConfigsResourceResponse, error_code=ErrorCode.cluster_authorization_failed,
                        error_message="ALTER_CONFIGS on the cluster is needed for a broker's configs",
                        resource_type=r.resource_type, resource_name=r.resource_name),
        "responses", handler)


async def handle_incremental_alter_configs(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    refused = await _alter_configs_refused(broker, ctx, request, mod, handle_incremental_alter_configs)
    if refused is not None:
        return refused
    response = await _forward(broker, request, IncrementalAlterConfigsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.IncrementalAlterConfigsResponse, throttle_time=_NO_THROTTLE, responses=tuple(
            build(mod.AlterConfigsResourceResponse, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer", resource_type=r.resource_type,
                  resource_name=r.resource_name) for r in body.resources))
    if not body.validate_only:
        await _settle_configs(broker, body.resources, response.responses, "IncrementalAlterConfigs")
    return response


async def _settle_configs(broker, resources, responses, what: str) -> None:
    """Wait until this broker's image shows the SETs and DELETEs of the
    resources (topics, brokers) the controller accepted."""
    ok = {(int(r.resource_type), r.resource_name) for r in responses if r.error_code == ErrorCode.none}
    changes = [(int(r.resource_type), r.resource_name, c.name, int(c.config_operation), c.value)
               for r in resources
               if (int(r.resource_type), r.resource_name) in ok and int(r.resource_type) in _IMAGE_RESOURCES
               for c in r.configs if int(c.config_operation) in (_SET, _DELETE)]

    def shown(image: MetadataImage) -> bool:
        for rtype, name, key, op, value in changes:
            current = image.configs.get(ConfigResource(rtype, name), {}).get(key)
            if (op == _SET and current != value) or (op == _DELETE and current is not None):
                return False
        return True

    await _settle(broker, shown, trio.current_time() + 30.0, what)


# --- ElectLeaders ---------------------------------------------------------


async def handle_elect_leaders(broker, ctx, request):
    body = request.body
    election_type = int(getattr(body, "election_type", _PREFERRED))
    forwarded = el_req.ElectLeadersRequest(
        election_type=election_type, timeout=body.timeout,
        topic_partitions=None if body.topic_partitions is None else tuple(
            el_req.TopicPartitions(topic=tp.topic, partitions=tuple(tp.partitions)) for tp in body.topic_partitions))
    mod = response_module(request.header)
    try:
        answer = await broker.controller.send(forwarded)
    except (ControllerUnavailableError, ConnectionFailedError) as exc:
        _log.warning("ElectLeaders: no answer from the controller: %s", exc)
        return build(mod.ElectLeadersResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.request_timed_out,
                     replica_election_results=tuple(
                         build(mod.ReplicaElectionResult, topic=tp.topic, partition_result=tuple(
                             build(mod.PartitionResult, partition_id=p, error_code=ErrorCode.request_timed_out,
                                   error_message="the controller did not answer") for p in tp.partitions))
                         for tp in body.topic_partitions or ()))
    elected = [(r.topic, p.partition_id) for r in answer.replica_election_results for p in r.partition_result
               if p.error_code == ErrorCode.none]

    def shown(image: MetadataImage) -> bool:
        for name, index in elected:
            topic = image.topic(name)
            partition = topic.partitions.get(index) if topic is not None else None
            if partition is None:
                continue  # deleted meanwhile
            if election_type == _PREFERRED and partition.leader != partition.replicas[0]:
                return False
            if partition.leader < 0:
                return False
        return True

    if elected:
        await _settle(broker, shown, _deadline(body), f"ElectLeaders {elected[:5]}")
    return convert(answer, response_class(request.header))


# --- partition reassignment ------------------------------------------------


async def handle_alter_partition_reassignments(broker, ctx, request):
    body = request.body
    response = await _forward(broker, request, AlterPartitionReassignmentsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.AlterPartitionReassignmentsResponse, throttle_time=_NO_THROTTLE,
                     error_code=ErrorCode.request_timed_out, error_message="the controller did not answer",
                     responses=())
    ok = {(t.name, p.partition_index) for t in response.responses for p in t.partitions
          if p.error_code == ErrorCode.none}
    targets = [(t.name, p.partition_index, tuple(p.replicas)) for t in body.topics for p in t.partitions
               if p.replicas is not None and (t.name, p.partition_index) in ok]

    def shown(image: MetadataImage) -> bool:
        for name, index, replicas in targets:
            topic = image.topic(name)
            partition = topic.partitions.get(index) if topic is not None else None
            if partition is not None and not set(replicas) <= set(partition.replicas):
                return False
        return True

    if targets:
        await _settle(broker, shown, _deadline(body), "AlterPartitionReassignments")
    return response


async def handle_list_partition_reassignments(broker, ctx, request):
    response = await _forward(broker, request, ListPartitionReassignmentsRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.ListPartitionReassignmentsResponse, throttle_time=_NO_THROTTLE,
                     error_code=ErrorCode.request_timed_out, error_message="the controller did not answer",
                     topics=())
    return response


# --- InitProducerId ------------------------------------------------------


class ProducerIdBlock:
    """The producer ids this broker may hand out: [next_id, end)."""

    def __init__(self) -> None:
        self.next_id = 0
        self.end = 0
        self.lock = trio.Lock()

    def take(self) -> int | None:
        if self.next_id >= self.end:
            return None
        producer_id = self.next_id
        self.next_id += 1
        return producer_id

    def refill(self, start: int, length: int) -> None:
        assert length > 0 and start >= self.end, (start, length, self.end)
        self.next_id, self.end = start, start + length


async def next_producer_id(broker) -> tuple[ErrorCode, int]:
    block: ProducerIdBlock = broker.producer_ids
    async with block.lock:
        producer_id = block.take()
        if producer_id is not None:
            return ErrorCode.none, producer_id
        registration = broker.image.brokers.get(broker.node_id)
        if registration is None:
            return ErrorCode.coordinator_not_available, -1
        try:
            answer = await broker.controller.send(AllocateProducerIdsRequest(
                broker_id=broker.node_id, broker_epoch=registration.epoch))
        except (ControllerUnavailableError, ConnectionFailedError) as exc:
            _log.warning("AllocateProducerIds: no answer from the controller: %s", exc)
            return ErrorCode.coordinator_not_available, -1
        if answer.error_code != ErrorCode.none:
            _log.warning("AllocateProducerIds refused: %s", ErrorCode(answer.error_code).name)
            return ErrorCode.coordinator_not_available, -1
        block.refill(answer.producer_id_start, answer.producer_id_len)
        _log.info("producer id block [%d, %d) allocated", block.next_id, block.end)
        return ErrorCode.none, block.take()


async def handle_init_producer_id(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    if body.transactional_id is not None:
        # The transaction coordinator (`broker.api.txn`) answers these; it
        # hands only the idempotent producers' requests here.
        error, producer_id = ErrorCode.not_coordinator, -1
    else:
        error, producer_id = await next_producer_id(broker)
    return build(mod.InitProducerIdResponse, throttle_time=_NO_THROTTLE, error_code=error,
                 producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1)


# --- UnregisterBroker ----------------------------------------------------


async def handle_unregister_broker(broker, ctx, request):
    """Forwarded to the active controller, which removes the broker's
    registration (moving its leaderships first), for a broker that is gone
    for good, as `kafka-cluster unregister` asks any broker to."""
    response = await _forward(broker, request, UnregisterBrokerRequest)
    if response is None:
        mod = response_module(request.header)
        return build(mod.UnregisterBrokerResponse, throttle_time=_NO_THROTTLE,
                     error_code=ErrorCode.request_timed_out, error_message="the controller did not answer")
    return response


async def handle_alter_configs(broker, ctx, request):
    """AlterConfigs (the whole-set form, `broker.api.configs`), with the
    same authorization as IncrementalAlterConfigs."""
    mod = response_module(request.header)
    refused = await _alter_configs_refused(broker, ctx, request, mod, handle_alter_configs)
    if refused is not None:
        return refused
    return await configs.handle_alter_configs(broker, ctx, request)
