"""Incremental fetch sessions (KIP-227), leader side: the session cache and what one session remembers.

Theory of operation
-------------------
A follower's Fetch names every partition it follows from this broker:
thousands of them after a broker fails. Without a session every
replication round costs both ends O(partitions) -- decode, validate, read,
encode -- although a round typically moves a few. With a session the leader
remembers each partition's fetch position (the last one the follower sent)
and what it last answered (HW, log start offset). An incremental Fetch
names only the partitions whose position changed, plus the ones it drops
(`forgotten_topics_data`); its answer names only partitions with something
new: records, an error, a DivergingEpoch, or a HW or log start offset other
than the one last sent.

Which partitions may have something new is kept by the session, not found
by reading all of them (Kafka reads every session partition on every
fetch): a session subscribes to each partition it holds
(`HostedPartition.sessions`), and every `notify` -- an append, a HW move, a
leadership change, the replica stopping -- marks that partition *dirty* and
sets `changed`, which a parked fetch of the session waits on. A fetch reads
the partitions it names and the dirty ones. A partition read stays dirty
while the follower has not confirmed everything the leader holds (its fetch
offset below the leader's LEO: records sent but not yet acknowledged by a
new position, or left out for `max_bytes`), while its answer is an error,
or while the follower is outside its ISR: it is read, and sent, again on
the next fetch, as Kafka would. The last matters because a follower joins
the ISR when the leader handles one of its fetches: a follower that caught
up while it was not yet eligible (a restarted broker before the leader's
metadata shows it unfenced, KIP-841) would otherwise never be looked at
again, since its position no longer changes.

A partition this broker would answer UNKNOWN_LEADER_EPOCH -- the follower
has seen an election this broker has not applied yet, typically by a few
hundred milliseconds after a broker failure -- is not answered at all
until it has, and not read again until then: the election's `notify`
marks it dirty and wakes the parked fetch. (Kept dirty meanwhile, it was
read again on every wake of the session, which after a broker failure
came from every append and HW move of the partitions already moved.)
Kafka answers the error and the follower backs off; with thousands
of partitions that cost two extra rounds over all of them (the errors, then
the follower naming them all again) at the moment a failover is waiting
for its first commit.

Protocol (`session_id`, `session_epoch` of the request; Kafka's FetchMetadata):

| id | epoch | meaning                                                  |
|----|-------|----------------------------------------------------------|
| 0  | -1    | full fetch, no session (consumers, older clients)        |
| 0  | 0     | full fetch that creates a session; its id in the answer  |
| S  | 0     | close S, then a full fetch that creates a new session    |
| S  | -1    | close S, then a full fetch with no session               |
| S  | n > 0 | the n-th incremental fetch of S                          |

An unknown S is answered FETCH_SESSION_ID_NOT_FOUND, an epoch other than
the session's next one INVALID_FETCH_SESSION_EPOCH, both with no
partitions; the client starts over with a full fetch.

Sessions are made for followers only (replica id >= 0) fetching at v12 or
later, whose partitions carry the last fetched epoch: a consumer or an
older follower asking for one gets session id 0 and keeps sending full
fetches, which Kafka allows (its brokers do the same when the cache is full). A follower has one
fetcher per leader, so its new session replaces its older one here. The
cache holds at most `max.incremental.fetch.session.cache.slots` sessions;
when it is full, one unused for `min.incremental.fetch.session.eviction.ms`
makes room, or no session is made.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import trio
from kio.schema.errors import ErrorCode

from broker.core.replication.messages import MAX_SESSION_EPOCH, next_session_epoch

#: Kafka's defaults for `max.incremental.fetch.session.cache.slots` and
#: `min.incremental.fetch.session.eviction.ms`.
DEFAULT_CACHE_SLOTS = 1000
DEFAULT_EVICTION_MS = 120_000


class SessionPartition:
    """One partition of a session: the follower's position as it last sent
    it, and what this broker last answered. It has the attribute names of a
    Fetch request's partition, so the read path takes either."""

    __slots__ = ("topic", "partition", "fetch_offset", "last_fetched_epoch", "current_leader_epoch",
                 "log_start_offset", "partition_max_bytes", "high_watermark_sent", "log_start_offset_sent",
                 "hosted", "recorded_by")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        #: Nothing answered yet: the first answer names it whatever it holds.
        self.high_watermark_sent: int | None = None
        self.log_start_offset_sent: int | None = None
        #: The HostedPartition this session is subscribed to (None: none).
        self.hosted = None
        #: The leadership (a `LeaderState`) that took this position into
        #: its accounting, or None: see `broker.api.fetch._read_session`.
        self.recorded_by = None

    def update(self, fp) -> None:
        """Adopt the position a Fetch request's partition carries."""
        self.recorded_by = None
        self.fetch_offset = fp.fetch_offset
        self.last_fetched_epoch = fp.last_fetched_epoch
        self.current_leader_epoch = fp.current_leader_epoch
        self.log_start_offset = fp.log_start_offset
        self.partition_max_bytes = fp.partition_max_bytes


