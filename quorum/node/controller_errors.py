"""Error answers to controller requests, in each API's own shape.

A node that is not the active controller answers every controller API
with NOT_CONTROLLER (Kafka's code 41), so the sender (a broker, a tool)
looks for the active controller and retries there; a request that could
not be completed in time gets REQUEST_TIMED_OUT. Item-level APIs (topics,
config resources) carry the error on every item, as Kafka's controller
does; the others at the top level.
"""

from __future__ import annotations

from typing import Any

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest, AllocateProducerIdsResponse
from kio.schema.alter_partition.v3 import AlterPartitionRequest, AlterPartitionResponse
from kio.schema.assign_replicas_to_dirs.v0 import AssignReplicasToDirsRequest, AssignReplicasToDirsResponse
from kio.schema.alter_partition_reassignments.v0 import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
)
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest, BrokerRegistrationResponse
from kio.schema.create_partitions.v3 import CreatePartitionsRequest
from kio.schema.create_partitions.v3 import response as cp_resp
from kio.schema.create_topics.v7 import CreateTopicsRequest
from kio.schema.create_topics.v7 import response as ct_resp
from kio.schema.delete_topics.v6 import DeleteTopicsRequest
from kio.schema.delete_topics.v6 import response as dt_resp
from kio.schema.describe_configs.v4 import DescribeConfigsRequest
from kio.schema.describe_configs.v4 import response as dc_resp
from kio.schema.elect_leaders.v2 import ElectLeadersRequest, ElectLeadersResponse
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import IncrementalAlterConfigsRequest
from kio.schema.incremental_alter_configs.v1 import response as iac_resp
from kio.schema.list_partition_reassignments.v0 import (
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest, UnregisterBrokerResponse

from quorum.controller.result import NO_THROTTLE
from quorum.controller.topic_control import ZERO_UUID
from kio.schema.alter_user_scram_credentials.v0 import response as ausc_resp
from kio.schema.alter_user_scram_credentials.v0.request import AlterUserScramCredentialsRequest
from kio.schema.create_acls.v3 import response as ca_resp
from kio.schema.alter_client_quotas.v1 import response as acq_resp
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest
from kio.schema.create_acls.v3.request import CreateAclsRequest
from kio.schema.delete_acls.v3 import response as da_resp
from kio.schema.delete_acls.v3.request import DeleteAclsRequest


def error_response(request: Any, error: ErrorCode, message: str | None = None) -> Any:
    """`request`'s response type with `error` everywhere an error goes."""
    t = NO_THROTTLE
    if isinstance(request, CreateTopicsRequest):
        return ct_resp.CreateTopicsResponse(throttle_time=t, topics=tuple(
            ct_resp.CreatableTopicResult(name=x.name, topic_id=ZERO_UUID, error_code=error, error_message=message,
                                         num_partitions=-1, replication_factor=-1, configs=None)
            for x in request.topics))
    if isinstance(request, DeleteTopicsRequest):
        return dt_resp.DeleteTopicsResponse(throttle_time=t, responses=tuple(
            dt_resp.DeletableTopicResult(name=x.name, topic_id=x.topic_id, error_code=error, error_message=message)
            for x in request.topics))
    if isinstance(request, CreatePartitionsRequest):
        return cp_resp.CreatePartitionsResponse(throttle_time=t, results=tuple(
            cp_resp.CreatePartitionsTopicResult(name=x.name, error_code=error, error_message=message)
            for x in request.topics))
    if isinstance(request, DescribeConfigsRequest):
        return dc_resp.DescribeConfigsResponse(throttle_time=t, results=tuple(
            dc_resp.DescribeConfigsResult(error_code=error, error_message=message, resource_type=x.resource_type,
                                          resource_name=x.resource_name, configs=())
            for x in request.resources))
    if isinstance(request, IncrementalAlterConfigsRequest):
        return iac_resp.IncrementalAlterConfigsResponse(throttle_time=t, responses=tuple(
            iac_resp.AlterConfigsResourceResponse(error_code=error, error_message=message,
                                                  resource_type=x.resource_type, resource_name=x.resource_name)
            for x in request.resources))
    if isinstance(request, BrokerRegistrationRequest):
        return BrokerRegistrationResponse(throttle_time=t, error_code=error)
    if isinstance(request, BrokerHeartbeatRequest):
        return BrokerHeartbeatResponse(throttle_time=t, error_code=error, should_shut_down=False)
    if isinstance(request, UnregisterBrokerRequest):
        return UnregisterBrokerResponse(throttle_time=t, error_code=error, error_message=message)
    if isinstance(request, AlterPartitionRequest):
        return AlterPartitionResponse(throttle_time=t, error_code=error, topics=())
    if isinstance(request, AssignReplicasToDirsRequest):
        return AssignReplicasToDirsResponse(throttle_time=t, error_code=error, directories=())
    if isinstance(request, AllocateProducerIdsRequest):
        return AllocateProducerIdsResponse(throttle_time=t, error_code=error, producer_id_start=-1, producer_id_len=0)
    if isinstance(request, ElectLeadersRequest):
        return ElectLeadersResponse(throttle_time=t, error_code=error, replica_election_results=())
    if isinstance(request, AlterPartitionReassignmentsRequest):
        return AlterPartitionReassignmentsResponse(throttle_time=t, error_code=error, error_message=message,
                                                   responses=())
    if isinstance(request, ListPartitionReassignmentsRequest):
        return ListPartitionReassignmentsResponse(throttle_time=t, error_code=error, error_message=message,
                                                  topics=())
    if isinstance(request, AlterClientQuotasRequest):
        return acq_resp.AlterClientQuotasResponse(throttle_time=t, entries=tuple(
            acq_resp.EntryData(error_code=error, error_message=message, entity=tuple(
                acq_resp.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in x.entity))
            for x in request.entries))
    if isinstance(request, AlterUserScramCredentialsRequest):
        return ausc_resp.AlterUserScramCredentialsResponse(throttle_time=t, results=tuple(
            ausc_resp.AlterUserScramCredentialsResult(user=x.name, error_code=error, error_message=message)
            for x in (*request.deletions, *request.upsertions)))
    if isinstance(request, CreateAclsRequest):
        return ca_resp.CreateAclsResponse(throttle_time=t, results=tuple(
            ca_resp.AclCreationResult(error_code=error, error_message=message) for _ in request.creations))
    if isinstance(request, DeleteAclsRequest):
        return da_resp.DeleteAclsResponse(throttle_time=t, filter_results=tuple(
            da_resp.DeleteAclsFilterResult(error_code=error, error_message=message, matching_acls=())
            for _ in request.filters))
    raise TypeError(f"no controller error response for {type(request).__name__}")


def response_errors(response: Any) -> set[int]:
    """Every error code in a controller response (top level and per item)."""
    codes: set[int] = set()
    code = getattr(response, "error_code", None)
    if code is not None:
        codes.add(int(code))
    for field in ("topics", "responses", "results"):
        for item in getattr(response, field, None) or ():
            code = getattr(item, "error_code", None)
            if code is not None:
                codes.add(int(code))
    return codes
