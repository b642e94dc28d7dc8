"""The applying half of `RaftNode`: committed records into the image, and snapshots.

`RaftNode` (quorum.node.driver) inherits these methods; they run in its
driver loop (or, for a long backlog, in a task beside it) and use its
state: `core`, `log`, `state`, the staged proposals, the publisher.

Each loop turn applies at most APPLY_BYTES_PER_TURN of committed records in
one replay (cheaper per record than many small ones), adopting the leader's
staged images instead where they cover the records (`applier.apply_committed`).
A backlog longer than REPLAY_IN_THREAD_RECORDS (a node that just restarted
on its log) is replayed by a task in a worker thread instead,
REPLAY_CHUNK_BYTES at a time, so the loop keeps answering votes and Fetches
meanwhile (the thread gives the GIL up every switch interval, 5 ms, while
the loop has work): a restarted voter neither delays an election nor, as
the majority's second member, a commit, for as long as its replay takes.
Snapshots are encoded off the loop from the immutable image and stored by
the loop.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Any

import trio

from quorum.metadata.image import MetadataImage
from quorum.node.applier import MetadataState, apply_committed
from quorum.node.snapshots import snapshot_of_image
from quorum.raft import Output, SnapshotId

if TYPE_CHECKING:
    from quorum.node.publish import Publisher
    from quorum.raft import RaftCore
    from quorum.raft.storage_log import StorageReplicatedLog

_log = logging.getLogger("quorum.node.driver")

APPLY_BYTES_PER_TURN = 32 * 1024
REPLAY_IN_THREAD_RECORDS = 5000
REPLAY_CHUNK_BYTES = 1024 * 1024


class Applying:
    node_id: int
    core: RaftCore | None
    log: StorageReplicatedLog | None
    state: MetadataState
    _precomputed: collections.deque[Any]
    _publisher: Publisher
    _nursery: trio.Nursery | None
    _replaying: bool
    _snapshotting: bool
    _log_lock: trio.Lock

    if TYPE_CHECKING:  # provided by RaftNode
        def _after_turn(self) -> None: ...

        async def call(self, fn: Any) -> Any: ...

    async def _load_snapshot(self, snapshot_id: SnapshotId) -> None:
        """Replace the state with the snapshot's, decoded in a worker thread:
        a snapshot of 100,000 partitions took 2 s of CPU, 7 s on a busy
        machine, and in the loop's task it held every other task of a
        broker (heartbeats, the metadata fetch) as long."""
        assert self.log is not None
        old = self.state
        state, _ = await trio.to_thread.run_sync(old.load_snapshot, self.log.snapshot_data(snapshot_id))
        self.state = state
        _log.info("node %d loaded snapshot %s", self.node_id, snapshot_id)
        self._publish(old.image)

    def _apply_committed(self) -> bool:
        """Apply committed batches (a bounded amount per turn); True if more remain."""
        core, log = self.core, self.log
        assert core is not None and log is not None
        hw = core.high_watermark
        if hw is None or self._replaying:
            return False
        if hw - self.state.next_offset > REPLAY_IN_THREAD_RECORDS and not self._precomputed \
                and self._nursery is not None:  # (an active leader adopts its staged images instead)
            self._replaying = True
            self._nursery.start_soon(self._replay_in_thread)
            return False
        old = self.state.image
        self.state = apply_committed(self.state, log.read, hw, self._precomputed,
                                     core.epoch if core.is_leader else None, APPLY_BYTES_PER_TURN)
        if self.state.image is not old:
            self._publish(old)
        return self.state.next_offset < hw

    async def _replay_in_thread(self) -> None:
        """Replay a long committed backlog chunk by chunk in a worker thread
        (see REPLAY_IN_THREAD_RECORDS). The log is read here, in the trio
        thread; the thread only turns immutable bytes and an immutable image
        into a new image. A state replaced meanwhile (a snapshot installed)
        discards the chunk's result."""
        try:
            while True:
                core, log = self.core, self.log
                assert core is not None and log is not None
                hw = core.high_watermark
                if hw is None or hw - self.state.next_offset <= REPLAY_IN_THREAD_RECORDS:
                    break
                base = self.state
                async with self._log_lock:
                    data = log.read(base.next_offset, REPLAY_CHUNK_BYTES, hw)
                if not data:
                    break
                state, _ = await trio.to_thread.run_sync(base.apply, data)
                if self.state is base:
                    self.state = state
                    self._publish(base.image)
                    self._after_turn()
        finally:
            self._replaying = False
        await self.call(lambda now_ms: None)  # a loop turn applies the rest

    def _publish(self, old: MetadataImage) -> None:
        self._publisher.image_changed(old, self.state.image)

    def _maybe_snapshot(self) -> None:
        assert self.log is not None and self._nursery is not None
        if self._snapshotting or self.state.next_offset <= self.log.log_start_offset:
            return
        self._snapshotting = True
        self._nursery.start_soon(self._snapshot, self.state)

    async def _snapshot(self, state: MetadataState) -> None:
        """Encode the image off the loop (it is immutable), then have the loop store it."""
        try:
            snapshot_id = SnapshotId(state.next_offset, state.last_epoch)
            blob = await trio.to_thread.run_sync(snapshot_of_image, state.image, snapshot_id)

            def store(now_ms: int) -> Output:
                assert self.core is not None
                created, out = self.core.create_snapshot(state.next_offset, blob, now_ms)
                _log.info("node %d wrote snapshot %s (%d bytes)", self.node_id, created, len(blob))
                return out

            await self.call(store)
        finally:
            self._snapshotting = False
