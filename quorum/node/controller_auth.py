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

Pure: `denial` judges one request against the ACLs it is given.
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


def denial(config: AuthorizerConfig, acls: Iterable[AclBinding], principal: str, host: str,
           body: Any) -> Denial | None:
    """None if `principal` may send `body` here; else Kafka's error and what is missing."""
    acls = tuple(acls)

    def allowed(operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return authorize(config, acls, principal, host, operation, resource_type, name)

    if allowed(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER):
        return None
    kind = type(body).__name__
    cluster_failed = ErrorCode.cluster_authorization_failed
    if kind in _CLUSTER_OPERATION:
        operation = _CLUSTER_OPERATION[kind]
        if allowed(operation, ResourceType.CLUSTER, CLUSTER):
            return None
        return Denial(cluster_failed, operation, CLUSTER_RESOURCE)
    if kind in _TOPIC_OPERATION:
        operation = _TOPIC_OPERATION[kind]
        if operation is Operation.CREATE and allowed(operation, ResourceType.CLUSTER, CLUSTER):
            return None
        for topic in body.topics:
            name = getattr(topic, "name", None)
            if name is None or not allowed(operation, ResourceType.TOPIC, name):
                return Denial(ErrorCode.topic_authorization_failed, operation,
                              f"TOPIC:LITERAL:{name or topic.topic_id}")
        return None
    if kind in _CONFIG_OPERATION:
        operation = _CONFIG_OPERATION[kind]
        for resource in body.resources:
            if int(resource.resource_type) == TOPIC_CONFIG:
                if not allowed(operation, ResourceType.TOPIC, resource.resource_name):
                    return Denial(ErrorCode.topic_authorization_failed, operation,
                                  f"TOPIC:LITERAL:{resource.resource_name}")
            elif not allowed(operation, ResourceType.CLUSTER, CLUSTER):
                return Denial(cluster_failed, operation, CLUSTER_RESOURCE)
        return None
    # Raft RPCs and the brokers' own requests: ClusterAction only.
    return Denial(cluster_failed, Operation.CLUSTER_ACTION, CLUSTER_RESOURCE)
