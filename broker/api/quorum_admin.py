"""The controller quorum's requests a broker forwards to the active
controller, as Kafka's brokers do: DescribeQuorum (so `kafka-metadata-quorum
--bootstrap-server` and admin clients reach the quorum through any broker)
and KIP-853's AddRaftVoter, RemoveRaftVoter and UpdateRaftVoter."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kio.schema.add_raft_voter.v1.request import AddRaftVoterRequest
from kio.schema.describe_quorum.v2.request import DescribeQuorumRequest
from kio.schema.errors import ErrorCode
from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
from kio.schema.update_raft_voter.v0.request import UpdateRaftVoterRequest

from broker.api.admin import _NO_THROTTLE, _forward
from broker.api.kio_util import build, response_class, response_module
from common.security.acl import Operation, ResourceType

_VOTER_CHANGES = {80: AddRaftVoterRequest, 81: RemoveRaftVoterRequest, 82: UpdateRaftVoterRequest}


async def _forward_on_the_cluster(broker, ctx, request, target: type, operation: Operation, refusal: str,
                                  failed: Callable[[ErrorCode, str], Any]):
    """`request` forwarded as `target` once the principal may `operation` the
    cluster (Kafka's rule for these requests); `failed` builds the refusals."""
    if broker.authorizer.enabled and not broker.authorizer.allowed(ctx, operation, ResourceType.CLUSTER,
                                                                   "kafka-cluster"):
        return failed(ErrorCode.cluster_authorization_failed, f"{ctx.principal} {refusal}")
    response = await _forward(broker, request, target)
    if response is None:
        return failed(ErrorCode.request_timed_out, "the active controller did not answer")
    return response


async def handle_describe_quorum(broker, ctx, request):
    """Needs Describe on the cluster."""
    response_cls = response_class(request.header)
    # v0 and v1 answers carry only the error code.
    with_message = "error_message" in {f.name for f in dataclasses.fields(response_cls)}

    def failed(code: ErrorCode, message: str):
        extra = {"error_message": message, "nodes": ()} if with_message else {}
        return build(response_cls, error_code=code, topics=(), **extra)

    return await _forward_on_the_cluster(broker, ctx, request, DescribeQuorumRequest, Operation.DESCRIBE,
                                         "needs Describe on the cluster to describe the controller quorum", failed)


async def handle_raft_voter_change(broker, ctx, request):
    """Made by the Raft leader; needs Alter on the cluster."""
    key = request.header.api_key
    mod = response_module(request.header)
    response_cls = response_class(request.header)

    def failed(code: ErrorCode, message: str):
        if key == 82:  # UpdateRaftVoter answers carry the leader, not a message
            return build(response_cls, throttle_time=_NO_THROTTLE, error_code=code,
                         current_leader=mod.CurrentLeader(host="", port=-1))
        return build(response_cls, throttle_time=_NO_THROTTLE, error_code=code, error_message=message)

    return await _forward_on_the_cluster(broker, ctx, request, _VOTER_CHANGES[key], Operation.ALTER,
                                         "needs Alter on the cluster to change the controller quorum's voters",
                                         failed)