class FetchSession:
    """One follower's session: its partitions, in the order it added them."""

    __slots__ = ("session_id", "replica_id", "next_epoch", "partitions", "dirty", "changed", "last_used_ms")

    def __init__(self, session_id: int, replica_id: int, now_ms: int) -> None:
        self.session_id = session_id
        self.replica_id = replica_id
        self.next_epoch = 1
        self.partitions: dict[tuple[str, int], SessionPartition] = {}
        #: Partitions to read on the next pass (a dict: insertion order).
        self.dirty: dict[SessionPartition, None] = {}
        #: Set when a partition becomes dirty; a parked fetch waits on it.
        self.changed = trio.Event()
        self.last_used_ms = now_ms

    def begin_fetch(self, topics, forgotten: Iterable, now_ms: int, *, incremental: bool) -> list[SessionPartition]:
        """Take a request's partitions into the session (and drop its
        forgotten ones); an incremental fetch moves the epoch on (the full
        fetch that made the session is followed by epoch 1). Returns the
        partitions named."""
        if incremental:
            self.next_epoch = next_session_epoch(self.next_epoch)
        self.last_used_ms = now_ms
        for topic in forgotten:
            for partition in topic.partitions:
                sp = self.partitions.pop((topic.topic, partition), None)
                if sp is not None:
                    self.dirty.pop(sp, None)
                    self._bind(sp, None)
        named = []
        partitions = self.partitions
        for topic in topics:
            name = topic.topic
            for fp in topic.partitions:
                sp = partitions.get((name, fp.partition))
                if sp is None:
                    sp = partitions[(name, fp.partition)] = SessionPartition(name, fp.partition)
                sp.update(fp)
                named.append(sp)
        return named

    def mark_dirty(self, sp: SessionPartition) -> None:
        self.dirty[sp] = None
        self.changed.set()

    def bind(self, sp: SessionPartition, hosted) -> None:
        """Subscribe `sp` to `hosted` (the partition now hosted under its name, or None)."""
        if sp.hosted is not hosted:
            self._bind(sp, hosted)

    def _bind(self, sp: SessionPartition, hosted) -> None:
        if sp.hosted is not None:
            sp.hosted.sessions.pop(self, None)
        sp.hosted = hosted
        if hosted is not None:
            hosted.sessions[self] = sp

    def close(self) -> None:
        for sp in self.partitions.values():
            self._bind(sp, None)
        self.partitions.clear()
        self.dirty.clear()


class FetchSessionCache:
    """The sessions of this broker, by id (Kafka's FetchSessionCache)."""

    def __init__(self, max_slots: int = DEFAULT_CACHE_SLOTS, eviction_ms: int = DEFAULT_EVICTION_MS,
                 rng: random.Random | None = None) -> None:
        assert max_slots >= 0 and eviction_ms >= 0
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def open_for(self, session_id: int, epoch: int, replica_id: int,
                 clock_ms: Callable[[], int]) -> tuple[ErrorCode, FetchSession | None]:
        """What a Fetch's (`session_id`, `epoch`) asks for, by the table in
        the module docstring: an error to answer with no partitions, or the
        session to fetch in (None: a full fetch with no session). A session
        returned for epoch 0 was just made: its fetch is a full one. The
        clock is read only then (a consumer's Fetch reads none)."""
        if session_id != 0:
            session = self.sessions.get(session_id)
            owned = session is not None and session.replica_id == replica_id
            if epoch > 0:
                if not owned:
                    return ErrorCode.fetch_session_id_not_found, None
                if epoch != session.next_epoch:
                    return ErrorCode.invalid_fetch_session_epoch, None
                return ErrorCode.none, session
            if epoch != -1 and epoch != 0:
                return ErrorCode.fetch_session_id_not_found, None
            if owned:
                self.close(session_id)
        elif epoch != -1 and epoch != 0:
            return ErrorCode.invalid_fetch_session_epoch, None
        if epoch == 0 and replica_id >= 0:
            return ErrorCode.none, self.create(replica_id, clock_ms())
        return ErrorCode.none, None

    def create(self, replica_id: int, now_ms: int) -> FetchSession | None:
        """A new session for the follower `replica_id` (its older ones here
        closed), or None when the cache is full of sessions in use."""
        for old in [s for s in self.sessions.values() if s.replica_id == replica_id]:
            self.close(old.session_id)
        if len(self.sessions) >= self.max_slots and not self._evict_one(now_ms):
            return None
        session_id = 0
        while session_id == 0 or session_id in self.sessions:
            session_id = self._rng.randrange(1, MAX_SESSION_EPOCH)
        session = self.sessions[session_id] = FetchSession(session_id, replica_id, now_ms)
        return session

    def close(self, session_id: int) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def _evict_one(self, now_ms: int) -> bool:
        if not self.sessions:
            return False
        oldest = min(self.sessions.values(), key=lambda s: s.last_used_ms)
        if now_ms - oldest.last_used_ms < self.eviction_ms:
            return False
        self.close(oldest.session_id)
        return True
