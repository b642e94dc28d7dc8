"""The follower's fetchers: one per source broker, one Fetch for all partitions it leads (Kafka's ReplicaFetcherThread, decisions only).

Theory of operation
-------------------
A `FetcherManager` keeps, for every partition this broker follows, which
broker it fetches from. When the metadata names a new leader
(`RoleChange.follow`), `follow` moves the partition to that broker's
`ReplicaFetcher` at once, so a follower switches leaders within one
metadata update; leader -1 (none, or this broker leads) removes it.

A `ReplicaFetcher` has at most one Fetch in flight. `build_fetch` puts
every ready partition into one `FetchPlan`: fetch offset = our LEO, last
fetched epoch = the newest epoch of our log, current leader epoch = the
epoch we follow at. The leader may hold it up to
`replica.fetch.wait.max.ms`, but no longer than until the first partition
left out for a backoff may be fetched again, so a short retry is not held
behind a long poll; and for `SETTLING_MS` after a Fetch named a partition
new to this fetcher, no longer than `SETTLING_WAIT_MS`: a fenced broker's
partitions come a metadata batch at a time, and each one added while a
Fetch is parked waits for its answer. `handle_response` turns each partition's result into a
`FollowerAction` for the shell:

| result                         | action                                        |
|--------------------------------|-----------------------------------------------|
| records / none                 | append them; follower HW from the leader's HW |
| DivergingEpoch(e >= 0, end)    | truncate to `divergence.truncation_offset`    |
| OFFSET_OUT_OF_RANGE, leader's  | start over at the leader's log start          |
|   log start above our LEO      |   (Kafka's truncateFullyAndStartAt)           |
| FENCED_LEADER_EPOCH            | our metadata is stale: park the partition     |
|                                |   until `follow` names a newer epoch          |
| UNKNOWN_LEADER_EPOCH           | the leader's metadata is behind ours (it has  |
|                                |   not applied its election yet): retry after  |
|                                |   `LEADER_CATCH_UP_RETRY_MS`, not the full    |
|                                |   backoff (Kafka waits replica.fetch.backoff  |
|                                |   .ms, 1 s, a whole second of every           |
|                                |   controlled shutdown's acks=all stall)       |
| any other error, no response   | back off `replica.fetch.backoff.ms`           |

Fetch sessions (KIP-227). The first Fetch to a leader is a full one that
asks for a session (session epoch 0). Once the leader grants one, each
Fetch is incremental: it names only the partitions whose position (fetch
offset, last fetched epoch, leader epoch, log start) differs from what the
leader holds for the session (`view`), and forgets the ones no longer
fetched (moved to another leader, or backing off); the leader answers only
partitions with something new. A partition not in an answer has nothing
new: its records and HW are as before. Any failed Fetch, and the session
errors FETCH_SESSION_ID_NOT_FOUND and INVALID_FETCH_SESSION_EPOCH, end the
session: the next Fetch is a full one again. A leader that grants no
session (session id 0 in its answer) gets full fetches.

A result is applied only if it still matches the partition's state: the
same leader epoch and the same log end offset as when the Fetch was built;
anything else is a leftover of an older leader or of a truncation. The
leader's DivergingEpoch check needs no separate OffsetsForLeaderEpoch round
trip (Kafka >= 2.7 validates on every Fetch, KIP-320/595), and the follower
never truncates to its high watermark blindly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from broker.core.replication.config import ReplicationConfig
from broker.core.replication.divergence import truncation_offset
from broker.core.replication.messages import (
    NO_EPOCH,
    FetchPlan,
    FollowerAction,
    LogView,
    PartitionFetch,
    PartitionFetchResult,
    TopicIdPartition,
    next_session_epoch,
)
from quorum.metadata import NO_LEADER
from common.frozen import new_tuple

#: How soon a partition is fetched again after UNKNOWN_LEADER_EPOCH: the
#: leader is one metadata update behind us, typically a few ms.
LEADER_CATCH_UP_RETRY_MS = 25
#: How often an incremental fetch compares every followed partition with
#: the session (see `ReplicaFetcher.build_fetch`).
SESSION_SWEEP_MS = 5000
#: For this long after a Fetch named partitions new to the session, the
#: leader may hold a Fetch only `SETTLING_WAIT_MS` (see `build_fetch`).
SETTLING_MS = 1000
SETTLING_WAIT_MS = 25


@dataclasses.dataclass(slots=True)
class FollowedPartition:
    key: TopicIdPartition
    topic: str
    leader_epoch: int
    #: No Fetch for it before this time (backoff after an error).
    delayed_until_ms: int = 0
    #: The leader said our epoch is old: wait for newer metadata.
    fenced: bool = False
    #: Named in a Fetch since it was added.
    named: bool = False


class ReplicaFetcher:
    """Fetch decisions for every partition followed from `source_broker_id`."""

    def __init__(self, source_broker_id: int, replica_id: int, config: ReplicationConfig) -> None:
        self.source_broker_id = source_broker_id
        self.replica_id = replica_id
        self.config = config
        self.partitions: dict[TopicIdPartition, FollowedPartition] = {}
        #: The same keys by (topic name, partition): how an answer names them
        #: (read-only outside).
        self.keys_by_name: dict[tuple[str, int], TopicIdPartition] = {}
        self.in_flight: FetchPlan | None = None
        #: The fetch session with the leader (0: none) and its next epoch.
        self.session_id = 0
        self.session_epoch = 0
        #: Every partition of the session as the leader holds it.
        self.session: dict[TopicIdPartition, PartitionFetch] = {}
        #: Partitions whose position may differ from `session` (an
        #: incremental fetch looks at these, not at every partition).
        self._changed: set[TopicIdPartition] = set()
        #: Partitions backing off, and until when.
        self._delayed: dict[TopicIdPartition, int] = {}
        self._next_sweep_ms = 0
        #: Until when partitions are likely still being added (SETTLING_MS).
        self._settling_until_ms = 0

    def add_partition(self, key: TopicIdPartition, topic: str, leader_epoch: int) -> None:
        """Follow `key` from this broker at `leader_epoch` (ready at once)."""
        self.partitions[key] = FollowedPartition(key, topic, leader_epoch)
        self.keys_by_name[(topic, key.partition)] = key
        self._delayed.pop(key, None)
        self._changed.add(key)

    def remove_partition(self, key: TopicIdPartition) -> None:
        p = self.partitions.pop(key, None)
        if p is not None and self.keys_by_name.get((p.topic, key.partition)) == key:
            del self.keys_by_name[(p.topic, key.partition)]
        self._delayed.pop(key, None)
        self._changed.add(key)

    def log_changed(self, key: TopicIdPartition) -> None:
        """The shell appended to or truncated `key`'s log: its position moved."""
        self._changed.add(key)

    def _delay(self, p: FollowedPartition, until_ms: int) -> None:
        p.delayed_until_ms = until_ms
        self._delayed[p.key] = until_ms
        self._changed.add(p.key)

    def build_fetch(self, logs: Mapping[TopicIdPartition, LogView], broker_epoch: int,
                    now_ms: int) -> FetchPlan | None:
        """The next Fetch to send, or None (one is in flight, or no
        partition is ready: see `next_wakeup_ms`).

        An incremental fetch looks only at the partitions marked changed
        (added, removed, log moved, backing off, fenced) and the ones whose
        backoff ended; every `SESSION_SWEEP_MS` it compares them all with
        the session anyway, so a change nobody marked is sent late, never
        lost."""
        if self.in_flight is not None:
            return None
        config = self.config
        delayed = self._delayed
        for key in [k for k, until in delayed.items() if until <= now_ms]:
            del delayed[key]
            self._changed.add(key)
        next_ready_ms = min(delayed.values(), default=None)
        if self.session_id == 0 or now_ms >= self._next_sweep_ms:
            self._next_sweep_ms = now_ms + SESSION_SWEEP_MS
            candidates = list(self.partitions)
            candidates += [k for k in self.session if k not in self.partitions]
        else:
            candidates = self._changed
        self._changed = set()
        if self.session_id == 0:
            parts, forgotten = self._full(candidates, logs, now_ms), ()
            if not parts:
                return None
            self.session = {pf.key: pf for pf in parts}
        else:
            parts, forgotten = self._changes(candidates, logs, now_ms)
            if not self.session and not forgotten:
                return None
        # The leader may hold this Fetch up to replica.fetch.wait.max.ms; a
        # partition left out for a backoff waits for its answer. Right after
        # an election most partitions are answered UNKNOWN_LEADER_EPOCH by a
        # leader still applying it, and each waited a whole long poll
        # (500 ms) instead of LEADER_CATCH_UP_RETRY_MS: ask for an answer by
        # the time the first of them may be fetched again.
        max_wait_ms = config.replica_fetch_wait_max_ms
        if next_ready_ms is not None:
            max_wait_ms = min(max_wait_ms, next_ready_ms - now_ms)
        # Partitions come in batches when a broker fails (the controller
        # moves its partitions 500 per metadata batch), and one added while
        # a Fetch is in flight waits for its answer: on an idle session, a
        # whole long poll (500 ms), and every batch's first commit with it.
        # So while they come, the leader may hold a Fetch only briefly.
        if now_ms < self._settling_until_ms:
            max_wait_ms = min(max_wait_ms, SETTLING_WAIT_MS)
        self.in_flight = FetchPlan(self.source_broker_id, self.replica_id, broker_epoch, max_wait_ms,
                                   config.replica_fetch_min_bytes, config.replica_fetch_response_max_bytes,
                                   parts, self.session_id, self.session_epoch, forgotten, self.session)
        return self.in_flight

    def _full(self, candidates, logs: Mapping[TopicIdPartition, LogView], now_ms: int) -> tuple[PartitionFetch, ...]:
        """Every partition a full fetch names."""
        parts = []
        for key in candidates:
            p = self.partitions.get(key)
            if p is not None and not p.fenced and p.delayed_until_ms <= now_ms:
                parts.append(self._named(p, self._position(p, logs[key]), now_ms))
        return tuple(parts)

    def _position(self, p: FollowedPartition, log: LogView) -> PartitionFetch:
        """What a Fetch says of ready partition `p` now (its log is `log`).
        Built with `new_tuple`: the NamedTuple's own `__new__` is a Python
        call, per partition named in a fence's rounds."""
        return new_tuple(PartitionFetch, (p.key, p.topic, log.log_end_offset, log.latest_epoch, p.leader_epoch,
                                          log.log_start_offset, self.config.replica_fetch_max_bytes))

    def _named(self, p: FollowedPartition, pf: PartitionFetch, now_ms: int) -> PartitionFetch:
        """`pf` goes in the Fetch (for `p` the first time: the settling wait starts)."""
        if not p.named:
            p.named = True
            self._settling_until_ms = now_ms + SETTLING_MS
        return pf

    def _changes(self, candidates, logs: Mapping[TopicIdPartition, LogView], now_ms: int,
                 ) -> tuple[tuple[PartitionFetch, ...], tuple[PartitionFetch, ...]]:
        """The partitions an incremental fetch names (new or moved) and
        forgets (in the session, not fetched now); the session follows.
        One pass, each partition looked up once in each dict: a fence names
        thousands of partitions per follower round, and the cost shows in
        `raftka bench failover --led-partitions 10000 --acks all` as the
        cluster's CPU per partition moved."""
        session = self.session
        partitions = self.partitions
        named = []
        forgotten = []
        for key in candidates:
            p = partitions.get(key)
            if p is None or p.fenced or p.delayed_until_ms > now_ms:
                if key in session:
                    forgotten.append(session.pop(key))
                continue
            pf = self._position(p, logs[key])
            if session.get(key) != pf:
                session[key] = pf
                named.append(self._named(p, pf, now_ms))
        return tuple(named), tuple(forgotten)

    def end_session(self) -> None:
        """Start over with a full fetch (the leader lost or refused the session)."""
        self.session_id = 0
        self.session_epoch = 0
        self.session = {}

    def on_session_error(self, plan: FetchPlan) -> None:
        """The answer to `plan` was FETCH_SESSION_ID_NOT_FOUND or
        INVALID_FETCH_SESSION_EPOCH: a full fetch next, with no backoff."""
        assert plan is self.in_flight, "a response to a Fetch that is not in flight"
        self.in_flight = None
        self.end_session()

    def handle_response(self, plan: FetchPlan, results: Mapping[TopicIdPartition, PartitionFetchResult] | None,
                        logs: Mapping[TopicIdPartition, LogView], now_ms: int,
                        session_id: int = 0) -> list[FollowerAction]:
        """Turn the response to `plan` into actions (None: the Fetch failed
        as a whole -- no connection, timeout, top-level error). `session_id`:
        the answer's (a full fetch's answer grants a session with it)."""
        assert plan is self.in_flight, "a response to a Fetch that is not in flight"
        self.in_flight = None
        if results is None:
            self.end_session()
            backoff_until = now_ms + self.config.replica_fetch_backoff_ms
            for key in plan.view:
                p = self.partitions.get(key)
                if p is not None:
                    self._delay(p, backoff_until)
            return []
        if plan.session_id == 0:
            if session_id == 0:
                self.end_session()
            else:
                self.session_id, self.session_epoch = session_id, 1
        else:
            self.session_epoch = next_session_epoch(self.session_epoch)
        actions = []
        append = actions.append
        view = plan.view
        partitions = self.partitions
        none = ErrorCode.none  # an enum member's lookup on its class costs 0.13 us
        for key, result in results.items():
            sent = view.get(key)
            p = partitions.get(key)
            if sent is None or p is None or p.leader_epoch != sent.current_leader_epoch:
                continue  # moved to another leader or epoch meanwhile
            log = logs.get(key)
            if log is None or log.log_end_offset != sent.fetch_offset:
                self._changed.add(key)
                continue  # the log changed meanwhile (a truncation)
            if result.error == none and result.diverging_epoch is None:
                # `_decide`'s common case, inline (with the lookups hoisted
                # above): a fence answers thousands of partitions a round,
                # each this way, so a Python call per partition would show
                # in `raftka bench failover --led-partitions 10000 --acks all`.
                append(new_tuple(FollowerAction, (key, None, None, result.records, result.high_watermark, none,
                                                  result.log_start_offset)))
            else:
                append(self._decide(p, sent, result, log, now_ms))
        return actions

    def _decide(self, p: FollowedPartition, sent: PartitionFetch, result: PartitionFetchResult, log: LogView,
                now_ms: int) -> FollowerAction:
        error = result.error
        if error == ErrorCode.none:
            diverging = result.diverging_epoch
            if diverging is None:
                return FollowerAction(p.key, records=result.records, leader_high_watermark=result.high_watermark,
                                      leader_log_start_offset=result.log_start_offset)
            offset, _complete = truncation_offset(log, diverging)
            # The leader's HW is not adopted here: until a Fetch succeeds,
            # our log past the common prefix is not known to be the leader's.
            return FollowerAction(p.key, truncate_to=offset)
        if error == ErrorCode.offset_out_of_range and result.log_start_offset >= 0 and (
                result.log_start_offset > sent.fetch_offset or sent.last_fetched_epoch == NO_EPOCH):
            return FollowerAction(p.key, start_at=result.log_start_offset)
        if error == ErrorCode.fenced_leader_epoch:
            p.fenced = True
            self._changed.add(p.key)
        elif error == ErrorCode.unknown_leader_epoch:
            self._delay(p, now_ms + min(self.config.replica_fetch_backoff_ms, LEADER_CATCH_UP_RETRY_MS))
        else:
            self._delay(p, now_ms + self.config.replica_fetch_backoff_ms)
        return FollowerAction(p.key, error=error)

    def on_append_failed(self, key: TopicIdPartition, now_ms: int) -> None:
        """The shell could not apply an action (a corrupt batch, an append
        at the wrong offset, a disk error): back off."""
        p = self.partitions.get(key)
        if p is not None:
            self._delay(p, now_ms + self.config.replica_fetch_backoff_ms)

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When `build_fetch` may next return a Fetch (None: not before a
        response or a change of partitions)."""
        if self.in_flight is not None:
            return None
        times = [max(p.delayed_until_ms, now_ms) for p in self.partitions.values() if not p.fenced]
        return min(times, default=None)


class FetcherManager:
    """Which source broker each followed partition is fetched from (Kafka's ReplicaFetcherManager)."""

    def __init__(self, replica_id: int, config: ReplicationConfig | None = None) -> None:
        self.replica_id = replica_id
        self.config = config or ReplicationConfig()
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._source: dict[TopicIdPartition, int] = {}

    def follow(self, key: TopicIdPartition, topic: str, leader_id: int, leader_epoch: int) -> tuple[int | None, int | None]:
        """Fetch `key` from `leader_id` at `leader_epoch` (-1: fetch it from
        nowhere). Returns (old source, new source) so the shell can wake or
        stop those fetchers; a fetcher left with no partitions is dropped."""
        old = self._source.pop(key, None)
        if old is not None:
            fetcher = self.fetchers[old]
            fetcher.remove_partition(key)
            if not fetcher.partitions and fetcher.in_flight is None:
                del self.fetchers[old]
        if leader_id == NO_LEADER or leader_id == self.replica_id:
            return old, None
        fetcher = self.fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self.fetchers[leader_id] = ReplicaFetcher(leader_id, self.replica_id, self.config)
        fetcher.add_partition(key, topic, leader_epoch)
        self._source[key] = leader_id
        return old, leader_id

    def unfollow(self, key: TopicIdPartition) -> int | None:
        return self.follow(key, "", NO_LEADER, NO_EPOCH)[0]

    def source_of(self, key: TopicIdPartition) -> int | None:
        return self._source.get(key)

    def fetcher(self, source_broker_id: int) -> ReplicaFetcher | None:
        return self.fetchers.get(source_broker_id)

    def on_response_done(self, source_broker_id: int) -> None:
        """Drop a fetcher that was emptied while its Fetch was in flight."""
        fetcher = self.fetchers.get(source_broker_id)
        if fetcher is not None and not fetcher.partitions and fetcher.in_flight is None:
            del self.fetchers[source_broker_id]
