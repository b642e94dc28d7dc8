"""Coordinator failover: a shard rebuilt by replaying the records of its
`__consumer_offsets` partition holds the same durable state as the shard
that wrote them: every committed offset, and every group as of its last
stable point (Stable or Empty: generation, leader, protocol, members with
their assignments). Hypothesis drives random clients (dynamic and static,
old and new API versions) through joins, syncs, heartbeats, leaves,
commits, deletes and clock jumps, and checks after every step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.core.group import GroupCoordinatorConfig, GroupCoordinatorShard
from broker.core.group.classic_group import GroupState
from broker.core.group.records import decode_record
from group_testing import (
    Harness,
    commit_request,
    heartbeat_request,
    join_request,
    kio_module,
    leave_request,
    subscription,
    sync_request,
)

CONFIG = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=500, group_min_session_timeout_ms=1_000,
                                offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
GROUPS = ("g1", "g2")
CLIENTS = {"c0": None, "c1": None, "c2": None, "s0": "i0", "s1": "i1"}
PROTOCOLS = [
    (("range", subscription("t")),),
    (("roundrobin", subscription("t", "u")), ("range", subscription("t"))),
    (("range", subscription("u")),),
]


def durable_view(shard: GroupCoordinatorShard) -> tuple[dict, dict]:
    """What must survive a failover: stable groups and all offsets."""
    groups = {}
    for group_id, g in shard.groups.items():
        if g.state not in (GroupState.STABLE, GroupState.EMPTY):
            continue
        groups[group_id] = (
            g.state, g.generation_id, g.protocol_type or None, g.protocol_name, g.leader_id,
            g.current_state_timestamp_ms, g.subscribed_topics, dict(g.static_members),
            tuple((m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                   m.session_timeout_ms, m.metadata(g.protocol_name), m.assignment) for m in g.members.values()),
        )
    offsets = {group_id: dict(by_tp) for group_id, by_tp in shard.offsets.by_group.items()}
    return groups, offsets


def replayed(h: Harness) -> GroupCoordinatorShard:
    shard = GroupCoordinatorShard(h.partition, h.config, random.Random(0))
    for record in h.log:
        shard.replay(record.key, record.value)
    shard.on_loaded(h.now_ms)
    return shard


def assert_replay_equal(h: Harness) -> None:
    live_groups, live_offsets = durable_view(h.shard)
    rebuilt = replayed(h)
    again_groups, again_offsets = durable_view(rebuilt)
    assert again_offsets == live_offsets
    for group_id, view in live_groups.items():
        assert again_groups.get(group_id) == view, f"group {group_id} differs after replay"
    # Nothing is resurrected: a group gone live is gone after replay.
    assert set(rebuilt.groups) <= set(h.shard.groups)


@dataclass
class Client:
    name: str
    instance_id: str | None
    member_id: dict[str, str] = field(default_factory=dict)
    generation: dict[str, int] = field(default_factory=dict)
    members_to_assign: dict[str, list[str]] = field(default_factory=dict)
    #: group -> "none" (must join), "joined" (must sync), "stable"
    phase: dict[str, str] = field(default_factory=dict)
    #: group -> tokens of its requests still parked
    parked: dict[str, set[int]] = field(default_factory=dict)


class World:
    """Clients that mostly follow the protocol (`poll` does what a consumer
    would do next) plus arbitrary requests, restarts and clock jumps."""

    def __init__(self, seed: int) -> None:
        self.h = Harness(CONFIG, seed=seed)
        self.clients = {n: Client(n, i) for n, i in CLIENTS.items()}
        self.waiting: dict[int, tuple[Client, str, str]] = {}
        self.sent: list[int] = []
        self.generations: dict[str, int] = {}

    def send(self, client: Client, group: str, kind: str, request) -> int:
        token = self.h.send(request, client_id=client.name)
        self.sent.append(token)
        self.waiting[token] = (client, group, kind)
        client.parked.setdefault(group, set()).add(token)
        self.collect()
        return token

    def collect(self) -> None:
        for token in [t for t in self.waiting if t in self.h.responses]:
            client, group, kind = self.waiting.pop(token)
            client.parked[group].discard(token)
            self.learn(client, group, kind, self.h.responses[token])

    def learn(self, client: Client, group: str, kind: str, response) -> None:
        error = getattr(response, "error_code", ErrorCode.none)
        if kind == "join":
            if error == ErrorCode.member_id_required:
                client.member_id[group] = response.member_id
                client.phase[group] = "none"
            elif error == ErrorCode.none:
                client.member_id[group] = response.member_id
                client.generation[group] = response.generation_id
                client.members_to_assign[group] = [m.member_id for m in response.members]
                client.phase[group] = "joined"
                assert response.generation_id >= self.generations.get(group, 0), "generations never go back"
                self.generations[group] = response.generation_id
        elif kind == "sync" and error == ErrorCode.none:
            client.phase[group] = "stable"
        if error in (ErrorCode.unknown_member_id, ErrorCode.fenced_instance_id, ErrorCode.illegal_generation):
            client.member_id.pop(group, None)
            client.generation.pop(group, None)
            client.phase[group] = "none"
        elif error == ErrorCode.rebalance_in_progress:
            client.phase[group] = "none"

    def join(self, client: Client, group: str, version: int, protocols: int, restart: bool = False) -> None:
        inst = client.instance_id
        if inst is not None:
            version = max(version, 5)
        member_id = "" if restart else client.member_id.get(group, "")
        self.send(client, group, "join", join_request(group, member_id, version=version, instance_id=inst,
                                                      session_ms=6_000, rebalance_ms=8_000,
                                                      protocols=PROTOCOLS[protocols]))
        if client.phase.get(group) == "none" and client.member_id.get(group) and not member_id:
            # MEMBER_ID_REQUIRED: a client rejoins with the id at once.
            self.join(client, group, version, protocols)

    def sync(self, client: Client, group: str) -> None:
        generation = client.generation.get(group, -1)
        plan = {m: f"{m}@{generation}".encode() for m in client.members_to_assign.get(group, [])}
        self.send(client, group, "sync", sync_request(group, client.member_id.get(group, ""), generation, plan,
                                                      instance_id=client.instance_id))

    def poll(self, client: Client, group: str) -> None:
        if client.parked.get(group):
            return
        phase = client.phase.get(group, "none")
        if phase == "none":
            self.join(client, group, 5, 0)
        elif phase == "joined":
            self.sync(client, group)
        else:
            self.send(client, group, "heartbeat", heartbeat_request(
                group, client.member_id.get(group, ""), client.generation.get(group, -1),
                instance_id=client.instance_id))

    def step(self, op: tuple) -> None:
        self._step(op)
        for group in GROUPS:
            if group not in self.h.shard.groups:
                self.generations.pop(group, None)  # deleted: a new group starts over

    def _step(self, op: tuple) -> None:
        kind = op[0]
        if kind == "advance":
            self.h.advance(op[1])
            self.collect()
            return
        if kind == "delete":
            self.h.send(kio_module("delete_groups", 1).DeleteGroupsRequest(groups_names=(op[1],)))
            return
        _, name, group, *args = op
        client = self.clients[name]
        member_id = client.member_id.get(group, "")
        generation = client.generation.get(group, -1)
        inst = client.instance_id
        if kind == "poll":
            self.poll(client, group)
        elif kind == "restart":
            # A static member's process restarts: it joins again without its id.
            self.join(client, group, 5, 0, restart=True)
        elif kind == "join":
            self.join(client, group, args[0], args[1], restart=args[2])
        elif kind == "sync":
            self.sync(client, group)
        elif kind == "leave":
            self.send(client, group, "leave", leave_request(group, (member_id, inst), version=args[0]))
        elif kind == "commit":
            partition, offset, as_member = args
            request = (commit_request(group, {("t", partition): offset}, member_id=member_id, generation=generation,
                                      instance_id=inst)
                       if as_member else commit_request(group, {("t", partition): offset}))
            self.send(client, group, "commit", request)


names = st.sampled_from(sorted(CLIENTS))
groups = st.sampled_from(GROUPS)
poll = st.tuples(st.just("poll"), names, groups)
small_advance = st.tuples(st.just("advance"), st.sampled_from([100, 300, 600]))
ops = st.one_of(
    poll, poll, poll, poll, poll, poll, small_advance, small_advance,
    st.tuples(st.just("advance"), st.sampled_from([0, 3_000, 7_000, 30_000])),
    st.tuples(st.just("join"), names, groups, st.sampled_from([1, 3, 5, 7, 9]), st.integers(0, len(PROTOCOLS) - 1),
              st.booleans()),
    st.tuples(st.just("sync"), names, groups),
    st.tuples(st.just("restart"), st.sampled_from(["s0", "s1"]), groups),
    st.tuples(st.just("leave"), names, groups, st.sampled_from([0, 3])),
    st.tuples(st.just("commit"), names, groups, st.integers(0, 2), st.integers(0, 100), st.booleans()),
    st.tuples(st.just("delete"), groups),
)


@settings(deadline=None)
@given(st.lists(ops, min_size=15, max_size=60), st.integers(0, 2**16))
def test_replaying_the_log_rebuilds_the_durable_state(steps: list[tuple], seed: int) -> None:
    world = World(seed)
    for op in steps:
        world.step(op)
        assert_replay_equal(world.h)
    # Every request is answered exactly once, the parked ones at the latest
    # when the shard unloads.
    world.h.absorb(world.h.shard.unload())
    assert all(t in world.h.responses for t in world.sent)


def test_a_full_life_replays_equal_at_each_stable_point() -> None:
    h = Harness(CONFIG)
    leader, f1, f2 = h.form_group(3)
    h.call(commit_request("g", {("t", 0): 5}, member_id=f1.member_id, generation=1))
    assert_replay_equal(h)
    h.call(leave_request("g", (f2.member_id, None)))
    tokens = [h.send(join_request("g", m.member_id)) for m in (leader, f1)]
    joins = [h.responses[t] for t in tokens]
    h.sync_all("g", joins)
    assert_replay_equal(h)
    rebuilt = replayed(h)
    g = rebuilt.groups["g"]
    assert g.state is GroupState.STABLE and g.generation_id == 2 and g.leader_id == leader.member_id
    assert {m: x.assignment for m, x in g.members.items()} == {leader.member_id: leader.member_id.encode(),
                                                               f1.member_id: f1.member_id.encode()}
    # The loaded members' sessions start at load time: silent ones expire.
    rebuilt_h = Harness(CONFIG)
    rebuilt_h.shard = rebuilt
    rebuilt_h.now_ms = h.now_ms
    rebuilt_h.advance(10_000)
    assert rebuilt.groups["g"].state is GroupState.EMPTY and rebuilt.groups["g"].generation_id == 3


def test_a_static_member_restart_in_a_stable_group_replays_equal() -> None:
    h = Harness(CONFIG)
    tokens = [h.send(join_request("g", "", instance_id=f"i{k}")) for k in range(2)]
    h.advance_until_answered(tokens)
    h.sync_all("g", [h.responses[t] for t in tokens])
    restarted = h.call(join_request("g", "", instance_id="i1"))
    assert restarted.error_code == ErrorCode.none and h.group().state is GroupState.STABLE
    assert_replay_equal(h)
    assert restarted.member_id in replayed(h).groups["g"].members


def test_records_decode_in_log_order() -> None:
    h = Harness(CONFIG)
    h.form_group(2)
    kinds = [type(decode_record(r.key, r.value)[0]).__name__ for r in h.log]
    assert kinds == ["GroupMetadataKey", "GroupMetadataKey"]
