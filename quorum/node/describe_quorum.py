"""DescribeQuorum (API 55): the quorum's state, as `kafka-metadata-quorum describe --status` reads it.

Only the leader knows every replica's progress, so, as in Kafka, a node
that is not the leader answers NOT_LEADER_OR_FOLLOWER with the leader it
knows; in v2 the answer lists every voter's endpoint (`nodes`), so a tool
can ask the leader next. Its `current_voters` are the voter set of its own
log, with their directory ids (progress -1): each controller's view of a
voter change can be read from it. Timestamps on the wire are wall-clock ms; the
core keeps monotonic ones, converted here.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from common.errors import RaftkaError
from common.wire import open_connection

from quorum.node.metadata_log import METADATA_TOPIC
from quorum.raft.status import QuorumStatus, ReplicaStatus

DESCRIBE_QUORUM = 55
VERSIONS = (0, 2)
CONTROLLER_LISTENER = "CONTROLLER"


def _module(version: int) -> Any:
    return importlib.import_module(f"kio.schema.describe_quorum.v{version}.response")


def describe_quorum_response(version: int, status: QuorumStatus, voters: dict[int, tuple[str, int]],
                             now_ms: int, infos: dict[int, Any] | None = None) -> Any:
    """`infos`: node id -> `VoterInfo` of a dynamic quorum's voters (their
    directory ids and listener names, in v2)."""
    infos = infos or {}
    m = _module(version)
    wall_ms = time.time_ns() // 1_000_000

    def wall(t: int) -> int:
        return -1 if t < 0 else wall_ms - (now_ms - t)

    def replica(r: ReplicaStatus, voter: bool) -> Any:
        fields: dict[str, Any] = {"replica_id": r.replica_id, "log_end_offset": r.log_end_offset}
        if version >= 1:
            fields["last_fetch_timestamp"] = wall(r.last_fetch_timestamp_ms)
            fields["last_caught_up_timestamp"] = wall(r.last_caught_up_timestamp_ms)
        if version >= 2:
            # An observer's own (its id may name a voter on another disk); a voter's as recorded.
            info = infos.get(r.replica_id) if voter else None
            fields["replica_directory_id"] = r.directory_id if r.directory_id is not None or not voter else (
                info.directory_id if info is not None else None)
        return m.ReplicaState(**fields)

    is_leader = status.role == "Leader"
    partition: dict[str, Any] = {
        "partition_index": 0,
        "error_code": ErrorCode.none if is_leader else ErrorCode.not_leader_or_follower,
        "leader_id": -1 if status.leader_id is None else status.leader_id,
        "leader_epoch": status.epoch,
        "high_watermark": status.high_watermark if is_leader and status.high_watermark is not None else -1,
        # A non-leader names the voters of its own log (their progress -1, its
        # own row aside), so each controller's view of the set can be
        # checked; tools read the error code and ask the leader.
        "current_voters": tuple(replica(r, True) for r in status.voters),
        "observers": tuple(replica(r, False) for r in status.observers) if is_leader else (),
    }
    top: dict[str, Any] = {"error_code": ErrorCode.none}
    if version >= 2:
        partition["error_message"] = None if is_leader else f"node {status.node_id} is not the leader"
        top["error_message"] = None
        def listeners(n: int, h: str, p: int) -> tuple[Any, ...]:
            info = infos.get(n)
            if info is not None and info.endpoints:
                return tuple(m.Listener(name=name, host=host, port=port) for name, host, port in info.endpoints)
            return (m.Listener(name=CONTROLLER_LISTENER, host=h, port=p),)

        top["nodes"] = tuple(m.Node(node_id=n, listeners=listeners(n, h, p)) for n, (h, p) in sorted(voters.items()))
    top["topics"] = (m.TopicData(topic_name=METADATA_TOPIC, partitions=(m.PartitionData(**partition),)),)
    return m.DescribeQuorumResponse(**top)


def describe_quorum_error(version: int, error: ErrorCode, message: str) -> Any:
    """A DescribeQuorum answer with only a top-level error (e.g. CLUSTER_AUTHORIZATION_FAILED)."""
    m = _module(version)
    top: dict[str, Any] = {"error_code": error, "topics": ()}
    if version >= 2:
        top["error_message"] = message
        top["nodes"] = ()
    return m.DescribeQuorumResponse(**top)


@dataclasses.dataclass(frozen=True)
class QuorumDescription:
    """A parsed DescribeQuorum answer (what `raftka quorum status` prints)."""

    error_code: int
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: tuple[tuple[int, int, int, int], ...]  # (id, log end offset, last fetch ms, last caught up ms)
    observers: tuple[tuple[int, int, int, int], ...]
    nodes: dict[int, tuple[str, int]]
    #: v2: each replica's directory id (None when unknown: a static quorum's voters); a voter's
    #: when an observer shares its id (a controller formatted again, not yet replaced).
    directory_ids: dict[int, Any] = dataclasses.field(default_factory=dict)
    #: v2: the observers' own directory ids, in the order of `observers`.
    observer_directory_ids: tuple[Any, ...] = ()


def parse_describe_quorum(response: Any) -> QuorumDescription:
    nodes = {}
    for n in getattr(response, "nodes", ()) or ():
        if n.listeners:
            nodes[int(n.node_id)] = (n.listeners[0].host, int(n.listeners[0].port))
    if response.error_code != ErrorCode.none or len(response.topics) != 1 or len(response.topics[0].partitions) != 1:
        return QuorumDescription(int(response.error_code), -1, -1, -1, (), (), nodes)
    p = response.topics[0].partitions[0]

    def rows(states: Any) -> tuple[tuple[int, int, int, int], ...]:
        return tuple((int(s.replica_id), int(s.log_end_offset), int(getattr(s, "last_fetch_timestamp", -1)),
                      int(getattr(s, "last_caught_up_timestamp", -1))) for s in states)

    def directory(s: Any) -> Any:
        return getattr(s, "replica_directory_id", None)

    # Voters last: an observer with a voter's id (on another disk) must not
    # pass for that voter (a node formatted again learns the voters' ids here).
    directory_ids = {int(s.replica_id): directory(s) for s in (*p.observers, *p.current_voters)}
    return QuorumDescription(int(p.error_code), int(p.leader_id), int(p.leader_epoch), int(p.high_watermark),
                             rows(p.current_voters), rows(p.observers), nodes, directory_ids,
                             tuple(directory(s) for s in p.observers))


def describe_quorum_request(version: int = 2) -> Any:
    m = importlib.import_module(f"kio.schema.describe_quorum.v{version}.request")
    return m.DescribeQuorumRequest(topics=(m.TopicData(topic_name=METADATA_TOPIC, partitions=(
        m.PartitionData(partition_index=0),)),))


# --- the node's engine settings: DescribeConfigs of the controller's own node -------------------

#: Kafka's ConfigResource.Type BROKER, DescribeConfigsResponse.ConfigSource STATIC_BROKER_CONFIG and ConfigType STRING.
BROKER_RESOURCE = 4
STATIC_BROKER_CONFIG = 4
STRING_TYPE = 2


def is_node_config_request(body: Any) -> bool:
    """A DescribeConfigs of broker resources only (what a controller answers for its own node)."""
    from kio.schema.describe_configs.v4.request import DescribeConfigsRequest

    return isinstance(body, DescribeConfigsRequest) and bool(body.resources) \
        and all(int(r.resource_type) == BROKER_RESOURCE for r in body.resources)


def node_configs_response(request: Any, node_id: int, configs: dict[str, str]) -> Any:
    """The node's read-only `configs` for a resource naming it (or the empty
    name); INVALID_REQUEST naming this node for any other node id."""
    from kio.schema.describe_configs.v4 import response as m

    from quorum.controller.result import NO_THROTTLE

    results = []
    for r in request.resources:
        if r.resource_name not in ("", str(node_id)):
            results.append(m.DescribeConfigsResult(
                error_code=ErrorCode.invalid_request, error_message=f"this is controller {node_id}; ask each "
                f"controller for its own node id ({r.resource_name!r} asked)", resource_type=r.resource_type,
                resource_name=r.resource_name, configs=()))
            continue
        keys = set(r.configuration_keys) if r.configuration_keys else None
        results.append(m.DescribeConfigsResult(
            error_code=ErrorCode.none, error_message=None, resource_type=r.resource_type,
            resource_name=r.resource_name, configs=tuple(
                m.DescribeConfigsResourceResult(name=k, value=v, read_only=True, config_source=STATIC_BROKER_CONFIG,
                                                is_sensitive=False, synonyms=(), config_type=STRING_TYPE,
                                                documentation=None)
                for k, v in sorted(configs.items()) if keys is None or k in keys)))
    return m.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=tuple(results))


async def node_configs(host: str, port: int, node_id: int, timeout_ms: int = 10000) -> dict[str, str]:
    """The engine settings controller `node_id` at host:port answers for itself (quorum.engine, ...)."""
    from kio.schema.describe_configs.v4 import request as m

    request = m.DescribeConfigsRequest(resources=(m.DescribeConfigsResource(
        resource_type=BROKER_RESOURCE, resource_name=str(node_id), configuration_keys=None),),
        include_synonyms=False, include_documentation=False)
    async with open_connection(host, port, connect_timeout_ms=timeout_ms) as conn:
        response = await conn.request(request, timeout_ms=timeout_ms)
    result = response.results[0]
    if result.error_code != ErrorCode.none:
        raise ConnectionError(f"controller {node_id} at {host}:{port} answered DescribeConfigs with error "
                              f"{int(result.error_code)}: {result.error_message}")
    return {c.name: c.value for c in result.configs}


async def describe_quorum(host: str, port: int, timeout_ms: int = 10000) -> Any:
    """The leader's DescribeQuorum answer (`QuorumDescription`), following one redirect."""
    for _ in range(2):
        async with open_connection(host, port, connect_timeout_ms=timeout_ms) as conn:
            response = await conn.request(describe_quorum_request(2), timeout_ms=timeout_ms)
        description = parse_describe_quorum(response)
        if description.error_code == ErrorCode.not_leader_or_follower and description.leader_id in description.nodes:
            host, port = description.nodes[description.leader_id]
            continue
        return description
    return description


