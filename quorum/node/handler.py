"""The controller listener: which Kafka APIs a quorum node serves, and where each goes.

- Raft RPCs (Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch, FetchSnapshot)
  go to the `RaftNode` (voters and observers send them to voters);
- DescribeQuorum is answered from the core's view (`describe_quorum`);
- AddRaftVoter, RemoveRaftVoter and UpdateRaftVoter change a dynamic
  quorum's voter set (`voter_changes`, KIP-853);
- DescribeConfigs of this node (resource type BROKER, named by its node
  id, as `kafka-configs --bootstrap-controller` asks a controller) is
  answered here, by any controller, with its read-only engine settings
  (`quorum.engine`, and pysyncobj's port): `raftka quorum status` reads the
  engine from it;
- the controller APIs (BrokerRegistration, BrokerHeartbeat, AlterPartition,
  CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
  IncrementalAlterConfigs, ElectLeaders, AlterPartitionReassignments,
  ListPartitionReassignments, AllocateProducerIds, UnregisterBroker) go to
  the `ControllerService`, which answers NOT_CONTROLLER unless this node is
  the active controller.

Each API is served at the one version raftka speaks (the newest kio has
for the controller APIs; the Raft versions in `rpc`), DescribeQuorum at
v0..v2 for tools; ApiVersions tells clients which, and (v3+) the
supported and finalized features (`quorum.metadata.features`), as Kafka's
controllers answer on their listener: `kraft.version` 1 once the quorum is
dynamic, the finalized features epoch the committed image's offset.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from quorum.controller import SUPPORTED_REQUESTS
from quorum.metadata import features
from quorum.node.controller_service import ControllerService
from quorum.node.describe_quorum import (
    DESCRIBE_QUORUM,
    VERSIONS,
    describe_quorum_error,
    describe_quorum_response,
    is_node_config_request,
    node_configs_response,
)
from quorum.node.controller_errors import error_response
from quorum.node.voter_changes import VERSIONS as VOTER_CHANGE_VERSIONS
from quorum.node.voter_changes import VoterChanges, voter_change_response
from quorum.node.driver import RaftNode
from quorum.node.rpc import RAFT_API_VERSIONS, RpcShapeError, request_from_kio, response_to_kio, shape_error_response
from common.security.acl import AuthorizerConfig
from quorum.node.controller_auth import ITEM_FIELDS, Denial, Judgement, judge
from common.wire import ConnectionContext, DecodedRequest, SupportedApis
from common.wire.authenticate import (
    SASL_AUTHENTICATE_KEY,
    SASL_AUTHENTICATE_VERSIONS,
    SASL_HANDSHAKE_KEY,
    SASL_HANDSHAKE_VERSIONS,
    answer_without_sasl,
)


def controller_apis(with_controller: bool = True) -> SupportedApis:
    apis = SupportedApis()
    for key, version in RAFT_API_VERSIONS.items():
        apis.declare(key, version, version)
    apis.declare(DESCRIBE_QUORUM, *VERSIONS)
    for key, (low, high) in VOTER_CHANGE_VERSIONS.items():
        apis.declare(key, low, high)
    # Answered by the wire server's SASL gate on a SASL controller listener.
    apis.declare(SASL_HANDSHAKE_KEY, *SASL_HANDSHAKE_VERSIONS)
    apis.declare(SASL_AUTHENTICATE_KEY, *SASL_AUTHENTICATE_VERSIONS)
    if with_controller:
        for request_type in SUPPORTED_REQUESTS:
            apis.declare(request_type.__api_key__, request_type.__version__, request_type.__version__)
    return apis


_authorizer_log = logging.getLogger("kafka.authorizer.logger")


class QuorumRequestHandler:
    """`common.wire.serve` handler for a controller listener.

    With an authorizer configured, each request is checked against the
    operation Kafka checks for it (`controller_auth`): CLUSTER_ACTION on
    the cluster covers everything (brokers, voters, and admin requests a
    broker forwards after checking the client's own principal); an admin
    client connected here directly needs the request's own operation.
    Judged on this node's committed metadata image; Kafka's errors
    otherwise."""

    def __init__(self, node: RaftNode, controller: ControllerService | None = None,
                 authorizer: AuthorizerConfig | None = None) -> None:
        self.node = node
        self.controller = controller
        self.authorizer = authorizer if authorizer is not None and authorizer.enabled else None
        self.apis = controller_apis(controller is not None)
        self.apis.supported_features = features.SUPPORTED_FEATURES
        self.voter_changes = VoterChanges(node)
        self._follow_features()
        node.subscribe(self._follow_features)

    def _follow_features(self, _image: Any = None, _delta: Any = None) -> None:
        """ApiVersions' finalized features follow the committed image: kraft.version
        1 from the moment the log holds a voter set or the node finds the quorum
        through controller.quorum.bootstrap.servers (KIP-853)."""
        log = getattr(self.node, "log", None)
        dynamic = bool(getattr(self.node, "bootstrap_servers", ())) or (
            log is not None and hasattr(log, "latest_voters") and log.latest_voters() is not None)
        self.apis.finalized_features = features.finalized_features(
            features.KRAFT_VERSION_DYNAMIC if dynamic else features.KRAFT_VERSION)
        self.apis.finalized_features_epoch = features.finalized_features_epoch(self.node.image.offset)

    def _judge(self, ctx: ConnectionContext, body: Any) -> Judgement:
        if self.authorizer is None:
            return Judgement()
        host = ctx.peer.rsplit(":", 1)[0]
        judgement = judge(self.authorizer, self.node.image.acls.values(), ctx.principal, host, body)
        for denied in (judgement.whole, *(judgement.items or ())):
            if denied is not None:
                _authorizer_log.info("Principal = %s is Denied operation = %s from host = %s on resource = %s "
                                     "(%s on the controller listener)", ctx.principal, denied.operation.name, host,
                                     denied.resource, type(body).__name__[:-len("Request")])
        return judgement

    async def _serve_items(self, ctx: ConnectionContext, body: Any, items: tuple[Denial | None, ...]) -> Any:
        """An item-level request with some items refused: the others served, the refused ones with their error."""
        item_field, result_field = ITEM_FIELDS[type(body).__name__]
        entries = getattr(body, item_field)
        allowed = tuple(e for e, d in zip(entries, items) if d is None)
        refused = [error_response(dataclasses.replace(body, **{item_field: (e,)}), d.error,
                                  f"{ctx.principal} {d.message}") for e, d in zip(entries, items) if d is not None]
        base = await self._serve(dataclasses.replace(body, **{item_field: allowed})) if allowed else refused.pop(0)
        results = getattr(base, result_field) + tuple(r for part in refused for r in getattr(part, result_field))
        return dataclasses.replace(base, **{result_field: results})

    async def _serve(self, body: Any) -> Any:
        if is_node_config_request(body):
            return node_configs_response(body, self.node.node_id, self.node.engine_configs())
        assert self.controller is not None and self.controller.serves(body), f"{type(body).__name__} is not declared"
        return await self.controller.handle(body)

    async def __call__(self, ctx: ConnectionContext, request: DecodedRequest) -> Any:
        body = request.body
        key = request.header.api_key
        if key in RAFT_API_VERSIONS:
            if self._judge(ctx, body).whole:
                return shape_error_response(body, ErrorCode.cluster_authorization_failed)
            try:
                source_id, message = request_from_kio(body)
            except RpcShapeError:
                return shape_error_response(body)
            if source_id < 0:
                # Anonymous fetchers (tools) each get their own id, so one
                # does not cut another's long poll short.
                source_id = -2 - ctx.connection_id
            return response_to_kio(await self.node.handle_request(source_id, message))
        if key in (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY):
            return answer_without_sasl(request)
        judgement = self._judge(ctx, body)
        denied = judgement.whole
        if key == DESCRIBE_QUORUM:
            if denied:
                return describe_quorum_error(request.header.api_version, denied.error,
                                             f"{ctx.principal} {denied.message}")
            log = getattr(self.node, "log", None)
            infos = log.latest_voters() if log is not None and hasattr(log, "latest_voters") else None
            return describe_quorum_response(request.header.api_version, self.node.describe(),
                                            self.node.voter_addresses, self.node.now_ms(),
                                            {v.node_id: v for v in infos or ()})
        if key in VOTER_CHANGE_VERSIONS:
            if denied:
                return voter_change_response(body, denied.error, f"{ctx.principal} {denied.message}")
            return await self.voter_changes.handle(body)
        if denied:
            return error_response(body, denied.error, f"{ctx.principal} {denied.message}")
        if judgement.items is not None and any(judgement.items):
            return await self._serve_items(ctx, body, judgement.items)
        return await self._serve(body)
