"""SimNetwork: delivers messages late, out of order, twice, or never.

Links can be cut (partitions). A response only reaches the incarnation of
the node that sent the request, as a TCP connection would: a node that
restarted never sees answers meant for its previous life.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Hashable

from quorum.raft.messages import Message


@dataclasses.dataclass(frozen=True)
class RequestToken:
    """The driver-side token of a request delivered to a node."""

    source_id: int
    source_incarnation: int
    correlation: Hashable


@dataclasses.dataclass(order=True)
class Flight:
    deliver_at_ms: int
    seq: int
    source_id: int = dataclasses.field(compare=False)
    destination_id: int = dataclasses.field(compare=False)
    message: Message = dataclasses.field(compare=False)
    correlation: Hashable = dataclasses.field(compare=False)
    source_incarnation: int = dataclasses.field(compare=False)
    # for a response: the incarnation of the requester it must reach
    destination_incarnation: int | None = dataclasses.field(compare=False)


@dataclasses.dataclass
class NetworkConditions:
    min_delay_ms: int = 1
    max_delay_ms: int = 10
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0


class SimNetwork:
    def __init__(self, rng: random.Random, conditions: NetworkConditions) -> None:
        self.rng = rng
        self.conditions = conditions
        self.cut: set[frozenset[int]] = set()
        self._queue: list[Flight] = []
        self._seq = 0
        self.sent = 0
        self.dropped = 0

    def connected(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.cut

    def partition(self, groups: list[set[int]]) -> None:
        """Cut every link between different groups."""
        for i, g in enumerate(groups):
            for h in groups[i + 1 :]:
                for a in g:
                    for b in h:
                        self.cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self.cut.clear()

    def send(
        self,
        now_ms: int,
        source_id: int,
        destination_id: int,
        message: Message,
        correlation: Hashable,
        *,
        source_incarnation: int,
        destination_incarnation: int | None = None,
    ) -> None:
        self.sent += 1
        c = self.conditions
        if not self.connected(source_id, destination_id) or self.rng.random() < c.drop_rate:
            self.dropped += 1
            return
        copies = 2 if self.rng.random() < c.duplicate_rate else 1
        for _ in range(copies):
            self._seq += 1
            delay = self.rng.randint(c.min_delay_ms, c.max_delay_ms)
            heapq.heappush(
                self._queue,
                Flight(
                    now_ms + delay,
                    self._seq,
                    source_id,
                    destination_id,
                    message,
                    correlation,
                    source_incarnation,
                    destination_incarnation,
                ),
            )

    def hold(self, flight: Flight, until_ms: int) -> None:
        """Deliver `flight` no earlier than `until_ms` (its receiver is paused)."""
        self._seq += 1
        heapq.heappush(self._queue, dataclasses.replace(flight, deliver_at_ms=until_ms, seq=self._seq))

    def next_delivery_ms(self) -> int | None:
        return self._queue[0].deliver_at_ms if self._queue else None

    def pop_due(self, now_ms: int) -> Flight | None:
        while self._queue and self._queue[0].deliver_at_ms <= now_ms:
            flight = heapq.heappop(self._queue)
            if self.connected(flight.source_id, flight.destination_id):
                return flight
            self.dropped += 1  # the link was cut while it was in flight
        return None
