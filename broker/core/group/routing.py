"""Which shard answers a group request, and one answer from several (pure).

Theory of operation
-------------------
Most group APIs name one group, so one `__consumer_offsets` partition
(`partition_for_group`) and the shard of its leader answer them. Three
name several groups and are split by partition, each part answered by its
own shard (or with NOT_COORDINATOR by the shell, for partitions this
broker does not lead), and the parts merged back in the request's order:
DescribeGroups, DeleteGroups and OffsetFetch v8+. ListGroups asks every
shard this broker leads; a shard still loading answers with
COORDINATOR_LOAD_IN_PROGRESS, which the merged answer carries (Kafka
returns the first error and the groups it could list).
"""

from __future__ import annotations

from datetime import timedelta

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from broker.core.group.partitioner import partition_for_group
from broker.core.group.responses import (
    ListedGroup,
    delete_groups_response,
    describe_groups_response,
    list_groups_response,
    offset_fetch_response,
    response_module,
)
from broker.core.group.responses import DescribedGroup as _Described
from broker.core.group.responses import DescribedMember as _DescribedMember
from broker.core.group.responses import FetchedGroup as _Fetched
from broker.core.group.responses import FetchedPartition as _FetchedPartition

OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 15, 16, 42, 47
TXN_OFFSET_COMMIT = 28
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69

#: API key -> (min, max) version the coordinator implements. What the three
#: clients send (checked in their sources): librdkafka 2.16 JoinGroup <=5,
#: SyncGroup <=3, Heartbeat <=3, LeaveGroup <=1, OffsetCommit <=9,
#: OffsetFetch <=9, DescribeGroups/ListGroups <=5, DeleteGroups <=2,
#: OffsetDelete 0; kafka-python 3.0 JoinGroup <=7, SyncGroup <=5,
#: Heartbeat <=4, LeaveGroup <=5, OffsetCommit 2-8, OffsetFetch <=8,
#: DescribeGroups <=6, ListGroups <=5, DeleteGroups <=2; aiokafka 0.14
#: JoinGroup 0-2/5, SyncGroup 0-1/3, Heartbeat/LeaveGroup 0-1,
#: OffsetCommit 2-3, OffsetFetch 0-3, ListGroups 0-2, DescribeGroups 0-3,
#: DeleteGroups 0-1. OffsetCommit starts at v2 and OffsetFetch at v1
#: because kio has no older schema; OffsetCommit/OffsetFetch v10 (topic
#: ids) are left out.
GROUP_API_VERSIONS: dict[int, tuple[int, int]] = {
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 9),
    JOIN_GROUP: (0, 9),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    SYNC_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    # v3 carries KIP-447's generation and member id; librdkafka, kafka-python
    # and aiokafka send at most v3. v4 is verified with the transaction
    # coordinator, v5 (transactions v2) adds the offsets partition to the
    # transaction (broker.api.txn_verification).
    TXN_OFFSET_COMMIT: (0, 5),
    # KIP-848: v1 has the member id chosen by the client and the regex.
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    CONSUMER_GROUP_DESCRIBE: (0, 1),
}


def api_key(request: Any) -> int:
    return int(type(request).__api_key__)


def is_multi_group(request: Any) -> bool:
    key = api_key(request)
    return key in (DESCRIBE_GROUPS, DELETE_GROUPS, LIST_GROUPS, CONSUMER_GROUP_DESCRIBE) or (key == OFFSET_FETCH and hasattr(request, "groups"))


def split_by_partition(request: Any, num_partitions: int) -> dict[int, Any]:
    """partition -> the part of `request` its shard answers. ListGroups is
    not split: send it whole to every shard this broker leads."""
    key = api_key(request)
    assert key != LIST_GROUPS, "ListGroups goes to every shard, unsplit"
    if key == DESCRIBE_GROUPS:
        return {p: dataclasses.replace(request, groups=ids)
                for p, ids in _by_partition(request.groups, num_partitions).items()}
    if key == CONSUMER_GROUP_DESCRIBE:
        return {p: dataclasses.replace(request, group_ids=ids)
                for p, ids in _by_partition(request.group_ids, num_partitions).items()}
    if key == DELETE_GROUPS:
        return {p: dataclasses.replace(request, groups_names=ids)
                for p, ids in _by_partition(request.groups_names, num_partitions).items()}
    if key == OFFSET_FETCH and hasattr(request, "groups"):
        parts: dict[int, list] = {}
        for g in request.groups:
            parts.setdefault(partition_for_group(g.group_id, num_partitions), []).append(g)
        return {p: dataclasses.replace(request, groups=tuple(gs)) for p, gs in parts.items()}
    return {partition_for_group(request.group_id, num_partitions): request}


def _by_partition(group_ids: Any, num_partitions: int) -> dict[int, tuple[str, ...]]:
    parts: dict[int, list[str]] = {}
    for g in group_ids:
        parts.setdefault(partition_for_group(g, num_partitions), []).append(g)
    return {p: tuple(ids) for p, ids in parts.items()}


def merge_responses(request: Any, parts: list[Any]) -> Any:
    """One response to `request` from its parts' responses (any order)."""
    key = api_key(request)
    mod = response_module(request)
    if key == LIST_GROUPS:
        errors = [p.error_code for p in parts if p.error_code != ErrorCode.none]
        groups = sorted((ListedGroup(g.group_id, g.protocol_type, getattr(g, "group_state", ""),
                                     getattr(g, "group_type", "classic")) for p in parts for g in p.groups),
                        key=lambda g: g.group_id)
        return list_groups_response(mod, errors[0] if errors else ErrorCode.none, groups)
    if key == DESCRIBE_GROUPS:
        found = {g.group_id: g for p in parts for g in p.groups}
        return describe_groups_response(mod, [_described(found[g]) for g in request.groups])
    if key == CONSUMER_GROUP_DESCRIBE:
        found = {g.group_id: g for p in parts for g in p.groups}
        return mod.ConsumerGroupDescribeResponse(throttle_time=timedelta(0), groups=tuple(found[g] for g in request.group_ids))
    if key == DELETE_GROUPS:
        found = {r.group_id: r.error_code for p in parts for r in p.results}
        return delete_groups_response(mod, [(g, found[g]) for g in request.groups_names])
    if key == OFFSET_FETCH and hasattr(request, "groups"):
        found = {g.group_id: g for p in parts for g in p.groups}
        return offset_fetch_response(mod, [_fetched(found[g.group_id]) for g in request.groups])
    assert len(parts) == 1, f"{type(request).__name__} has one part"
    return parts[0]


def _described(g: Any) -> _Described:
    return _Described(
        g.group_id, g.error_code, getattr(g, "error_message", None), g.group_state, g.protocol_type,
        g.protocol_data, tuple(_DescribedMember(m.member_id, getattr(m, "group_instance_id", None), m.client_id,
                                                m.client_host, m.member_metadata, m.member_assignment)
                               for m in g.members))


def _fetched(g: Any) -> _Fetched:
    return _Fetched(g.group_id, tuple(
        (t.name, tuple(_FetchedPartition(p.partition_index, p.committed_offset, p.committed_leader_epoch,
                                         p.metadata, p.error_code) for p in t.partitions))
        for t in g.topics), g.error_code)
