"""The broker's authorizer: Kafka's StandardAuthorizer rules
(`common.security.acl.authorize`) over the ACLs of this broker's image,
and the request-level checks made before a request reaches its handler.

Topic-level checks are made by the handlers, which answer per topic:
Produce (WRITE), Fetch (READ; CLUSTER_ACTION for a follower), Metadata
(DESCRIBE: topics listed only if describable; CREATE for auto-creation),
CreateTopics (CREATE on the cluster or the topic), DeleteTopics and
DeleteRecords (DELETE), ListOffsets (DESCRIBE). Here, before the handler
(`refuse`): the group APIs (READ, DESCRIBE or DELETE on the group:
GROUP_AUTHORIZATION_FAILED), FindCoordinator (DESCRIBE on the group or
transactional id), the transactional APIs (WRITE on the transactional id:
TRANSACTIONAL_ID_AUTHORIZATION_FAILED; AddPartitionsToTxn WRITE on each
topic, AddOffsetsToTxn READ on the group) and cluster operations
(CLUSTER_AUTHORIZATION_FAILED). Around the handler (`narrow`): requests
Kafka answers per part lose the refused parts before the handler and get
them back, with their error, in its answer (OffsetCommit and
TxnOffsetCommit topics, OffsetFetch groups and topics, DescribeGroups,
DeleteGroups and ConsumerGroupDescribe groups, ListGroups' listing).
A denial is logged at INFO on `kafka.authorizer.logger`, as Kafka does.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import logging
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
from broker.core.group.responses import AUTHORIZED_OPERATIONS_OMITTED
from broker.core.group.responses import error_response as group_error_response
from broker.core.group.responses import offset_fetch_groups
from common.security.acl import AuthorizerConfig, Operation, ResourceType, authorize

CLUSTER = "kafka-cluster"
_NO_THROTTLE = datetime.timedelta(0)
_log = logging.getLogger("kafka.authorizer.logger")

# Group API keys and what each needs on its group(s).
_GROUP_OPERATIONS = {
    11: Operation.READ,      # JoinGroup
    14: Operation.READ,      # SyncGroup
    12: Operation.READ,      # Heartbeat
    13: Operation.READ,      # LeaveGroup
    8: Operation.READ,       # OffsetCommit
    9: Operation.DESCRIBE,   # OffsetFetch
    47: Operation.DELETE,    # OffsetDelete
    28: Operation.READ,      # TxnOffsetCommit
    68: Operation.READ,      # ConsumerGroupHeartbeat
}
_FIND_COORDINATOR, _INIT_PRODUCER_ID = 10, 22
_OFFSET_COMMIT, _OFFSET_FETCH, _LIST_GROUPS, _DESCRIBE_GROUPS, _DELETE_GROUPS = 8, 9, 16, 15, 42
_ADD_PARTITIONS_TO_TXN, _ADD_OFFSETS_TO_TXN, _END_TXN, _TXN_OFFSET_COMMIT = 24, 25, 26, 28
_CONSUMER_GROUP_HEARTBEAT, _CONSUMER_GROUP_DESCRIBE = 68, 69
_CLUSTER_OPERATIONS = {43: Operation.ALTER, 45: Operation.ALTER, 46: Operation.DESCRIBE, 27: Operation.CLUSTER_ACTION,
                       35: Operation.DESCRIBE}


class BrokerAuthorizer:
    def __init__(self, broker, config: AuthorizerConfig) -> None:
        self.broker = broker
        self.config = config
        self.enabled = config.enabled

    def allowed(self, ctx, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if not self.enabled:
            return True
        host = ctx.peer.rsplit(":", 1)[0]
        ok = authorize(self.config, self.broker.image.acls.values(), ctx.principal, host, operation,
                       resource_type, name)
        if not ok:
            _log.info("Principal = %s is Denied operation = %s from host = %s on resource = %s:LITERAL:%s",
                      ctx.principal, operation.name, host, resource_type.name, name)
        return ok

    def denied_topics(self, ctx, names: Iterable[str], operation: Operation) -> set[str]:
        if not self.enabled:
            return set()
        return {n for n in set(names) if not self.allowed(ctx, operation, ResourceType.TOPIC, n)}

    def can_create(self, ctx, topic: str) -> bool:
        """CREATE on the cluster or on the topic (Kafka's rule for CreateTopics)."""
        return (self.allowed_quietly(ctx, Operation.CREATE, ResourceType.CLUSTER, CLUSTER)
                or self.allowed(ctx, Operation.CREATE, ResourceType.TOPIC, topic))

    def allowed_quietly(self, ctx, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if not self.enabled:
            return True
        return authorize(self.config, self.broker.image.acls.values(), ctx.principal,
                         ctx.peer.rsplit(":", 1)[0], operation, resource_type, name)

    def refuse(self, ctx, request):
        """The error answer to a request the principal may not make, or None
        (the handler goes on, making its own topic-level checks)."""
        key = request.header.api_key
        body = request.body
        if key in (_ADD_PARTITIONS_TO_TXN, _ADD_OFFSETS_TO_TXN, _END_TXN, _TXN_OFFSET_COMMIT):
            refused = self._transactional(ctx, request)
            if refused is not None:
                return refused
        operation = _GROUP_OPERATIONS.get(key)
        if key == _OFFSET_FETCH and hasattr(body, "groups"):
            return None  # v8+: answered per group (`narrow`)
        if operation is not None:
            groups = _group_ids(key, body)
            if any(not self.allowed(ctx, operation, ResourceType.GROUP, g) for g in groups):
                return group_error_response(body, ErrorCode.group_authorization_failed)
            if key == _CONSUMER_GROUP_HEARTBEAT and self.denied_topics(
                    ctx, getattr(body, "subscribed_topic_names", None) or (), Operation.DESCRIBE):
                # Kafka's rule: subscribing to a topic needs DESCRIBE on it.
                return group_error_response(body, ErrorCode.topic_authorization_failed)
            return None
        if key == _FIND_COORDINATOR:
            return self._find_coordinator(ctx, request)
        if key == _INIT_PRODUCER_ID and getattr(body, "transactional_id", None):
            if not self.allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
                mod = response_module(request.header)
                return build(mod.InitProducerIdResponse, throttle_time=_NO_THROTTLE,
                             error_code=ErrorCode.transactional_id_authorization_failed, producer_id=-1,
                             producer_epoch=-1)
            return None
        operation = _CLUSTER_OPERATIONS.get(key)
        if operation is not None and not self.allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER):
            mod = response_module(request.header)
            error = ErrorCode.cluster_authorization_failed
            message = f"{operation.name} on the cluster is needed"
            if key == 43:
                return build(mod.ElectLeadersResponse, throttle_time=_NO_THROTTLE, error_code=error,
                             replica_election_results=())
            if key == 45:
                return build(mod.AlterPartitionReassignmentsResponse, throttle_time=_NO_THROTTLE, error_code=error,
                             error_message=message, responses=())
            if key == 46:
                return build(mod.ListPartitionReassignmentsResponse, throttle_time=_NO_THROTTLE, error_code=error,
                             error_message=message, topics=())
            if key == 35:  # DescribeLogDirs: before v3 there is no error field, only no directories
                return build(mod.DescribeLogDirsResponse, throttle_time=_NO_THROTTLE, error_code=error, results=())
            if key == 27:
                return build(mod.WriteTxnMarkersResponse, markers=tuple(
                    build(mod.WritableTxnMarkerResult, producer_id=m.producer_id, topics=tuple(
                        build(mod.WritableTxnMarkerTopicResult, name=t.name, partitions=tuple(
                            build(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=error)
                            for p in t.partition_indexes)) for t in m.topics)) for m in body.markers))
        return None

    def _transactional(self, ctx, request):
        """WRITE on the transactional id for every transactional request
        (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then AddPartitionsToTxn's
        WRITE on each topic and AddOffsetsToTxn's READ on the group."""
        key, body = request.header.api_key, request.body
        mod = response_module(request.header)
        txn_id = getattr(body, "transactional_id", getattr(body, "v3_and_below_transactional_id", None))
        if key == _ADD_PARTITIONS_TO_TXN and hasattr(body, "transactions"):
            # v4+ batches from a broker verifying transactions: a cluster action.
            if self.allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER):
                return None
            return build(mod.AddPartitionsToTxnResponse, throttle_time=_NO_THROTTLE,
                         error_code=ErrorCode.cluster_authorization_failed, results_by_transaction=())
        if self.allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
            if key == _ADD_PARTITIONS_TO_TXN:
                denied = self.denied_topics(ctx, (t.name for t in body.v3_and_below_topics), Operation.WRITE)
                if denied:
                    # Kafka's answer: the denied topics' partitions fail, the others are not attempted.
                    return _add_partitions_response(mod, body, lambda name: (
                        ErrorCode.topic_authorization_failed if name in denied
                        else ErrorCode.operation_not_attempted))
            if key == _ADD_OFFSETS_TO_TXN and not self.allowed(ctx, Operation.READ, ResourceType.GROUP,
                                                                body.group_id):
                return build(mod.AddOffsetsToTxnResponse, throttle_time=_NO_THROTTLE,
                             error_code=ErrorCode.group_authorization_failed)
            return None
        error = ErrorCode.transactional_id_authorization_failed
        if key == _ADD_PARTITIONS_TO_TXN:
            return _add_partitions_response(mod, body, lambda name: error)
        if key == _ADD_OFFSETS_TO_TXN:
            return build(mod.AddOffsetsToTxnResponse, throttle_time=_NO_THROTTLE, error_code=error)
        if key == _END_TXN:
            return build(mod.EndTxnResponse, throttle_time=_NO_THROTTLE, error_code=error)
        return group_error_response(body, error)

    def narrow(self, ctx, request):
        """For requests answered per topic or per group: the request
        without the parts the principal may not touch, and a function
        that completes the handler's answer with the refused parts (Kafka
        answers each part; one refused part does not fail the request).
        None when nothing needs narrowing."""
        key, body = request.header.api_key, request.body
        mod = response_module(request.header)
        if key in (_OFFSET_COMMIT, _TXN_OFFSET_COMMIT):
            denied = self.denied_topics(ctx, (t.name for t in body.topics), Operation.READ)
            if not denied:
                return None
            prefix = "TxnOffsetCommit" if key == _TXN_OFFSET_COMMIT else "OffsetCommit"
            refused = tuple(build(getattr(mod, prefix + "ResponseTopic"), name=t.name, partitions=tuple(
                build(getattr(mod, prefix + "ResponsePartition"), partition_index=p.partition_index,
                      error_code=ErrorCode.topic_authorization_failed) for p in t.partitions))
                for t in body.topics if t.name in denied)
            narrowed = dataclasses.replace(body, topics=tuple(t for t in body.topics if t.name not in denied))
            return (request._replace(body=narrowed),
                    lambda response: dataclasses.replace(response, topics=tuple(response.topics) + refused))
        if key == _OFFSET_FETCH:
            return self._narrow_offset_fetch(ctx, request, mod)
        if key == _LIST_GROUPS:
            if self.allowed_quietly(ctx, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER):
                return None
            return request, lambda response: dataclasses.replace(response, groups=tuple(
                g for g in response.groups
                if self.allowed_quietly(ctx, Operation.DESCRIBE, ResourceType.GROUP, g.group_id)))
        if key in (_DESCRIBE_GROUPS, _DELETE_GROUPS, _CONSUMER_GROUP_DESCRIBE):
            field = {_DESCRIBE_GROUPS: "groups", _DELETE_GROUPS: "groups_names"}.get(key, "group_ids")
            operation = Operation.DELETE if key == _DELETE_GROUPS else Operation.DESCRIBE
            names = list(getattr(body, field))
            denied = [g for g in names if not self.allowed(ctx, operation, ResourceType.GROUP, g)]
            if not denied:
                return None
            error = ErrorCode.group_authorization_failed
            if key == _CONSUMER_GROUP_DESCRIBE:
                refused = tuple(build(mod.DescribedGroup, error_code=error, error_message=None, group_id=g,
                                      group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="",
                                      members=(), authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
                                for g in denied)
                result_field = "groups"
            elif key == _DESCRIBE_GROUPS:
                refused = tuple(build(mod.DescribedGroup, error_code=error, error_message=None, group_id=g,
                                      group_state="", protocol_type="", protocol_data="", members=(),
                                      authorized_operations=AUTHORIZED_OPERATIONS_OMITTED) for g in denied)
                result_field = "groups"
            else:
                refused = tuple(build(mod.DeletableGroupResult, group_id=g, error_code=error) for g in denied)
                result_field = "results"
            narrowed = dataclasses.replace(body, **{field: tuple(g for g in names if g not in denied)})
            return (request._replace(body=narrowed), lambda response: dataclasses.replace(
                response, **{result_field: tuple(getattr(response, result_field)) + refused}))
        return None

    def _narrow_offset_fetch(self, ctx, request, mod):
        body = request.body
        denied_groups: set[str] = set()
        if hasattr(body, "groups"):
            denied_groups = {g.group_id for g in body.groups
                             if not self.allowed(ctx, Operation.DESCRIBE, ResourceType.GROUP, g.group_id)}
        if denied_groups:
            narrowed = dataclasses.replace(body, groups=tuple(g for g in body.groups
                                                              if g.group_id not in denied_groups))
            request = request._replace(body=narrowed)
        requested = {g: topics for g, topics in offset_fetch_groups(body)}

        def topics_of(group_id, topics, topic_cls, partition_cls):
            # Named topics the principal may not DESCRIBE: TOPIC_AUTHORIZATION_FAILED per partition;
            # all topics asked for: those it may not describe are left out (Kafka's filter).
            named = requested.get(group_id) is not None
            out = []
            for t in topics:
                if self.allowed_quietly(ctx, Operation.DESCRIBE, ResourceType.TOPIC, t.name):
                    out.append(t)
                elif named:
                    out.append(dataclasses.replace(t, partitions=tuple(dataclasses.replace(
                        p, committed_offset=-1, metadata="", error_code=ErrorCode.topic_authorization_failed,
                        **({"committed_leader_epoch": -1} if hasattr(p, "committed_leader_epoch") else {}))
                        for p in t.partitions)))
            return tuple(out)

        def finish(response):
            if hasattr(response, "groups"):
                groups = tuple(dataclasses.replace(g, topics=topics_of(g.group_id, g.topics, None, None))
                               for g in response.groups)
                groups += tuple(build(mod.OffsetFetchResponseGroup, group_id=g, topics=(),
                                      error_code=ErrorCode.group_authorization_failed) for g in denied_groups)
                return dataclasses.replace(response, groups=groups)
            return dataclasses.replace(response, topics=topics_of(body.group_id, response.topics, None, None))

        return request, finish

    def _find_coordinator(self, ctx, request):
        body = request.body
        key_type = getattr(body, "key_type", 0)
        keys = list(getattr(body, "coordinator_keys", None) or ()) or [getattr(body, "key", "")]
        resource = ResourceType.TRANSACTIONAL_ID if key_type == 1 else ResourceType.GROUP
        denied = [k for k in keys if not self.allowed(ctx, Operation.DESCRIBE, resource, k)]
        if not denied:
            return None
        error = (ErrorCode.transactional_id_authorization_failed if key_type == 1
                 else ErrorCode.group_authorization_failed)
        mod = response_module(request.header)
        if request.header.api_version >= 4:
            return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, coordinators=tuple(
                build(mod.Coordinator, key=k, node_id=-1, host="", port=-1, error_code=error,
                      error_message=f"DESCRIBE on {resource.name} {k} is needed")
                for k in keys))
        return build(mod.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, error_code=error,
                     error_message=f"DESCRIBE on {resource.name} {keys[0]} is needed", node_id=-1, host="", port=-1)


def _add_partitions_response(mod, body, error_of):
    return build(mod.AddPartitionsToTxnResponse, throttle_time=_NO_THROTTLE, results_by_topic_v3_and_below=tuple(
        build(mod.AddPartitionsToTxnTopicResult, name=t.name, results_by_partition=tuple(
            build(mod.AddPartitionsToTxnPartitionResult, partition_index=p, partition_error_code=error_of(t.name))
            for p in t.partitions)) for t in body.v3_and_below_topics))


async def finished(ctx, request, response, finish):
    """The handler's answer (awaited when it is a coroutine's) to the
    narrowed `request`, completed by `finish`."""
    try:
        if inspect.isawaitable(response):
            response = await response
    finally:
        ctx.end_stand_in(request)
    return finish(response)


def _group_ids(key: int, body) -> list[str]:
    if key == 9:
        return [g for g, _topics in offset_fetch_groups(body)]
    if key == 15:
        return list(body.groups)
    if key == 42:
        return list(body.groups_names)
    return [body.group_id]
