"""The simulated clock, event queue and network.

`EventLoop.at(t, fn)` runs `fn` at simulated time `t`; ties run in the
order they were scheduled, so a run is a pure function of the seed.

`SimNetwork.call(src, dst, handle, on_reply, timeout_ms)` is one request:
it arrives after a random delay unless the link is cut or the message is
lost; `handle(reply)` runs on `dst` and may call `reply(response)` at once
or later (a parked request); the response travels back the same way;
`on_reply(response)` runs on `src` once -- or with None at the timeout. A
node that crashed (or restarted: a new incarnation) neither handles nor
answers what was sent to its previous life.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self, after_event: Callable[[], None]) -> None:
        self.now_ms = 0
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._after_event = after_event
        self.events = 0

    def at(self, time_ms: int, fn: Callable[[], None]) -> None:
        assert time_ms >= self.now_ms
        self._seq += 1
        heapq.heappush(self._queue, (time_ms, self._seq, fn))

    def after(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self.at(self.now_ms + delay_ms, fn)

    def run_until(self, time_ms: int) -> None:
        queue = self._queue
        while queue and queue[0][0] <= time_ms:
            when, _, fn = heapq.heappop(queue)
            self.now_ms = when
            fn()
            self.events += 1
            self._after_event()
        self.now_ms = time_ms


class Node:
    """Anything that sends or receives: a broker, the controller, a client."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.incarnation = 0


@dataclasses.dataclass(frozen=True)
class NetworkConditions:
    min_delay_ms: int = 1
    max_delay_ms: int = 5
    drop_rate: float = 0.0


class SimNetwork:
    def __init__(self, loop: EventLoop, rng: random.Random, conditions: NetworkConditions) -> None:
        self.loop = loop
        self.rng = rng
        self.conditions = conditions
        self._cut: set[frozenset[str]] = set()
        #: Extra loss per node (a flaky NIC), 0..1.
        self.lossy: dict[str, float] = {}

    # --- faults ---------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        self._cut.add(frozenset((a, b)))

    def isolate(self, node: str, others: list[str]) -> None:
        for other in others:
            if other != node:
                self.cut(node, other)

    def heal(self) -> None:
        self._cut.clear()
        self.lossy.clear()

    def can_talk(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self._cut

    # --- messages ---------------------------------------------------------------

    def send(self, src: str, dst: str, fn: Callable[[], None]) -> None:
        if not self.can_talk(src, dst):
            return
        c = self.conditions
        loss = c.drop_rate + self.lossy.get(src, 0.0) + self.lossy.get(dst, 0.0)
        if loss and self.rng.random() < loss:
            return
        self.loop.after(self.rng.randint(c.min_delay_ms, c.max_delay_ms), fn)

    def call(self, src: Node, dst: Node, handle: Callable[[Callable[[Any], None]], None],
             on_reply: Callable[[Any], None], timeout_ms: int) -> None:
        src_life = src.incarnation
        done = False

        def src_current() -> bool:
            return src.alive and src.incarnation == src_life

        def deliver(response: Any) -> None:
            nonlocal done
            if not done and src_current():
                done = True
                on_reply(response)

        def arrive() -> None:
            if not dst.alive:
                return
            dst_life = dst.incarnation

            def reply(response: Any) -> None:
                if dst.alive and dst.incarnation == dst_life:
                    self.send(dst.name, src.name, lambda: deliver(response))

            handle(reply)

        def expire() -> None:
            nonlocal done
            if not done and src_current():
                done = True
                on_reply(None)

        self.send(src.name, dst.name, arrive)
        self.loop.after(timeout_ms, expire)
