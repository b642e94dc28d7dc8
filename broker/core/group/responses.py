"""Group API responses as kio entities of the request's own version (pure).

Theory of operation
-------------------
Every group API has a response class per version, each with the fields of
that version only. The coordinator decides an answer once, as keyword
arguments, and `build` keeps the fields the version has. Two Kafka rules
for old versions are applied here, where the version is known:

- a null string in a version where the field is not nullable goes out as
  "" (JoinGroup's protocol_name before v7);
- LeaveGroup before v3 has no per-member results: the top-level error is
  the first member's error (Kafka's `LeaveGroupResponse.getError`).

`error_response(request, error)` answers any group request with one error
(NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE
when a write could not commit): the shell's door for requests that never
reach a loaded shard or whose records never committed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

NO_THROTTLE = timedelta(0)
#: DescribeGroups' authorized_operations when they were not asked for.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


def response_module(request: Any) -> ModuleType:
    """The kio module of the response classes of the request's API and
    version (`kio.schema.<api>.v<N>.response`)."""
    return importlib.import_module(type(request).__module__.rpartition(".")[0] + ".response")


def request_version(request: Any) -> int:
    return int(type(request).__version__)


def build(cls: type, **fields: Any) -> Any:
    """`cls(**fields)` without the fields `cls` lacks; None becomes "" for a
    string field the version does not allow to be null."""
    info = _field_info(cls)
    kwargs = {}
    for name, value in fields.items():
        if name not in info:
            continue
        nullable, is_str = info[name]
        if value is None and not nullable and is_str:
            value = ""
        kwargs[name] = value
    return cls(**kwargs)


@functools.cache
def _field_info(cls: type) -> dict[str, tuple[bool, bool]]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        is_str = hint is str or (nullable and str in args)
        out[f.name] = (nullable, is_str)
    return out


def _has_field(cls: type, name: str) -> bool:
    return name in _field_info(cls)


# --- membership APIs ---------------------------------------------------------


def join_response(mod: ModuleType, error: ErrorCode, *, member_id: str = "", generation_id: int = -1,
                  protocol_type: str | None = None, protocol_name: str | None = None, leader: str = "",
                  members: Sequence[tuple[str, str | None, bytes]] = (), skip_assignment: bool = False) -> Any:
    return build(
        mod.JoinGroupResponse, throttle_time=NO_THROTTLE, error_code=error, generation_id=generation_id,
        protocol_type=protocol_type, protocol_name=protocol_name, leader=leader,
        skip_assignment=skip_assignment, member_id=member_id,
        members=tuple(build(mod.JoinGroupResponseMember, member_id=m, group_instance_id=i, metadata=md)
                      for m, i, md in members),
    )


def sync_response(mod: ModuleType, error: ErrorCode, *, protocol_type: str | None = None,
                  protocol_name: str | None = None, assignment: bytes = b"") -> Any:
    return build(mod.SyncGroupResponse, throttle_time=NO_THROTTLE, error_code=error,
                 protocol_type=protocol_type, protocol_name=protocol_name, assignment=assignment)


def heartbeat_response(mod: ModuleType, error: ErrorCode) -> Any:
    return build(mod.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=error)


def leave_response(mod: ModuleType, error: ErrorCode,
                   members: Sequence[tuple[str, str | None, ErrorCode]] = ()) -> Any:
    if _has_field(mod.LeaveGroupResponse, "members"):
        return build(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error, members=tuple(
            build(mod.MemberResponse, member_id=m, group_instance_id=i, error_code=e) for m, i, e in members))
    if error == ErrorCode.none:
        error = next((e for _, _, e in members if e != ErrorCode.none), ErrorCode.none)
    return build(mod.LeaveGroupResponse, throttle_time=NO_THROTTLE, error_code=error)


# --- offsets -------------------------------------------------------------------


def offset_commit_response(mod: ModuleType, topics: Iterable[tuple[str, Iterable[tuple[int, ErrorCode]]]]) -> Any:
    return build(mod.OffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(mod.OffsetCommitResponseTopic, name=name, partitions=tuple(
            build(mod.OffsetCommitResponsePartition, partition_index=p, error_code=e) for p, e in parts))
        for name, parts in topics))


def txn_offset_commit_response(mod: ModuleType,
                               topics: Iterable[tuple[str, Iterable[tuple[int, ErrorCode]]]]) -> Any:
    return build(mod.TxnOffsetCommitResponse, throttle_time=NO_THROTTLE, topics=tuple(
        build(mod.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(
            build(mod.TxnOffsetCommitResponsePartition, partition_index=p, error_code=e) for p, e in parts))
        for name, parts in topics))


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    partition: int
    committed_offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: ErrorCode = ErrorCode.none


@dataclass(frozen=True, slots=True)
class FetchedGroup:
    """One group's part of an OffsetFetch answer."""

    group_id: str
    topics: tuple[tuple[str, tuple[FetchedPartition, ...]], ...] = ()
    error: ErrorCode = ErrorCode.none


def offset_fetch_response(mod: ModuleType, groups: Sequence[FetchedGroup]) -> Any:
    """v8+ answer every group; v1-v7 carry one group (v1 has no top-level
    error: a group error is repeated in each partition)."""
    if _has_field(mod.OffsetFetchResponse, "groups"):
        return build(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(
            build(mod.OffsetFetchResponseGroup, group_id=g.group_id, error_code=g.error,
                  topics=_fetched_topics(mod, g, mod.OffsetFetchResponseTopics, mod.OffsetFetchResponsePartitions))
            for g in groups))
    assert len(groups) == 1, "OffsetFetch before v8 answers one group"
    group = groups[0]
    if not _has_field(mod.OffsetFetchResponse, "error_code") and group.error != ErrorCode.none:
        group = FetchedGroup(group.group_id, tuple(
            (name, tuple(dataclasses.replace(p, error=group.error) for p in parts)) for name, parts in group.topics))
    return build(mod.OffsetFetchResponse, throttle_time=NO_THROTTLE, error_code=group.error,
                 topics=_fetched_topics(mod, group, mod.OffsetFetchResponseTopic, mod.OffsetFetchResponsePartition))


