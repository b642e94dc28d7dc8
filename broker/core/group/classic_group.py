"""One consumer group of Kafka's classic protocol, and its members (pure).

Theory of operation
-------------------
A `ClassicGroup` is the coordinator's view of one group: its members (each
with the protocols it supports and the session it must keep alive), the
generation, the elected leader and chosen protocol, and the requests
parked until a rebalance phase ends. It holds no clock: every deadline is
a `*_deadline_ms` the shard compares with the `now_ms` it is given.

States and transitions (Kafka's `ClassicGroupState`):

    Empty               => PreparingRebalance:  a member joins (the initial
                                                rebalance waits
                                                `group.initial.rebalance.delay.ms`)
    PreparingRebalance  => CompletingRebalance: every known member rejoined, or
                                                the rebalance timeout passed
                                                (a new generation, a leader)
    PreparingRebalance  => Empty:               the join phase ended with no
                                                member left (generation bumps)
    CompletingRebalance => Stable:              the leader's SyncGroup brought
                                                the assignment
    CompletingRebalance => PreparingRebalance:  a member joined, left, changed
                                                protocols or timed out
    Stable              => PreparingRebalance:  the same, or the leader rejoined

A group that is deleted (DeleteGroups, or swept empty by retention) leaves
the shard's map at once: Kafka's transient `Dead` state is never kept.

Static membership (KIP-345): a member with a `group.instance.id` keeps its
place across restarts. The group maps each instance id to the member id
currently holding it; a JoinGroup of that instance id with an unknown
member id replaces the old member id (`replace_static_member`), and any
request still carrying the old id is answered FENCED_INSTANCE_ID. After a
coordinator failover the holder is what the log says, which may be older
than the id the instance's process uses (a rebalance's member ids are
stored when its SyncGroup ends): until the loaded holder is heard from, a
different id of its instance gets UNKNOWN_MEMBER_ID (the client rejoins
without an id and takes the place back) instead of the fatal fence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from types import ModuleType

from kio.schema.errors import ErrorCode

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


_VALID_PREVIOUS = {
    GroupState.PREPARING_REBALANCE: {GroupState.EMPTY, GroupState.COMPLETING_REBALANCE, GroupState.STABLE},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


@dataclass(frozen=True, slots=True)
class Parked:
    """A JoinGroup or SyncGroup waiting for its phase to end: the caller's
    token and the kio module of the response version to answer with."""

    token: Hashable
    reply: ModuleType


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    #: (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    #: A member added in this rebalance: its session may expire even while
    #: its JoinGroup is parked (Kafka's `isNew`).
    is_new: bool = False
    awaiting_join: Parked | None = None
    awaiting_sync: Parked | None = None
    heartbeat_deadline_ms: int | None = None
    #: Loaded from the log by this coordinator and not heard from since:
    #: its client may have moved on to a member id the log never got.
    unconfirmed: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def vote(self, candidates: set[str]) -> str:
        """The first of this member's protocols that every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise AssertionError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        # A rejoining or syncing member is alive by definition; a new member
        # is not (it may have given up on its parked JoinGroup).
        if self.is_new:
            return False
        return self.awaiting_join is not None or self.awaiting_sync is not None


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState | None = None
    #: When the group last changed state (stored, drives offset retention
    #: of empty groups).
    current_state_timestamp_ms: int = -1
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: group.instance.id -> the member id holding it.
    static_members: dict[str, str] = field(default_factory=dict)
    #: KIP-394: member ids handed out with MEMBER_ID_REQUIRED -> the deadline
    #: by which they must join with it.
    pending_join_members: dict[str, int] = field(default_factory=dict)
    #: Members of the new generation that have not sent SyncGroup yet.
    pending_sync_members: set[str] = field(default_factory=set)
    supported_protocols: Counter = field(default_factory=Counter)
    #: Topics the members subscribe to (consumer protocol), computed at each
    #: new generation; None when not known.
    subscribed_topics: frozenset[str] | None = None
    #: Set when a member joins during the initial rebalance (it is extended).
    new_member_added: bool = False
    join_deadline_ms: int | None = None
    #: During the initial rebalance: (this delay, the rebalance time left).
    initial_rebalance: tuple[int, int] | None = None
    sync_deadline_ms: int | None = None
    sync_deadline_generation: int = -1

    # --- queries ---------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    def has_all_members_joined(self) -> bool:
        return self.num_awaiting_join() == len(self.members) and not self.pending_join_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        # Unknown subscriptions count as subscribed only for the consumer
        # protocol, where offsets belong to topics the members may still use.
        if self.subscribed_topics is None:
            return self.uses_consumer_protocol()
        return topic in self.subscribed_topics

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Whether a member with these protocols may join: an empty group
        takes any non-empty type and list; otherwise the type must match and
        one of the names must be supported by every current member."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        return any(self.supported_protocols[n] == len(self.members) for n in names)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those all
        members support; the most votes wins (ties: the smaller name, where
        Kafka's choice depends on hash-map order)."""
        assert self.members, "cannot select a protocol for a group without members"
        candidates = {n for n, count in self.supported_protocols.items() if count == len(self.members)}
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return min(votes, key=lambda name: (-votes[name], name))

    def validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
        """None if the request's identity is current (its member is then
        known live); else FENCED_INSTANCE_ID (a static member's older
        incarnation) or UNKNOWN_MEMBER_ID."""
        if group_instance_id is not None:
            holder = self.static_members.get(group_instance_id)
            if holder is None:
                return ErrorCode.unknown_member_id
            if holder != member_id:
                if self.members[holder].unconfirmed:
                    # The holder is only what the log says: a member id
                    # handed out in a rebalance is stored when its SyncGroup
                    # ends (or a failed write reverted it), so after a
                    # coordinator failover the instance's one process may
                    # ask with a newer id. Fencing is fatal to it; it rejoins
                    # without an id instead and takes its place back.
                    return ErrorCode.unknown_member_id
                return ErrorCode.fenced_instance_id
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        member.unconfirmed = False
        return None

    # --- changes -----------------------------------------------------------

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        assert self.state in _VALID_PREVIOUS[state], f"group {self.group_id}: {self.state} => {state} is not allowed"
        self.previous_state = self.state
        self.state = state
        self.current_state_timestamp_ms = now_ms

    def add(self, member: Member) -> None:
        assert member.member_id not in self.members, f"member {member.member_id} is already in the group"
        if member.group_instance_id is not None:
            assert member.group_instance_id not in self.static_members, "static member is already in the group"
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        assert self.protocol_type == member.protocol_type, "the group and member's protocol type must match"
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        self.pending_join_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names())
            self.supported_protocols += Counter()  # drop zero counts
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            # Kafka takes the next member in hash-map order; the oldest is
            # deterministic.
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.pop(member_id, None)
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: tuple[tuple[str, bytes], ...],
                      rebalance_timeout_ms: int, session_timeout_ms: int) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        self.supported_protocols += Counter()
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> Member:
        """The static member `group_instance_id` now answers to a new member
        id; the old member (and whatever it had parked) is returned so the
        caller can fence it."""
        old = self.members.pop(old_member_id)
        new = Member(
            member_id=new_member_id, group_instance_id=group_instance_id, client_id=old.client_id,
            client_host=old.client_host, rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms, protocol_type=old.protocol_type,
            protocols=old.protocols, assignment=old.assignment,
        )
        self.members[new_member_id] = new
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        self.pending_sync_members.discard(old_member_id)
        return new

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick the first member that
        did; False when no member rejoined (or there is no leader)."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join is not None:
            return True
        for member in self.members.values():
            if member.awaiting_join is not None:
                self.leader_id = member.member_id
                return True
        return False

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.subscribed_topics = self.compute_subscribed_topics()
        self.pending_sync_members.clear()

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """The union of the members' subscribed topics (consumer protocol
        only; None when unknown or unparsable, as Kafka)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscription_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return frozenset(topics)


def parse_subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a ConsumerProtocolSubscription (every version starts
    with an int16 version and v0's topic array); None if malformed."""
    if len(metadata) < 6:
        return None
    count = int.from_bytes(metadata[2:6], "big", signed=True)
    if count < 0:
        return None
    pos = 6
    topics = []
    for _ in range(count):
        if pos + 2 > len(metadata):
            return None
        n = int.from_bytes(metadata[pos:pos + 2], "big", signed=True)
        pos += 2
        if n < 0 or pos + n > len(metadata):
            return None
        try:
            topics.append(metadata[pos:pos + n].decode("utf-8"))
        except UnicodeDecodeError:
            return None
        pos += n
    return topics
