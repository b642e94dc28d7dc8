"""Every answer the coordinator gives goes on the wire: for each API version
in GROUP_API_VERSIONS, success and error responses encode with kio at the
request's own version and decode back equal; error_response answers any
request; multi-group requests split by partition and merge in order."""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.core.group import (
    GROUP_API_VERSIONS,
    GroupCoordinatorShard,
    RequestContext,
    error_response,
    merge_responses,
    partition_for_group,
    split_by_partition,
)
from broker.core.group.responses import build
from group_testing import (
    FAST,
    Harness,
    commit_request,
    fetch_request,
    heartbeat_request,
    join_request,
    kio_module,
    leave_request,
    sync_request,
    txn_commit_request,
)
from common.wire.codec import RequestHeader, api_codec, decode_response, encode_response


def versions(api_key: int) -> list[int]:
    lo, hi = GROUP_API_VERSIONS[api_key]
    return list(range(lo, hi + 1))


def round_trip(request: Any, response: Any) -> Any:
    key, version = int(type(request).__api_key__), int(type(request).__version__)
    codec = api_codec(key, version)
    assert type(response) is codec.response_type
    header = RequestHeader(key, version, 7, "c", codec.request_header_version)
    frame = encode_response(header, response)
    decoded = decode_response(memoryview(frame)[4:], codec, 7)
    assert decoded == response
    return decoded


def describe_request(*groups: str, version: int) -> Any:
    return build(kio_module("describe_groups", version).DescribeGroupsRequest, groups=groups,
                 include_authorized_operations=False)


def list_request(version: int, states: tuple[str, ...] = (), types: tuple[str, ...] = ()) -> Any:
    return build(kio_module("list_groups", version).ListGroupsRequest, states_filter=states, types_filter=types)


def delete_request(*groups: str, version: int) -> Any:
    return kio_module("delete_groups", version).DeleteGroupsRequest(groups_names=groups)


def offset_delete_request(group: str, version: int = 0) -> Any:
    mod = kio_module("offset_delete", version)
    return mod.OffsetDeleteRequest(group_id=group, topics=(mod.OffsetDeleteRequestTopic(
        name="t", partitions=(mod.OffsetDeleteRequestPartition(partition_index=0),)),))


@pytest.mark.parametrize("version", versions(11))
def test_join_and_sync_answers_encode_at_every_version(version: int) -> None:
    h = Harness()
    if version >= 4:
        first = h.call(join_request("g", "", version=version))
        round_trip(join_request("g", "", version=version), first)
        member_id = first.member_id
    else:
        member_id = ""
    request = join_request("g", member_id, version=version)
    token = h.send(request)
    h.advance_until_answered([token])
    joined = round_trip(request, h.responses[token])
    assert joined.error_code == ErrorCode.none and joined.leader == joined.member_id
    assert joined.protocol_name == "range"
    refused = join_request("g", "", version=version, session_ms=1)
    assert round_trip(refused, h.call(refused)).error_code == ErrorCode.invalid_session_timeout
    for sync_version in versions(14):
        sync = sync_request("g", joined.member_id, 1, {joined.member_id: b"a"}, version=sync_version)
        assert round_trip(sync, h.call(sync)).assignment == b"a"
        bad = sync_request("g", "ghost", 1, version=sync_version)
        assert round_trip(bad, h.call(bad)).error_code == ErrorCode.unknown_member_id


def stable_harness() -> tuple[Harness, list[Any]]:
    h = Harness()
    return h, h.form_group(2)


@pytest.mark.parametrize("version", versions(12))
def test_heartbeat_answers_encode(version: int) -> None:
    h, (leader, _) = stable_harness()
    for member_id, expected in ((leader.member_id, ErrorCode.none), ("ghost", ErrorCode.unknown_member_id)):
        request = heartbeat_request("g", member_id, 1, version=version)
        assert round_trip(request, h.call(request)).error_code == expected


@pytest.mark.parametrize("version", versions(13))
def test_leave_answers_encode(version: int) -> None:
    h, (leader, follower) = stable_harness()
    request = leave_request("g", ("ghost", None), version=version)
    answer = round_trip(request, h.call(request))
    if version < 3:
        assert answer.error_code == ErrorCode.unknown_member_id
    else:
        assert answer.members[0].error_code == ErrorCode.unknown_member_id
    request = leave_request("g", (follower.member_id, None), version=version)
    assert round_trip(request, h.call(request)).error_code == ErrorCode.none


