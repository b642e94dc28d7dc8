"""One connection's request bookkeeping (I/O shell helpers of `server`).

- `ConnectionContext`: what a handler knows about its connection, and the
  turn-taking (`in_order`, `in_turn`/`end_turn`) that lets handlers do
  ordered work in request order while they run concurrently.
- `Pipeline`: the connection's requests in arrival order until their
  responses are sent; it bounds how many are in flight and hands the writer
  the completed run at its head.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from raftka.wire.codec import DecodedRequest
from raftka.wire.errors import LocalProtocolError
from raftka.wire.framing import ResponsePart


class Sequencer:
    """Grants turns in request order: turn n starts when 0..n-1 are released."""

    def __init__(self) -> None:
        self._next = 0
        self._released: set[int] = set()
        self._waiters: dict[int, trio.Event] = {}

    def is_released(self, seq: int) -> bool:
        return seq < self._next or seq in self._released

    def is_turn(self, seq: int) -> bool:
        return seq == self._next

    async def wait_turn(self, seq: int) -> None:
        assert not self.is_released(seq), f"turn {seq} was already released"
        if seq != self._next:
            event = self._waiters[seq] = trio.Event()
            await event.wait()
        else:
            await trio.lowlevel.checkpoint()

    def release(self, seq: int) -> None:
        if seq == self._next and not self._released:
            # The common case: requests finishing in order.
            self._next = seq + 1
        elif self.is_released(seq):
            return
        else:
            self._released.add(seq)
            while self._next in self._released:
                self._released.remove(self._next)
                self._next += 1
        if self._waiters:
            waiter = self._waiters.pop(self._next, None)
            if waiter is not None:
                waiter.set()


@dataclass(eq=False)
class ConnectionContext:
    """What a handler knows about the connection a request came on."""

    connection_id: int
    #: "host:port" of the client.
    peer: str
    #: From ApiVersions v3+ (KIP-511), once the client sent it.
    client_software_name: str | None = None
    client_software_version: str | None = None
    #: Free per-connection state for handlers (e.g. fetch sessions).
    attributes: dict[str, Any] = field(default_factory=dict)
    bytes_received: int = 0
    bytes_sent: int = 0
    _scope: trio.CancelScope | None = None
    _sequencer: Sequencer = field(default_factory=Sequencer)
    _sequence_of: dict[int, int] = field(default_factory=dict)
    _in_flight: int = 0
    _last_activity: float = 0.0

    def close(self) -> None:
        """Close this connection now; pending responses are dropped."""
        if self._scope is not None:
            self._scope.cancel()

    def _seq(self, request: DecodedRequest) -> int:
        seq = self._sequence_of.get(id(request))
        if seq is None:
            raise LocalProtocolError("in_order() takes the request object the handler was given")
        return seq

    @asynccontextmanager
    async def in_order(self, request: DecodedRequest) -> AsyncIterator[None]:
        """Run the block only after every earlier request on this connection
        has finished its handler or left its own `in_order` block."""
        seq = self._seq(request)
        if self._sequencer.is_released(seq):
            raise LocalProtocolError("in_order() can be entered once per request")
        await self._sequencer.wait_turn(seq)
        try:
            yield
        finally:
            self._sequencer.release(seq)

    def in_turn(self, request: DecodedRequest) -> bool:
        """Whether `in_order(request)` would not wait: every earlier request
        has finished its handler or left its ordered part. A handler that
        answers at once may then do its ordered work without awaiting, and
        must call `end_turn(request)` after it."""
        seq = self._seq(request)
        if self._sequencer.is_released(seq):
            raise LocalProtocolError("in_turn() after the request's turn ended")
        return self._sequencer.is_turn(seq)

    def end_turn(self, request: DecodedRequest) -> None:
        """End `request`'s ordered part (as leaving `in_order` does), so later
        requests may take their turns while this one goes on waiting."""
        self._sequencer.release(self._seq(request))


class Slot:
    __slots__ = ("request", "done", "parts")

    def __init__(self, request: DecodedRequest) -> None:
        self.request: DecodedRequest | None = request
        self.done = False
        self.parts: list[ResponsePart] = []


class Pipeline:
    """The requests of one connection in arrival order, until answered.

    The reader `add`s a slot per request (waiting while `max_in_flight`
    are there), handlers `complete` them in any order, and the writer takes
    `ready_batch`es: the run of completed slots at the head. Batches let one
    send carry many responses.
    """

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.slots: collections.deque[Slot] = collections.deque()
        self.reading_done = False
        self._writer = trio.lowlevel.ParkingLot()
        self._reader = trio.lowlevel.ParkingLot()

    async def add(self, slot: Slot) -> None:
        while len(self.slots) >= self.max_in_flight:
            await self._reader.park()
        self.slots.append(slot)
        if slot.done and self.slots[0] is slot:
            self._writer.unpark_all()

    def complete(self, slot: Slot, parts: list[ResponsePart]) -> None:
        slot.parts = parts
        slot.done = True
        # The request may hold views of the receive buffer (a Produce's
        # records): let them go now rather than when the response is sent.
        slot.request = None
        if self.slots and self.slots[0] is slot:
            self._writer.unpark_all()

    def finish_reading(self) -> None:
        self.reading_done = True
        self._writer.unpark_all()

    async def ready_batch(self) -> list[Slot] | None:
        """The completed slots at the head (at least one); None once the
        reader is done and every slot was taken."""
        while not (self.slots and self.slots[0].done):
            if self.reading_done and not self.slots:
                return None
            await self._writer.park()
        batch = []
        while self.slots and self.slots[0].done:
            batch.append(self.slots.popleft())
        self._reader.unpark_all()
        return batch
