"""When the leadership changes of one metadata delta took effect (pure bookkeeping, one INFO line per delta).

Theory of operation
-------------------
A failover is a chain: the controller's election record reaches the
broker, the broker applies the delta (`ReplicaManager.delta_steps`), each
new leader's followers fetch at the new epoch, the leader's high watermark
passes the offset its epoch started at (from then on an acks=all write
can commit), and each follower's fetches to its new leader are answered.
A delta of thousands of partitions takes seconds of that chain, and which
link is slow decides what to fix. `LeadershipTimeline` keeps, per delta
that changed leaderships, when the broker started applying it and, per
partition (registered as each is applied, so events during a delta sliced
over the event loop count), when each later link first happened; once
every partition of the delta got there (or `GIVE_UP_MS` after the delta
was applied) it hands back one line:

    metadata offset 2009 (applied in 65 ms): 500 new leaderships: first
    follower fetch +41..+197 ms (median +41), HW past the epoch start
    +41..+605 ms (median +41); 500 partitions follow a new leader: first
    answer +146..+729 ms (median +148)

(times after the broker started applying the delta, fastest..slowest
partition). The shell logs it; the times come from the caller (`now_ms`),
so this module reads no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

#: A delta's line is written at the latest this long after it was applied,
#: with the partitions that had not got there counted as missing.
GIVE_UP_MS = 60_000


@dataclasses.dataclass(slots=True)
class _Delta:
    offset: int
    started_ms: int
    #: None while the delta is being applied.
    applied_ms: int | None = None
    #: New leaders: key -> the offset their epoch started at.
    leading: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    first_fetch_ms: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    committed_ms: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    following: set[Hashable] = dataclasses.field(default_factory=set)
    answered_ms: dict[Hashable, int] = dataclasses.field(default_factory=dict)

    def done(self) -> bool:
        return self.applied_ms is not None and len(self.committed_ms) == len(self.leading) and len(self.answered_ms) == len(self.following)


class LeadershipTimeline:
    """See the module docstring."""

    def __init__(self) -> None:
        self._deltas: list[_Delta] = []
        #: Which open delta a partition's next event belongs to (its newest).
        self._leading: dict[Hashable, _Delta] = {}
        self._following: dict[Hashable, _Delta] = {}

    @property
    def watching(self) -> bool:
        return bool(self._deltas)

    def begin_delta(self, offset: int, started_ms: int) -> list[str]:
        """This broker starts applying the delta at metadata `offset`."""
        lines = self._expire(started_ms)
        self._deltas.append(_Delta(offset, started_ms))
        return lines

    def on_leader(self, key: Hashable, epoch_start_offset: int) -> None:
        """The delta being applied made this broker leader of `key` at a
        new epoch starting at `epoch_start_offset`."""
        delta = self._deltas[-1]
        self._forget(key)
        delta.leading[key] = epoch_start_offset
        self._leading[key] = delta

    def on_follower(self, key: Hashable) -> None:
        """The delta being applied moved `key`'s fetching to a new leader."""
        delta = self._deltas[-1]
        self._forget(key)
        delta.following.add(key)
        self._following[key] = delta

    def end_delta(self, applied_ms: int) -> list[str]:
        """The delta `begin_delta` started is applied."""
        delta = self._deltas[-1]
        delta.applied_ms = applied_ms
        if not delta.leading and not delta.following:
            self._deltas.pop()
            return []
        return self._close_done()

    def on_replica_fetch(self, key: Hashable, high_watermark: int, now_ms: int) -> list[str]:
        """A follower's fetch of `key` was served here (as leader)."""
        delta = self._leading.get(key)
        if delta is None:
            return []
        delta.first_fetch_ms.setdefault(key, now_ms)
        if high_watermark >= delta.leading[key]:
            delta.committed_ms[key] = now_ms
            del self._leading[key]
            return self._close_if_done(delta)
        return []

    def on_fetch_answered(self, key: Hashable, now_ms: int) -> list[str]:
        """Our fetch of `key` from its new leader was answered without error."""
        delta = self._following.pop(key, None)
        if delta is None:
            return []
        delta.answered_ms[key] = now_ms
        return self._close_if_done(delta)

    def _forget(self, key: Hashable) -> None:
        """A newer delta changed `key` again: the older one stops waiting for it."""
        # Each index by hand, not a loop over both: this runs for every
        # partition a delta moves, and almost always finds nothing.
        old = self._leading.pop(key, None)
        if old is not None:
            self._forget_in(old, key)
        old = self._following.pop(key, None)
        if old is not None:
            self._forget_in(old, key)

    @staticmethod
    def _forget_in(delta: _Delta, key: Hashable) -> None:
        delta.leading.pop(key, None)
        delta.first_fetch_ms.pop(key, None)
        delta.following.discard(key)

    def _expire(self, now_ms: int) -> list[str]:
        lines = []
        for delta in [d for d in self._deltas if d.applied_ms is not None and now_ms - d.applied_ms >= GIVE_UP_MS]:
            lines.append(self._close(delta))
        return lines

    def _close_done(self) -> list[str]:
        return [self._close(delta) for delta in [d for d in self._deltas if d.done()]]

    def _close_if_done(self, delta: _Delta) -> list[str]:
        # A partition's event can only complete its own delta: one check,
        # not one per open delta (a fence is 20 of them, 10,000 events).
        return [self._close(delta)] if delta.done() else []

    def _close(self, delta: _Delta) -> str:
        self._deltas.remove(delta)
        if not delta.done():
            # Given up on: its waiting partitions leave the indexes (a done
            # delta has none there: each left as it got there).
            for index in (self._leading, self._following):
                for key in [k for k, d in index.items() if d is delta]:
                    del index[key]
        parts = []
        if delta.leading:
            parts.append(f"{len(delta.leading)} new leaderships: first follower fetch "
                         f"{_spread(delta.first_fetch_ms, delta)}, HW past the epoch start "
                         f"{_spread(delta.committed_ms, delta)}")
        if delta.following:
            parts.append(f"{len(delta.following)} partitions follow a new leader: first answer "
                         f"{_spread(delta.answered_ms, delta)}")
        missing = len(delta.leading) - len(delta.committed_ms) + len(delta.following) - len(delta.answered_ms)
        tail = f" ({missing} not within {GIVE_UP_MS // 1000} s)" if missing else ""
        return (f"metadata offset {delta.offset} (applied in {delta.applied_ms - delta.started_ms} ms): "
                f"{'; '.join(parts)}{tail}")


def _spread(times: dict[Hashable, int], delta: _Delta) -> str:
    if not times:
        return "none"
    after = sorted(t - delta.started_ms for t in times.values())
    return f"+{after[0]}..+{after[-1]} ms (median +{after[len(after) // 2]})"