@pytest.mark.parametrize("version", versions(8))
def test_offset_commit_and_fetch_answers_encode(version: int) -> None:
    h, (leader, _) = stable_harness()
    commit = commit_request("g", {("t", 0): 5, ("u", 1): 6}, member_id=leader.member_id, generation=1,
                            version=version)
    assert {p.error_code for t in round_trip(commit, h.call(commit)).topics for p in t.partitions} == {ErrorCode.none}
    stale = commit_request("g", {("t", 0): 5}, member_id=leader.member_id, generation=0, version=version)
    assert round_trip(stale, h.call(stale)).topics[0].partitions[0].error_code == ErrorCode.illegal_generation
    for fetch_version in versions(9):
        fetch = fetch_request("g", {"t": [0, 1]}, version=fetch_version)
        round_trip(fetch, h.call(fetch))
        if fetch_version >= 2:
            everything = fetch_request("g", None, version=fetch_version)
            round_trip(everything, h.call(everything))


@pytest.mark.parametrize("version", versions(15))
def test_describe_groups_answers_encode(version: int) -> None:
    h, (leader, follower) = stable_harness()
    request = describe_request("g", "ghost", "", version=version)
    stable, ghost, empty_id = round_trip(request, h.call(request)).groups
    assert stable.group_state == "Stable" and stable.protocol_type == "consumer" and stable.protocol_data == "range"
    assert {m.member_id: m.member_assignment for m in stable.members} == {
        leader.member_id: leader.member_id.encode(), follower.member_id: follower.member_id.encode()}
    assert all(m.client_host == "/127.0.0.1" and m.member_metadata for m in stable.members)
    assert ghost.group_state == "Dead"
    assert ghost.error_code == (ErrorCode.group_id_not_found if version >= 6 else ErrorCode.none)
    assert empty_id.error_code == ErrorCode.invalid_group_id


@pytest.mark.parametrize("version", versions(16))
def test_list_groups_answers_encode_and_filter(version: int) -> None:
    h, _ = stable_harness()
    h.call(commit_request("simple", {("t", 0): 1}))
    request = list_request(version)
    listed = {g.group_id: g for g in round_trip(request, h.call(request)).groups}
    assert set(listed) == {"g", "simple"}
    assert listed["g"].protocol_type == "consumer" and listed["simple"].protocol_type == ""
    if version >= 4:
        assert listed["g"].group_state == "Stable"
        only_empty = list_request(version, states=("empty",))
        assert [g.group_id for g in round_trip(only_empty, h.call(only_empty)).groups] == ["simple"]
    if version >= 5:
        consumer_type = list_request(version, types=("consumer",))
        assert round_trip(consumer_type, h.call(consumer_type)).groups == ()
        classic = list_request(version, types=("Classic",))
        assert len(round_trip(classic, h.call(classic)).groups) == 2


@pytest.mark.parametrize("version", versions(42))
def test_delete_groups_and_offset_delete_answers_encode(version: int) -> None:
    h, _ = stable_harness()
    h.call(commit_request("simple", {("t", 0): 1}))
    request = offset_delete_request("simple")
    assert round_trip(request, h.call(request)).error_code == ErrorCode.none
    request = delete_request("simple", "g", version=version)
    assert [r.error_code for r in round_trip(request, h.call(request)).results] == [
        ErrorCode.none, ErrorCode.non_empty_group]


def any_request(api_key: int, version: int) -> Any:
    if api_key == 8:
        return commit_request("g", {("t", 0): 1}, version=version)
    if api_key == 9:
        return fetch_request("g", {"t": [0]}, version=version)
    if api_key == 11:
        return join_request("g", "m", version=version)
    if api_key == 12:
        return heartbeat_request("g", "m", 1, version=version)
    if api_key == 13:
        return leave_request("g", ("m", None), version=version)
    if api_key == 14:
        return sync_request("g", "m", 1, version=version)
    if api_key == 15:
        return describe_request("g", "h", version=version)
    if api_key == 16:
        return list_request(version)
    if api_key == 42:
        return delete_request("g", "h", version=version)
    if api_key == 28:
        return txn_commit_request("g", {("t", 0): 1}, version=version)
    if api_key == 68:
        mod = importlib.import_module(f"kio.schema.consumer_group_heartbeat.v{version}.request")
        return mod.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=0,
                                                 subscribed_topic_names=("t",), topic_partitions=None)
    if api_key == 69:
        mod = importlib.import_module(f"kio.schema.consumer_group_describe.v{version}.request")
        return mod.ConsumerGroupDescribeRequest(group_ids=("g", "h"), include_authorized_operations=False)
    return offset_delete_request("g", version)


