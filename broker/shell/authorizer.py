"""The broker's authorizer: Kafka's StandardAuthorizer rules
(`common.security.acl.authorize`) over the ACLs of this broker's image,
and the request-level checks (groups, transactional ids, cluster
operations) made before a request reaches its handler.

Topic-level checks are made by the handlers, which answer per topic:
Produce (WRITE), Fetch (READ; CLUSTER_ACTION for a follower), Metadata
(DESCRIBE: topics listed only if describable; CREATE for auto-creation),
CreateTopics (CREATE on the cluster or the topic), DeleteTopics (DELETE),
ListOffsets (DESCRIBE). Here: the group APIs (READ, DESCRIBE or DELETE on
the group: GROUP_AUTHORIZATION_FAILED), FindCoordinator (DESCRIBE on the
group or transactional id), InitProducerId with a transactional id (WRITE:
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and cluster operations
(ElectLeaders, reassignments: CLUSTER_AUTHORIZATION_FAILED).
A denial is logged at INFO on `kafka.authorizer.logger`, as Kafka does.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, response_module
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
    15: Operation.DESCRIBE,  # DescribeGroups
    42: Operation.DELETE,    # DeleteGroups
    47: Operation.DELETE,    # OffsetDelete
    28: Operation.READ,      # TxnOffsetCommit
}
_FIND_COORDINATOR, _INIT_PRODUCER_ID = 10, 22
_CLUSTER_OPERATIONS = {43: Operation.ALTER, 45: Operation.ALTER, 46: Operation.DESCRIBE, 27: Operation.CLUSTER_ACTION}


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
        operation = _GROUP_OPERATIONS.get(key)
        if operation is not None:
            groups = _group_ids(key, body)
            if any(not self.allowed(ctx, operation, ResourceType.GROUP, g) for g in groups):
                return group_error_response(body, ErrorCode.group_authorization_failed)
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
            if key == 27:
                return build(mod.WriteTxnMarkersResponse, markers=tuple(
                    build(mod.WritableTxnMarkerResult, producer_id=m.producer_id, topics=tuple(
                        build(mod.WritableTxnMarkerTopicResult, name=t.name, partitions=tuple(
                            build(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=error)
                            for p in t.partition_indexes)) for t in m.topics)) for m in body.markers))
        return None

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


def _group_ids(key: int, body) -> list[str]:
    if key == 9:
        return [g for g, _topics in offset_fetch_groups(body)]
    if key == 15:
        return list(body.groups)
    if key == 42:
        return list(body.groups_names)
    return [body.group_id]
