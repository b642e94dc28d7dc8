"""A partition this broker hosts: its state, its log, and the requests parked on it (I/O shell).

Theory of operation
-------------------
A `HostedPartition` pairs the pure partition state (the replication
core's `Partition`: role, epochs, ISR, HW) with its `storage.Log`; the
`broker.shell.replica_manager.ReplicaManager` keeps them.

Parked requests ("purgatory", Kafka's DelayedProduce and DelayedFetch):
a long-polling Fetch and an acks=all Produce wait for *something to change*
on the partitions they touch, then re-check their own condition (enough
bytes below the HW; the HW past their last offset). Every change a parked
request could be waiting for -- an append (LEO), a HW move (an append, a
follower's fetch), an ISR change, a leadership change or
the replica stopping -- calls `HostedPartition.notify`, which sets every
parked request's `trio.Event`. A waiter registers one event with each
partition it touches (`wait_for_change`), so a Fetch over many partitions
wakes on the first of them. A parked acks=all Produce (`wait_for_acks`)
is woken only once `notify` finds its answer decided on one of its
partitions (`acks_all_status`: the HW past its batch, an ISR under
`min.insync.replicas`, a leadership change), as Kafka's DelayedProduce is
completed only by a check that succeeds: every append and follower fetch
calls `notify`, and waking each of a connection's in-flight produces to
find its HW still short cost a task switch and a cancel scope each.
Deadlines are trio cancel scopes; a produce that times out answers
REQUEST_TIMED_OUT. A follower's fetch session
(`broker.shell.fetch_session`) subscribes for good instead: `notify` marks the
partition dirty in it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from broker.core.replication import Partition
from storage.errors import CorruptRecordError, UnsupportedCompressionError
from storage.log import Log
from storage.record_validation import RecordPolicy

# Distinct read errors logged per partition; past this a damaged log is
# known to be damaged, and the answers still say so.
_READ_ERRORS_LOGGED = 100
_log = logging.getLogger("broker.replica_manager")


class HostedPartition:
    __slots__ = ("state", "log", "waiters", "acks_waiters", "sessions", "record_policy", "replicas",
                 "read_errors_logged")

    def __init__(self, state: Partition, log: Log, replicas: Any = None) -> None:
        self.state = state
        self.log = log
        #: The manager that acts on this partition's replication decisions.
        self.replicas = replicas
        self.waiters: set[ChangeWaiter] = set()
        #: Parked acks=all produces: waiter -> (required offset, the leader
        #: epoch of the append), woken once `acks_all_status` decides.
        self.acks_waiters: dict[ChangeWaiter, tuple[int, int]] = {}
        #: The follower fetch sessions holding this partition (`broker.shell.fetch_session`):
        #: session -> its SessionPartition. Unlike a waiter, a session stays subscribed.
        self.sessions: dict = {}
        #: The topic's rules for the records of a client batch (`log_append_time`:
        #: the broker stamps batches, KIP-32).
        self.record_policy = RecordPolicy()
        #: The read errors already logged (each is logged once, not per request).
        self.read_errors_logged: set[str] = set()

    def read_error(self, exc: Exception) -> ErrorCode:
        """The error code a read (Fetch, ListOffsets) answers for this
        partition when a stored batch cannot be read: CORRUPT_MESSAGE for
        bytes that do not parse or name an unknown codec (a log written by
        an older version, a disk fault the CRC did not catch),
        KAFKA_STORAGE_ERROR for an I/O error or any other storage fault, as
        Kafka answers. The request's other partitions are served; the
        partition, the position and the reason are logged once."""
        reason = str(exc)
        if reason not in self.read_errors_logged and len(self.read_errors_logged) < _READ_ERRORS_LOGGED:
            self.read_errors_logged.add(reason)
            _log.error("%s-%d: a read failed: %s", self.state.topic, self.state.partition, reason)
        corrupt = isinstance(exc, (CorruptRecordError, UnsupportedCompressionError))
        if isinstance(exc, OSError) and self.replicas is not None:
            self.replicas.disk_error(self.state.topic, self.state.partition, exc)
        return ErrorCode.corrupt_message if corrupt else ErrorCode.kafka_storage_error

    def notify(self) -> None:
        """Wake every request parked on this partition; mark it dirty in
        every fetch session holding it."""
        if self.waiters:
            for waiter in self.waiters:
                waiter.wake(self)
            self.waiters.clear()
        if self.acks_waiters:
            status = self.state.acks_all_status
            decided = [w for w, (required, epoch) in self.acks_waiters.items() if status(required, epoch) is not None]
            for waiter in decided:
                del self.acks_waiters[waiter]
                waiter.wake(self)
        if self.sessions:
            for session, sp in self.sessions.items():
                session.mark_dirty(sp)


class LogTransactions:
    """The LSO's view of a log's open transactions (`Partition.transactions`):
    its producer state's, but never below the log start offset. Retention
    or DeleteRecords may move the log start past the first offset of a
    transaction still open (as in Kafka, which also bounds its first
    unstable offset by the log start): read_committed consumers and
    ListOffsets then start at the log start, not at an offset the log no
    longer has."""

    __slots__ = ("log",)

    def __init__(self, log: Log) -> None:
        assert log.producer_state is not None
        self.log = log

    @property
    def unstable(self) -> bool:
        return self.log.producer_state.unstable

    def last_stable_offset(self, high_watermark: int) -> int:
        lso = self.log.producer_state.last_stable_offset(high_watermark)
        return max(lso, min(self.log.log_start_offset, high_watermark))


class ChangeWaiter:
    """A parked request: woken by the first change, it also learns which of
    its partitions changed before it ran, so it reads only those again."""

    __slots__ = ("event", "changed")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.changed: list[HostedPartition] = []

    def wake(self, hp: HostedPartition) -> None:
        self.changed.append(hp)
        self.event.set()


async def wait_for_change(partitions: Iterable[HostedPartition], deadline: float) -> list[HostedPartition]:
    """Return when any of `partitions` changes, or at `deadline` (trio time):
    the partitions that changed meanwhile (none at the deadline)."""
    waiter = ChangeWaiter()
    hosted = list(partitions)
    for hp in hosted:
        hp.waiters.add(waiter)
    try:
        with trio.move_on_at(deadline):
            await waiter.event.wait()
    finally:
        for hp in hosted:
            hp.waiters.discard(waiter)
    return waiter.changed


async def wait_for_acks(waiting: Iterable[tuple[HostedPartition, int, int]], deadline: float) -> None:
    """Return once the acks=all answer of any of `waiting` -- (partition,
    required offset, leader epoch of the append) -- is decided
    (`Partition.acks_all_status` is not None), or at `deadline` (trio time)."""
    waiter = ChangeWaiter()
    parked = list(waiting)
    for hp, required, epoch in parked:
        hp.acks_waiters[waiter] = (required, epoch)
    try:
        with trio.move_on_at(deadline):
            await waiter.event.wait()
    finally:
        for hp, _required, _epoch in parked:
            hp.acks_waiters.pop(waiter, None)
