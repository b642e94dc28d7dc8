"""Moving a replica between this broker's log dirs (AlterReplicaLogDirs), as
Kafka's future replicas do.

Theory of operation
-------------------
`move(topic, partition, target_dir)` creates the *future log* in the target
dir, `<topic>-<partition>.<unique id>-future` (Kafka's name), and starts a
task that copies the current log into it batch by batch from its log start
(`Log.read_bytes` then `Log.append_as_follower`: offsets, leader epochs and
producer state come along as a follower's would), a chunk per step of the
event loop, while the partition keeps taking appends (as leader or
follower). When the future log has caught up with the current log end, in
the same step (nothing appends in between) the future log is closed, its
dir renamed to `<topic>-<partition>` in the target dir, reopened there
with the current log start offset, and it replaces the current log; the old
dir is renamed `...-delete` and removed.

The copy runs at `replica.alter.log.dirs.io.max.bytes.per.second` at most
(unset: as fast as the event loop allows, a MB per step). While the copy
runs DescribeLogDirs lists the future replica under the
target dir with `is_future_key` true and its offset lag (how far it is
behind the current log end). A move to the dir the replica is already in
is a no-op; a second move of a moving replica to another dir starts over
there. If the current log is truncated below the copy (a follower whose
log diverged), or its log start passes the copy, the copy follows (it is
truncated or restarted at the new log start); the swap checks that both
logs end the same epoch at the same offset, and starts the copy over when
not. A future dir left by a broker that stopped mid-move is removed at the
next start (the move is not resumed: send it again).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field

import trio

from broker.shell.log_scan import DELETE_SUFFIX, FUTURE_SUFFIX, PARTITION_METADATA_FILE
from storage.log import Log

_log = logging.getLogger("broker.log_dirs")
#: Bytes copied per step of the event loop: the partition's own appends
#: and every other request wait this long at most.
COPY_CHUNK_BYTES = 1024 * 1024


@dataclass(eq=False)
class FutureReplica:
    topic: str
    partition: int
    target_dir: str
    path: str
    log: Log | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class LogDirMover:
    """The replica moves in progress on one broker (`broker.log_mover`)."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.moves: dict[tuple[str, int], FutureReplica] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for move in list(self.moves.values()):
                self._discard(move)

    def move(self, topic: str, partition: int, target_dir: str) -> None:
        """Start moving the hosted replica to `target_dir` (one of `log.dirs`, not its own)."""
        tp = (topic, partition)
        current = self.moves.get(tp)
        if current is not None:
            if current.target_dir == target_dir:
                return
            current.scope.cancel()
            self._discard(current)
        if self._nursery is None:
            raise RuntimeError("the broker is not running")
        path = os.path.join(target_dir, f"{topic}-{partition}.{uuid.uuid4().hex}{FUTURE_SUFFIX}")
        move = self.moves[tp] = FutureReplica(topic, partition, target_dir, path)
        self._nursery.start_soon(self._copy, move)

    def cancel(self, topic: str, partition: int) -> None:
        """Call off the replica's move, if one is under way."""
        current = self.moves.get((topic, partition))
        if current is not None:
            current.scope.cancel()
            self._discard(current)

    def future_of(self, topic: str, partition: int) -> FutureReplica | None:
        return self.moves.get((topic, partition))

    def _discard(self, move: FutureReplica) -> None:
        if self.moves.get((move.topic, move.partition)) is move:
            del self.moves[(move.topic, move.partition)]
        if move.log is not None:
            move.log.close(checkpoint=False)
            move.log = None
        shutil.rmtree(move.path, ignore_errors=True)

    def _open_future(self, move: FutureReplica, current: Log) -> Log:
        if move.log is not None:
            move.log.close(checkpoint=False)
        shutil.rmtree(move.path, ignore_errors=True)
        # The future dir's name is not <topic>-<partition>: no checkpoint files (they are per dir).
        log = Log.open(move.path, current.config, now_ms=self.broker.clock_ms(), fs=current.fs,
                       checkpoint_files=False, producer_state=current.producer_state is not None)
        if current.log_start_offset > 0:
            log.truncate_fully_and_start_at(current.log_start_offset, write_checkpoints=False)
        move.log = log
        return log

    async def _copy(self, move: FutureReplica) -> None:
        tp = (move.topic, move.partition)
        with move.scope:
            try:
                hp = self.broker.replicas.partitions.get(tp)
                if hp is None:
                    self._discard(move)
                    return
                future = self._open_future(move, hp.log)
                _log.info("%s-%d: moving to %s: copying %d bytes into %s", *tp, move.target_dir,
                          hp.log.size_in_bytes, os.path.basename(move.path))
                while True:
                    await trio.sleep(0)
                    hp = self.broker.replicas.partitions.get(tp)
                    if hp is None:  # the replica left this broker
                        self._discard(move)
                        return
                    current = hp.log
                    if future.log_end_offset < current.log_start_offset:
                        future = self._open_future(move, current)  # retention or DeleteRecords passed the copy
                    elif future.log_end_offset > current.log_end_offset:
                        future.truncate_to(current.log_end_offset, write_checkpoints=False)  # the current log was truncated
                    if future.log_end_offset < current.log_end_offset:
                        rate = self.broker.config.replica_alter_log_dirs_io_max_bytes_per_second
                        chunk = COPY_CHUNK_BYTES if not rate else max(1024, min(COPY_CHUNK_BYTES, rate // 10))
                        data = current.read_bytes(future.log_end_offset, chunk, max_offset=current.log_end_offset)
                        if data:
                            future.append_as_follower(data, self.broker.clock_ms())
                            if rate:
                                await trio.sleep(len(data) / rate)
                        continue
                    # Caught up, and no await until the swap: nothing appends in between.
                    epoch = current.latest_epoch
                    if epoch != future.latest_epoch or (
                            epoch >= 0 and current.end_offset_for_epoch(epoch) != future.end_offset_for_epoch(epoch)):
                        _log.warning("%s-%d: the copy in %s diverged from the log (a truncation during the "
                                     "copy); copying again", *tp, os.path.basename(move.path))
                        future = self._open_future(move, current)
                        continue
                    self._swap(move, hp, current, future)
                    return
            except OSError as exc:
                _log.error("%s-%d: moving to %s failed: %s; the replica stays where it is", *tp,
                           move.target_dir, exc)
                self._discard(move)

    def _swap(self, move: FutureReplica, hp, current: Log, future: Log) -> None:
        tp = (move.topic, move.partition)
        manager = self.broker.log_manager
        log_start, log_end = current.log_start_offset, current.log_end_offset
        old_path = current.dir_path
        final = os.path.join(move.target_dir, f"{move.topic}-{move.partition}")
        future.close(checkpoint=False)
        move.log = None
        topic_id_file = os.path.join(old_path, PARTITION_METADATA_FILE)
        if os.path.exists(topic_id_file):
            shutil.copyfile(topic_id_file, os.path.join(move.path, PARTITION_METADATA_FILE))
        os.replace(move.path, final)
        current.fs.fsync_dir(move.target_dir)
        moved = Log.open(final, current.config, now_ms=self.broker.clock_ms(), fs=current.fs,
                         recovery_point=log_end, log_start_offset=log_start,
                         producer_state=current.producer_state is not None)
        if current.producer_state is not None and moved.producer_state is not None:
            moved.producer_state.producer_id_expiration_ms = current.producer_state.producer_id_expiration_ms
        manager.cleaner.abort(current)
        current.close(checkpoint=False)
        hp.log = moved
        manager.moved(tp, moved, move.target_dir)
        del self.moves[tp]
        doomed = f"{old_path}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
        os.replace(old_path, doomed)
        current.fs.fsync_dir(os.path.dirname(old_path))
        shutil.rmtree(doomed, ignore_errors=True)
        hp.notify()
        _log.info("%s-%d: moved to %s (offsets %d..%d)", *tp, move.target_dir, log_start, log_end)