def _fetched_topics(mod: ModuleType, group: FetchedGroup, topic_cls: type, partition_cls: type) -> tuple:
    return tuple(
        build(topic_cls, name=name, partitions=tuple(
            build(partition_cls, partition_index=p.partition, committed_offset=p.committed_offset,
                  committed_leader_epoch=p.leader_epoch, metadata=p.metadata, error_code=p.error)
            for p in parts))
        for name, parts in group.topics)


def offset_delete_response(mod: ModuleType, error: ErrorCode,
                           topics: Iterable[tuple[str, Iterable[tuple[int, ErrorCode]]]] = ()) -> Any:
    return build(mod.OffsetDeleteResponse, error_code=error, throttle_time=NO_THROTTLE, topics=tuple(
        build(mod.OffsetDeleteResponseTopic, name=name, partitions=tuple(
            build(mod.OffsetDeleteResponsePartition, partition_index=p, error_code=e) for p, e in parts))
        for name, parts in topics))


# --- group administration --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    group_id: str
    error: ErrorCode = ErrorCode.none
    error_message: str | None = None
    state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()


def describe_groups_response(mod: ModuleType, groups: Sequence[DescribedGroup]) -> Any:
    return build(mod.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(
        build(mod.DescribedGroup, error_code=g.error, error_message=g.error_message, group_id=g.group_id,
              group_state=g.state, protocol_type=g.protocol_type, protocol_data=g.protocol_data,
              authorized_operations=AUTHORIZED_OPERATIONS_OMITTED, members=tuple(
                  build(mod.DescribedGroupMember, member_id=m.member_id, group_instance_id=m.group_instance_id,
                        client_id=m.client_id, client_host=m.client_host, member_metadata=m.metadata,
                        member_assignment=m.assignment) for m in g.members))
        for g in groups))


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


def list_groups_response(mod: ModuleType, error: ErrorCode, groups: Sequence[ListedGroup] = ()) -> Any:
    return build(mod.ListGroupsResponse, throttle_time=NO_THROTTLE, error_code=error, groups=tuple(
        build(mod.ListedGroup, group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
              group_type=g.group_type) for g in groups))


def delete_groups_response(mod: ModuleType, results: Sequence[tuple[str, ErrorCode]]) -> Any:
    return build(mod.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(
        build(mod.DeletableGroupResult, group_id=g, error_code=e) for g, e in results))


# --- one error for a whole request ---------------------------------------------------


def error_response(request: Any, error: ErrorCode) -> Any:
    """`request` answered with `error` everywhere an error can go."""
    mod = response_module(request)
    name = type(request).__name__
    if name == "JoinGroupRequest":
        return join_response(mod, error, member_id=request.member_id)
    if name == "SyncGroupRequest":
        return sync_response(mod, error)
    if name == "HeartbeatRequest":
        return heartbeat_response(mod, error)
    if name == "LeaveGroupRequest":
        return leave_response(mod, error)
    if name == "OffsetCommitRequest":
        return offset_commit_response(mod, (
            (t.name, ((p.partition_index, error) for p in t.partitions)) for t in request.topics))
    if name == "TxnOffsetCommitRequest":
        return txn_offset_commit_response(mod, (
            (t.name, ((p.partition_index, error) for p in t.partitions)) for t in request.topics))
    if name == "OffsetFetchRequest":
        return offset_fetch_response(mod, [FetchedGroup(g, _requested_partitions_with_error(t, error), error)
                                           for g, t in offset_fetch_groups(request)])
    if name == "DescribeGroupsRequest":
        return describe_groups_response(mod, [DescribedGroup(g, error) for g in request.groups])
    if name == "ListGroupsRequest":
        return list_groups_response(mod, error)
    if name == "DeleteGroupsRequest":
        return delete_groups_response(mod, [(g, error) for g in request.groups_names])
    if name == "OffsetDeleteRequest":
        return offset_delete_response(mod, error)
    if name == "ConsumerGroupHeartbeatRequest":
        return mod.ConsumerGroupHeartbeatResponse(throttle_time=timedelta(0), error_code=error, member_epoch=-1,
                                                  heartbeat_interval=timedelta(0), assignment=None)
    if name == "ConsumerGroupDescribeRequest":
        return mod.ConsumerGroupDescribeResponse(throttle_time=timedelta(0), groups=tuple(mod.DescribedGroup(
            error_code=error, group_id=g, group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="",
            members=(), authorized_operations=-2147483648) for g in request.group_ids))
    raise AssertionError(f"{name} is not a group coordinator request")


def offset_fetch_groups(request: Any) -> list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...] | None]]:
    """(group id, requested (topic, partitions) or None for all) per group
    of an OffsetFetch of any version."""
    if hasattr(request, "groups"):
        return [(g.group_id, _requested_topics(g.topics)) for g in request.groups]
    return [(request.group_id, _requested_topics(request.topics))]


def _requested_topics(topics: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    if topics is None:
        return None
    return tuple((t.name, tuple(int(p) for p in t.partition_indexes)) for t in topics)


def _requested_partitions_with_error(topics: Any, error: ErrorCode) -> tuple:
    # Before v2 (no top-level error) the error has to ride on the partitions.
    if topics is None:
        return ()
    return tuple((name, tuple(FetchedPartition(p, error=error) for p in parts)) for name, parts in topics)
