"""Who hears about a node's metadata and leadership, and how.

- Metadata subscribers get `(image, delta)` after each change of the
  committed image; `delta` is `image_delta(old, new, broker_id)` for the
  broker id they subscribed with (None without one).
- Leadership listeners (the controller) hear `on_leader_active(epoch,
  image)` when this node leads and its image holds everything committed
  before its epoch, and `on_leader_lost(epoch)`.
- `changed()` wakes every task waiting for the node's view to move.

All calls happen in the driver loop's task: callbacks must be quick and
must not block (start a task for slow work).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import trio

from quorum.metadata.delta import image_delta
from quorum.metadata.image import MetadataImage
from quorum.node.events import MetadataListener


class LeadershipListener(Protocol):
    def on_leader_active(self, epoch: int, image: MetadataImage) -> None: ...

    def on_leader_lost(self, epoch: int) -> None: ...


@dataclasses.dataclass(eq=False)
class _Subscriber:
    callback: MetadataListener
    broker_id: int | None


class Publisher:
    def __init__(self) -> None:
        self._subscribers: list[_Subscriber] = []
        self._leadership: list[LeadershipListener] = []
        self._changed = trio.Event()

    def subscribe(self, callback: MetadataListener, broker_id: int | None) -> None:
        self._subscribers.append(_Subscriber(callback, broker_id))

    def add_leadership_listener(self, listener: LeadershipListener) -> None:
        self._leadership.append(listener)

    def image_changed(self, old: MetadataImage, new: MetadataImage) -> None:
        for s in self._subscribers:
            s.callback(new, image_delta(old, new, s.broker_id) if s.broker_id is not None else None)

    def leader_active(self, epoch: int, image: MetadataImage) -> None:
        for listener in self._leadership:
            listener.on_leader_active(epoch, image)

    def leader_lost(self, epoch: int) -> None:
        for listener in self._leadership:
            listener.on_leader_lost(epoch)

    def changed(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    async def wait_for_change(self) -> None:
        await self._changed.wait()
