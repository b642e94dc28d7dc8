"""What travels on the Raft driver's event channel, and what its callers wait on.

Every caller of `RaftNode` (the server's handlers, the controller, a
broker) hands the driver loop an event and waits on it: a `_Waiter` is a
one-shot result (value or exception) set by the loop. `Staged` is what a
proposal's build may return so the leader adopts the image its controller
already computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import trio

from quorum.metadata.delta import MetadataDelta
from quorum.metadata.image import MetadataImage
from quorum.raft import Output
from quorum.raft.errors import RaftError

MetadataListener = Callable[[MetadataImage, "MetadataDelta | None"], None]


class ProposalTooLargeError(RaftError):
    """A proposal's records exceed the 8 MiB a metadata batch may hold; split it."""


@dataclasses.dataclass(eq=False)
class Waiter:
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    value: Any = None
    error: BaseException | None = None

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self.done.is_set():
            self.value, self.error = value, error
            self.done.set()

    async def wait(self) -> Any:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


@dataclasses.dataclass(frozen=True, slots=True)
class Staged:
    """What a `propose_with` build may return instead of bare records: the
    records, and the image after them (applied at the offsets the build was
    given, on top of everything appended before). The leader then adopts
    that image when they commit instead of decoding and replaying its own
    records again, as long as every record it appends in its epoch comes
    staged (a bare-record proposal turns adoption off for the epoch)."""

    records: Sequence[bytes]
    image_after: MetadataImage | None = None


Build = Callable[[int, int], "Sequence[bytes] | Staged"]


@dataclasses.dataclass(eq=False)
class Proposal(Waiter):
    build: Build = lambda base, epoch: ()
    base_offset: int = -1
    last_offset: int = -1
    epoch: int = -1
    image_after: MetadataImage | None = None
    #: When (trio clock) it was sent to the Raft loop, and appended there (metrics).
    queued_at: float = 0.0
    appended_at: float = 0.0


@dataclasses.dataclass(eq=False)
class Call(Waiter):
    fn: Callable[[int], Output | None] = lambda now_ms: None
