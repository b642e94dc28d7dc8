"""What a request on the controller listener must be allowed to do, with an
authorizer configured (Kafka's ControllerApis checks).

A principal with CLUSTER_ACTION on the cluster (brokers and voters; a
broker forwards admin requests it has already checked against the client's
own principal) may send everything. Anyone else, e.g. an admin client
connected straight to the controller listener (`--bootstrap-controller`),
needs each request's own operation, and gets Kafka's error when it lacks it:

| request | needs | error |
|---|---|---|
| Raft RPCs, BrokerRegistration, BrokerHeartbeat, AlterPartition, AllocateProducerIds | ClusterAction on the cluster | CLUSTER_AUTHORIZATION_FAILED |
| DescribeQuorum, ListPartitionReassignments | Describe on the cluster | CLUSTER_AUTHORIZATION_FAILED |
| UnregisterBroker, ElectLeaders, AlterPartitionReassignments, AlterUserScramCredentials, CreateAcls, DeleteAcls | Alter on the cluster | CLUSTER_AUTHORIZATION_FAILED |
| AlterClientQuotas | AlterConfigs on the cluster | CLUSTER_AUTHORIZATION_FAILED |
| CreateTopics | Create on the cluster or on each topic | TOPIC_AUTHORIZATION_FAILED |
| DeleteTopics | Delete on each topic | TOPIC_AUTHORIZATION_FAILED |
| CreatePartitions | Alter on each topic | TOPIC_AUTHORIZATION_FAILED |
| DescribeConfigs / IncrementalAlterConfigs | DescribeConfigs / AlterConfigs on each topic, or on the cluster for a broker or broker-logger resource | TOPIC_ / CLUSTER_AUTHORIZATION_FAILED |

An item-level request (topics, config resources) is answered item by item,
as Kafka does: the allowed items are served, the others carry the error.

Pure: `judge` judges one request against the ACLs it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from common.security.acl import AclBinding, AuthorizerConfig, Operation, ResourceType, authorize

CLUSTER = "kafka-cluster"
CLUSTER_RESOURCE = f"CLUSTER:LITERAL:{CLUSTER}"
#: ConfigResource types (Kafka's ConfigResource.Type ids).
TOPIC_CONFIG = 2

_CLUSTER_OPERATION = {
    "DescribeQuorumRequest": Operation.DESCRIBE,
    "ListPartitionReassignmentsRequest": Operation.DESCRIBE,
    "UnregisterBrokerRequest": Operation.ALTER,
    "ElectLeadersRequest": Operation.ALTER,
    "AlterPartitionReassignmentsRequest": Operation.ALTER,
    "AlterUserScramCredentialsRequest": Operation.ALTER,
    "CreateAclsRequest": Operation.ALTER,
    "DeleteAclsRequest": Operation.ALTER,
    "AlterClientQuotasRequest": Operation.ALTER_CONFIGS,
    "AddRaftVoterRequest": Operation.ALTER,
    "RemoveRaftVoterRequest": Operation.ALTER,
}
_TOPIC_OPERATION = {
    "CreateTopicsRequest": Operation.CREATE,
    "DeleteTopicsRequest": Operation.DELETE,
    "CreatePartitionsRequest": Operation.ALTER,
}
_CONFIG_OPERATION = {
    "DescribeConfigsRequest": Operation.DESCRIBE_CONFIGS,
    "IncrementalAlterConfigsRequest": Operation.ALTER_CONFIGS,
}


class Denial(NamedTuple):
    error: ErrorCode
    operation: Operation
    #: As Kafka's authorizer log names it: `CLUSTER:LITERAL:kafka-cluster`, `TOPIC:LITERAL:orders`.
    resource: str

    @property
    def message(self) -> str:
        return f"needs {self.operation.name} on {self.resource}"


#: Item-level requests: the field of their items, and of their response's results.
ITEM_FIELDS = {
    "CreateTopicsRequest": ("topics", "topics"),
    "DeleteTopicsRequest": ("topics", "responses"),
    "CreatePartitionsRequest": ("topics", "results"),
    "DescribeConfigsRequest": ("resources", "results"),
    "IncrementalAlterConfigsRequest": ("resources", "responses"),
}


class Judgement(NamedTuple):
    #: The whole request refused (a cluster-level API).
    whole: Denial | None = None
    #: An item-level request: each item's denial (None: allowed), in request order.
    items: tuple[Denial | None, ...] | None = None


def judge(config: AuthorizerConfig, acls: Iterable[AclBinding], principal: str, host: str,
          body: Any) -> Judgement:
    """What `principal` may not do of `body` here (an empty Judgement: everything is allowed)."""
    acls = tuple(acls)

    def allowed(operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return authorize(config, acls, principal, host, operation, resource_type, name)

    if allowed(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER):
        return Judgement()
    kind = type(body).__name__
    cluster_failed = ErrorCode.cluster_authorization_failed
    if kind in _CLUSTER_OPERATION:
        operation = _CLUSTER_OPERATION[kind]
        if allowed(operation, ResourceType.CLUSTER, CLUSTER):
            return Judgement()
        return Judgement(Denial(cluster_failed, operation, CLUSTER_RESOURCE))
    if kind in _TOPIC_OPERATION:
        operation = _TOPIC_OPERATION[kind]
        if operation is Operation.CREATE and allowed(operation, ResourceType.CLUSTER, CLUSTER):
            return Judgement()

        def topic_denial(topic: Any) -> Denial | None:
            name = getattr(topic, "name", None)
            if name is not None and allowed(operation, ResourceType.TOPIC, name):
                return None
            return Denial(ErrorCode.topic_authorization_failed, operation, f"TOPIC:LITERAL:{name or topic.topic_id}")

        return Judgement(items=tuple(topic_denial(t) for t in body.topics))
    if kind in _CONFIG_OPERATION:
        operation = _CONFIG_OPERATION[kind]

        def config_denial(resource: Any) -> Denial | None:
            if int(resource.resource_type) == TOPIC_CONFIG:
                if allowed(operation, ResourceType.TOPIC, resource.resource_name):
                    return None
                return Denial(ErrorCode.topic_authorization_failed, operation,
                              f"TOPIC:LITERAL:{resource.resource_name}")
            if allowed(operation, ResourceType.CLUSTER, CLUSTER):
                return None
            return Denial(cluster_failed, operation, CLUSTER_RESOURCE)

        return Judgement(items=tuple(config_denial(r) for r in body.resources))
    # Raft RPCs and the brokers' own requests: ClusterAction only.
    return Judgement(Denial(cluster_failed, Operation.CLUSTER_ACTION, CLUSTER_RESOURCE))