ALL_VERSIONS = [(k, v) for k in sorted(GROUP_API_VERSIONS) for v in versions(k)]


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{k}v{v}" for k, v in ALL_VERSIONS])
def test_error_response_answers_every_request_and_encodes(api_key: int, version: int) -> None:
    request = any_request(api_key, version)
    answer = round_trip(request, error_response(request, ErrorCode.not_coordinator))
    codes = set()

    def collect(entity: Any) -> None:
        if hasattr(entity, "error_code"):
            codes.add(entity.error_code)
        for name in ("topics", "partitions", "groups", "results", "members"):
            for child in getattr(entity, name, None) or ():
                collect(child)

    collect(answer)
    assert ErrorCode.not_coordinator in codes
    # A loading shard answers every request itself (Heartbeat with NONE).
    shard = GroupCoordinatorShard(0, FAST, random.Random(0))
    loading = shard.handle(RequestContext(1), request, 0).response_for(1)
    round_trip(request, loading)


def test_multi_group_requests_split_by_partition_and_merge_in_order() -> None:
    n = 50
    names = ["my-group", "a", "hello", "group"]  # partitions 12, 47, 22, 47
    assert [partition_for_group(g, n) for g in names] == [12, 47, 22, 47]
    shards = {p: Harness(partition=p) for p in (12, 47)}  # this broker leads 12 and 47, not 22
    for g in ("my-group", "a"):
        shards[partition_for_group(g, n)].call(commit_request(g, {("t", 0): 1}))

    request = describe_request(*names, version=5)
    parts = split_by_partition(request, n)
    assert {p: part.groups for p, part in parts.items()} == {12: ("my-group",), 47: ("a", "group"), 22: ("hello",)}
    answers = [shards[p].call(part) if p in shards else error_response(part, ErrorCode.not_coordinator)
               for p, part in parts.items()]
    merged = round_trip(request, merge_responses(request, answers))
    assert [(g.group_id, g.error_code, g.group_state) for g in merged.groups] == [
        ("my-group", ErrorCode.none, "Empty"), ("a", ErrorCode.none, "Empty"),
        ("hello", ErrorCode.not_coordinator, ""), ("group", ErrorCode.none, "Dead")]

    mod = kio_module("offset_fetch", 8)
    request = mod.OffsetFetchRequest(require_stable=False, groups=tuple(
        mod.OffsetFetchRequestGroup(group_id=g, topics=(mod.OffsetFetchRequestTopics(name="t", partition_indexes=(0,)),))
        for g in ("a", "hello", "my-group")))
    answers = [shards[p].call(part) if p in shards else error_response(part, ErrorCode.not_coordinator)
               for p, part in split_by_partition(request, n).items()]
    merged = round_trip(request, merge_responses(request, answers))
    assert [(g.group_id, g.error_code) for g in merged.groups] == [
        ("a", ErrorCode.none), ("hello", ErrorCode.not_coordinator), ("my-group", ErrorCode.none)]
    assert merged.groups[0].topics[0].partitions[0].committed_offset == 1

    request = list_request(4)
    merged = round_trip(request, merge_responses(request, [s.call(request) for s in shards.values()]))
    assert [g.group_id for g in merged.groups] == ["a", "my-group"]

    request = delete_request(*names, version=2)
    answers = [shards[p].call(part) if p in shards else error_response(part, ErrorCode.not_coordinator)
               for p, part in split_by_partition(request, n).items()]
    merged = round_trip(request, merge_responses(request, answers))
    assert [r.error_code for r in merged.results] == [ErrorCode.none, ErrorCode.none, ErrorCode.not_coordinator,
                                                      ErrorCode.group_id_not_found]