async def discover_voters(bootstrap_servers: tuple[tuple[str, int], ...], timeout_ms: int,
                          retry_s: float = 0.5) -> tuple[dict[int, tuple[str, int]], dict[int, Any]]:
    """The voters' endpoints and directory ids, asked of
    `controller.quorum.bootstrap.servers` with DescribeQuorum v2 (its
    `nodes`), each server in turn until one answers: how a node whose log
    names no voters yet finds the quorum."""
    import logging

    log = logging.getLogger("quorum.node.describe_quorum")
    while True:
        for host, port in bootstrap_servers:
            try:
                with trio.fail_after(timeout_ms / 1000):
                    async with open_connection(host, port, connect_timeout_ms=timeout_ms) as conn:
                        response = await conn.request(describe_quorum_request(2), timeout_ms=timeout_ms)
            except (OSError, ConnectionError, trio.TooSlowError, RaftkaError) as exc:
                log.info("bootstrap server %s:%d did not answer DescribeQuorum (%s); trying the next", host, port, exc)
                continue
            description = parse_describe_quorum(response)
            if description.nodes:
                voter_ids = {row[0] for row in description.voters}
                return description.nodes, {n: d for n, d in description.directory_ids.items()
                                           if n in voter_ids and d is not None and d.int != 0}
        await trio.sleep(retry_s)
