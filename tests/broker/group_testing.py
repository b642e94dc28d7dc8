"""Helpers for the group coordinator tests: kio requests of any version, and a
`Harness` that drives one shard with a simulated clock and a simulated
`__consumer_offsets` log whose appends commit at once."""

from __future__ import annotations

import importlib
import itertools
import random
import struct
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from broker.core.group import CoordinatorResult, GroupCoordinatorConfig, GroupCoordinatorShard, Record, RequestContext
from broker.core.group.classic_group import GroupState
from broker.core.group.responses import build

FAST = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=100, group_min_session_timeout_ms=1000)


def kio_module(api: str, version: int):
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0 (topics, null user data)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        raw = t.encode()
        out += struct.pack(">h", len(raw)) + raw
    return out + struct.pack(">i", -1)


def ms(n: int) -> timedelta:
    return timedelta(milliseconds=n)


def join_request(group: str = "g", member_id: str = "", *, version: int = 5, instance_id: str | None = None,
                 session_ms: int = 10_000, rebalance_ms: int = 30_000, protocol_type: str = "consumer",
                 protocols: tuple[tuple[str, bytes], ...] = (("range", subscription("t")),)) -> Any:
    mod = kio_module("join_group", version)
    return build(mod.JoinGroupRequest, group_id=group, session_timeout=ms(session_ms),
                 rebalance_timeout=ms(rebalance_ms), member_id=member_id, group_instance_id=instance_id,
                 protocol_type=protocol_type, reason=None,
                 protocols=tuple(mod.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols))


def sync_request(group: str, member_id: str, generation: int, assignments: dict[str, bytes] | None = None, *,
                 version: int = 3, instance_id: str | None = None, protocol_type: str | None = None,
                 protocol_name: str | None = None) -> Any:
    mod = kio_module("sync_group", version)
    return build(mod.SyncGroupRequest, group_id=group, generation_id=generation, member_id=member_id,
                 group_instance_id=instance_id, protocol_type=protocol_type, protocol_name=protocol_name,
                 assignments=tuple(mod.SyncGroupRequestAssignment(member_id=m, assignment=a)
                                   for m, a in (assignments or {}).items()))


def heartbeat_request(group: str, member_id: str, generation: int, *, version: int = 3,
                      instance_id: str | None = None) -> Any:
    mod = kio_module("heartbeat", version)
    return build(mod.HeartbeatRequest, group_id=group, generation_id=generation, member_id=member_id,
                 group_instance_id=instance_id)


def leave_request(group: str, *members: tuple[str, str | None], version: int = 3) -> Any:
    mod = kio_module("leave_group", version)
    if version < 3:
        assert len(members) == 1
        return mod.LeaveGroupRequest(group_id=group, member_id=members[0][0])
    return mod.LeaveGroupRequest(group_id=group, members=tuple(
        build(mod.MemberIdentity, member_id=m, group_instance_id=i, reason=None) for m, i in members))


def commit_request(group: str, offsets: dict[tuple[str, int], int], *, member_id: str = "", generation: int = -1,
                   version: int = 8, instance_id: str | None = None, metadata: str | None = "",
                   retention_ms: int = -1, leader_epoch: int = -1) -> Any:
    mod = kio_module("offset_commit", version)
    by_topic: dict[str, list] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(build(
            mod.OffsetCommitRequestPartition, partition_index=partition, committed_offset=offset,
            committed_leader_epoch=leader_epoch, committed_metadata=metadata))
    return build(mod.OffsetCommitRequest, group_id=group, generation_id_or_member_epoch=generation,
                 member_id=member_id, group_instance_id=instance_id, retention_time=ms(retention_ms),
                 topics=tuple(mod.OffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                              for t, ps in by_topic.items()))


def fetch_request(group: str, topics: dict[str, list[int]] | None, *, version: int = 7,
                  require_stable: bool = False) -> Any:
    mod = kio_module("offset_fetch", version)
    if version >= 8:
        group_entry = build(mod.OffsetFetchRequestGroup, group_id=group, member_id=None, member_epoch=-1,
                            topics=None if topics is None else tuple(
                                mod.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                                for t, ps in topics.items()))
        return build(mod.OffsetFetchRequest, groups=(group_entry,), require_stable=require_stable)
    return build(mod.OffsetFetchRequest, group_id=group, require_stable=require_stable, topics=None if topics is None else tuple(
        mod.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps)) for t, ps in topics.items()))


