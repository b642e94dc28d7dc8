"""One connection's request bookkeeping (I/O shell helpers of `server`).

- `ConnectionContext`: what a handler knows about its connection, and the
  turn-taking (`in_order`, `in_turn`/`end_turn`) that lets handlers do
  ordered work in request order while they run concurrently.
- `Pipeline`: the connection's requests in arrival order until their
  responses are sent; it bounds how many are in flight and hands the writer
  the completed run at its head.
- `response_parts`: what a handler returned, as the checked parts of one
  response frame.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from common.wire.codec import DecodedRequest, api_name, encode_response
from common.wire.errors import LocalProtocolError
from common.wire.framing import SIZE_PREFIX, FileSlice, ResponsePart, part_length

#: What a handler returns (or its awaitable gives): a kio response entity,
#: bytes or a list of parts forming one complete frame, or None (no response).
Response = bytes | bytearray | memoryview | Sequence[ResponsePart] | Any | None


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
    #: The name of the listener the connection came on (e.g. PLAINTEXT).
    listener_name: str = ""
    #: Who the peer is: `User:ANONYMOUS` until TLS client auth or SASL says.
    principal: str = "User:ANONYMOUS"
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
    #: When (trio clock) the last chunk of requests was read: the start of
    #: their queue time (the writer's sends move `_last_activity`, not this).
    _read_at: float = 0.0
    #: Until when (trio clock) no more requests are read: a client over its quota.
    muted_until: float = 0.0
    #: Set by a handler that charges the connection's work to a quota: the
    #: server then adds the time it spends decoding the connection's requests
    #: and sending its answers to `network_s`, for the handler to take.
    metered: bool = False
    network_s: float = 0.0

    def mute(self, seconds: float) -> None:
        """Read no further request for `seconds` (Kafka mutes a throttled client's channel)."""
        self.muted_until = max(self.muted_until, trio.current_time() + seconds)

    def unmute(self) -> None:
        """Read again now (the quota that muted the connection was lifted)."""
        self.muted_until = 0.0

    async def wait_unmuted(self) -> None:
        # Woken at least every 0.1 s, so that `unmute` takes effect at once.
        while self.muted_until:
            now = trio.current_time()
            if now >= self.muted_until:
                self.muted_until = 0.0
                return
            await trio.sleep_until(min(self.muted_until, now + 0.1))

    def take_network_time(self) -> float:
        """The server's time on this connection since the last call (0 unless `metered`)."""
        spent, self.network_s = self.network_s, 0.0
        return spent

    def close(self) -> None:
        """Close this connection now; pending responses are dropped."""
        if self._scope is not None:
            self._scope.cancel()

    def _seq(self, request: DecodedRequest) -> int:
        seq = self._sequence_of.get(id(request))
        if seq is None:
            raise LocalProtocolError("in_order() takes the request object the handler was given")
        return seq

    def stand_in(self, request: DecodedRequest, replacement: DecodedRequest) -> None:
        """Let `replacement` (a copy of `request` with parts taken out, as
        an authorizer narrows it) take `request`'s turn in `in_order`;
        `end_stand_in` when its handler is done."""
        self._sequence_of[id(replacement)] = self._seq(request)

    def end_stand_in(self, replacement: DecodedRequest) -> None:
        self._sequence_of.pop(id(replacement), None)

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
        # `_seq`, `is_released` and `is_turn` inline: every acks=1 Produce
        # asks, and the broker's caches are cold when it does.
        seq = self._sequence_of.get(id(request))
        if seq is None:
            self._seq(request)  # raises, saying why
        sequencer = self._sequencer
        if seq < sequencer._next or seq in sequencer._released:
            raise LocalProtocolError("in_turn() after the request's turn ended")
        return seq == sequencer._next

    def end_turn(self, request: DecodedRequest) -> None:
        """End `request`'s ordered part (as leaving `in_order` does), so later
        requests may take their turns while this one goes on waiting."""
        self._sequencer.release(self._seq(request))


class Slot:
    __slots__ = ("request", "done", "parts", "api_key", "ready")

    def __init__(self, request: DecodedRequest) -> None:
        self.request: DecodedRequest | None = request
        self.done = False
        self.parts: list[ResponsePart] = []
        #: Set only when the server times sends: the API and when
        #: (`time.perf_counter`) the response was complete (0: not timed).
        self.api_key = -1
        self.ready = 0.0


class Pipeline:
    """The requests of one connection in arrival order, until their
    responses are sent.

    The reader adds a slot per request (at most `max_in_flight`: while
    there is no room it waits, and TCP pushes back on the client), handlers
    `complete` the slots in any order, and the responses leave from the head
    in order. After each read the reader sends the completed head itself
    when the writer is idle (`can_send_now`, `take_ready`), and hands the
    writer whatever the socket would not take at once (`hand_over`).
    Handler tasks completing later wake the writer, which sends
    `next_batch`es: the unsent rest first, then the completed run at the
    head.
    """

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.slots: collections.deque[Slot] = collections.deque()
        self.reading_done = False
        #: True while the writer is sending (its batch goes out before any other).
        self.writer_sending = False
        self._unsent: list[ResponsePart] = []
        self._unsent_slots: list[Slot] = []
        self._writer = trio.lowlevel.ParkingLot()
        self._reader = trio.lowlevel.ParkingLot()

    def has_room(self) -> bool:
        return len(self.slots) < self.max_in_flight

    async def wait_for_room(self) -> None:
        while len(self.slots) >= self.max_in_flight:
            # The head may be complete and waiting for the writer.
            self._wake(self._writer)
            await self._reader.park()

    def add(self, slot: Slot) -> None:
        assert len(self.slots) < self.max_in_flight, "add() without room"
        self.slots.append(slot)

    def complete(self, slot: Slot, parts: list[ResponsePart], *, wake_writer: bool = True) -> None:
        """Record `slot`'s response. The reader, which sends completed
        responses itself after each read, passes `wake_writer=False`."""
        slot.parts = parts
        slot.done = True
        # The request may hold views of the receive buffer (a Produce's
        # records): let them go now rather than when the response is sent.
        slot.request = None
        if wake_writer and self.slots and self.slots[0] is slot:
            self._wake(self._writer)

    def can_send_now(self) -> bool:
        """Whether the head is complete and nothing sent earlier is pending."""
        return not self.writer_sending and not self._unsent and bool(self.slots) and self.slots[0].done

    def take_ready(self) -> list[Slot]:
        """Remove and return the completed slots at the head."""
        slots = self.slots
        batch = []
        while slots and slots[0].done:
            batch.append(slots.popleft())
        if batch:
            self._wake(self._reader)
        return batch

    def hand_over(self, parts: list[ResponsePart], slots: list[Slot]) -> None:
        """Give the writer the unsent rest of the responses of `slots`."""
        assert not self._unsent and parts
        self._unsent = parts
        self._unsent_slots = slots
        self._wake(self._writer)

    def finish_reading(self) -> None:
        self.reading_done = True
        self._wake(self._writer)

    @staticmethod
    def _wake(lot: trio.lowlevel.ParkingLot) -> None:
        # `unpark_all` on an empty lot still costs microseconds, on every
        # request of a busy connection.
        if lot:
            lot.unpark_all()

    async def next_batch(self) -> tuple[list[ResponsePart], list[Slot]] | None:
        """The next parts to send and the slots whose responses they finish;
        None once the reader is done and everything was taken."""
        while True:
            if self._unsent:
                parts, slots = self._unsent, self._unsent_slots
                self._unsent, self._unsent_slots = [], []
                return parts, slots
            batch = self.take_ready()
            if batch:
                return [part for slot in batch for part in slot.parts], batch
            if self.reading_done and not self.slots:
                return None
            await self._writer.park()


def response_parts(request: DecodedRequest, result: Response) -> list[ResponsePart]:
    """The parts of one complete response frame, checked."""
    if result is None:
        return []
    if type(result) is bytes and len(result) >= 4 and SIZE_PREFIX.unpack_from(result)[0] == len(result) - 4:
        return [result]  # the hot path's hand-built responses
    if isinstance(result, (bytes, bytearray, memoryview)):
        parts: list[ResponsePart] = [result]
    elif isinstance(result, (list, tuple)):
        parts = list(result)
    elif hasattr(result, "__api_key__"):
        return [encode_response(request.header, result)]
    else:
        raise LocalProtocolError(
            f"a handler returned {type(result).__name__}; return a kio response, "
            "bytes, a list of parts, or None"
        )
    _check_frame(request, parts)
    return parts


def _check_frame(request: DecodedRequest, parts: list[ResponsePart]) -> None:
    first = parts[0] if parts else b""
    if isinstance(first, FileSlice) or part_length(first) < 4:
        raise LocalProtocolError(
            f"response to {api_name(request.header.api_key)} does not start with a size prefix"
        )
    (declared,) = SIZE_PREFIX.unpack_from(first, 0)
    actual = sum(part_length(p) for p in parts) - 4
    if declared != actual:
        raise LocalProtocolError(
            f"response to {api_name(request.header.api_key)} declares {declared} bytes "
            f"but its parts hold {actual}; build it with frame_parts()"
        )