def txn_commit_request(group: str, offsets: dict[tuple[str, int], int], *, producer_id: int = 1000,
                       producer_epoch: int = 0, member_id: str = "", generation: int = -1,
                       instance_id: str | None = None, version: int = 3) -> Any:
    mod = kio_module("txn_offset_commit", version)
    by_topic: dict[str, list] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(build(
            mod.TxnOffsetCommitRequestPartition, partition_index=partition, committed_offset=offset,
            committed_leader_epoch=-1, committed_metadata=""))
    return build(mod.TxnOffsetCommitRequest, transactional_id="tx", group_id=group, producer_id=producer_id,
                 producer_epoch=producer_epoch, generation_id=generation, member_id=member_id,
                 group_instance_id=instance_id,
                 topics=tuple(mod.TxnOffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                              for t, ps in by_topic.items()))


def fetched_offsets(response: Any) -> dict[tuple[str, int], int]:
    groups = response.groups if hasattr(response, "groups") else [response]
    assert len(groups) == 1
    return {(t.name, p.partition_index): p.committed_offset for t in groups[0].topics for p in t.partitions}


class Harness:
    """One shard, a clock, and a log where every append commits at once."""

    def __init__(self, config: GroupCoordinatorConfig = FAST, *, seed: int = 7, now_ms: int = 0,
                 partition: int = 0) -> None:
        self.config = config
        self.partition = partition
        self.now_ms = now_ms
        self.shard = GroupCoordinatorShard(partition, config, random.Random(seed))
        self.shard.on_loaded(now_ms)
        self.log: list[Record] = []
        #: (producer id, epoch, records) of each transactional batch appended.
        self.txn_log: list[tuple[int, int, tuple[Record, ...]]] = []
        self.responses: dict[int, Any] = {}
        self._tokens = itertools.count(1)
        self.last: CoordinatorResult | None = None

    def send(self, request: Any, *, client_id: str = "client", host: str = "/127.0.0.1") -> int:
        token = next(self._tokens)
        self.absorb(self.shard.handle(RequestContext(token, client_id, host), request, self.now_ms))
        return token

    def call(self, request: Any, **kwargs: Any) -> Any:
        """Send and return the answer, which must come at once."""
        token = self.send(request, **kwargs)
        assert token in self.responses, f"{type(request).__name__} was parked"
        return self.responses[token]

    def advance(self, ms_: int) -> CoordinatorResult:
        self.now_ms += ms_
        return self.absorb(self.shard.tick(self.now_ms))

    def absorb(self, result: CoordinatorResult) -> CoordinatorResult:
        self.last = result
        self.log.extend(result.records)
        self.txn_log.extend(result.txn_records)
        for token, response in result.responses:
            assert token not in self.responses, f"request {token} answered twice"
            self.responses[token] = response
        return result

    def advance_until_answered(self, tokens: list[int], step_ms: int = 50, limit_ms: int = 120_000) -> None:
        waited = 0
        while not all(t in self.responses for t in tokens):
            assert waited < limit_ms, "parked requests were never answered"
            self.advance(step_ms)
            waited += step_ms

    def answer(self, token: int) -> Any | None:
        return self.responses.get(token)

    def group(self, group_id: str = "g"):
        return self.shard.groups.get(group_id)

    # --- whole protocol steps -------------------------------------------------

    def join_new(self, group: str = "g", *, version: int = 5, client_id: str = "client", **kwargs: Any) -> int:
        """KIP-394: a first JoinGroup gets MEMBER_ID_REQUIRED; join again
        with the id. Returns the token of the (parked or answered) rejoin."""
        first = self.call(join_request(group, "", version=version, **kwargs), client_id=client_id)
        assert first.error_code == ErrorCode.member_id_required
        assert first.member_id.startswith(client_id + "-")
        return self.send(join_request(group, first.member_id, version=version, **kwargs), client_id=client_id)

    def form_group(self, n: int, group: str = "g", **kwargs: Any) -> list[Any]:
        """n members join and sync (the leader assigns b"<member id>" to each);
        returns their JoinGroup answers, leader first."""
        tokens = [self.join_new(group, client_id=f"c{i}", **kwargs) for i in range(n)]
        self.advance_until_answered(tokens)
        joins = [self.responses[t] for t in tokens]
        assert all(j.error_code == ErrorCode.none for j in joins)
        leader = next(j for j in joins if j.member_id == j.leader)
        self.sync_all(group, joins)
        assert self.group(group).state is GroupState.STABLE
        return [leader] + [j for j in joins if j is not leader]

    def sync_all(self, group: str, joins: list[Any]) -> dict[str, Any]:
        leader = next(j for j in joins if j.member_id == j.leader)
        tokens = {}
        for j in joins:
            if j is not leader:
                tokens[j.member_id] = self.send(sync_request(group, j.member_id, j.generation_id))
        assignment = {m.member_id: m.member_id.encode() for m in leader.members}
        tokens[leader.member_id] = self.send(sync_request(group, leader.member_id, leader.generation_id, assignment))
        answers = {m: self.responses[t] for m, t in tokens.items()}
        for m, a in answers.items():
            assert a.error_code == ErrorCode.none and a.assignment == m.encode()
        return answers
