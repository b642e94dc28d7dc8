"""The broker's periodic passes over every log, on Kafka's timers (I/O shell).

Theory of operation
-------------------
`run_log_passes(broker)` runs, each on its own timer:

- **flush** (every tick): `flush.ms` on the logs that set it;
- **hw** (`replica.high.watermark.checkpoint.interval.ms`): every hosted
  partition's high watermark to `replication-offset-checkpoint`, the files
  written in a worker thread;
- **recovery** (`log.flush.offset.checkpoint.interval.ms`,
  `log.flush.start.offset.checkpoint.interval.ms`): the recovery point and
  log start offset checkpoints (`LogManager.checkpoint_logs_in_slices`);
- **retention** (`log.retention.check.interval.ms`): segments past
  `retention.ms` / `retention.bytes` deleted;
- **producers** (`producer.id.expiration.check.interval.ms`): idempotent
  producers idle for `producer.id.expiration.ms` forgotten;
- **offline** (`OFFLINE_RETRY_MS`): the logs that could not be opened (a
  resource limit, a disk error) tried again.

Each pass over every log lets the event loop run every `PASS_SLICE_S`
(`Slices`): at 100,000 partitions one step of any of them held it past the
metadata fetch's timeout. A pass that meets a disk error fails, not the
broker: the error is logged once with its fix and the pass runs again on
its next timer; an error that says a log dir failed takes that dir offline
(`broker.shell.log_dir_failure`) and the passes run on without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from broker.shell.log_manager import LogManager
    from broker.shell.replica_manager import ReplicaManager
    from storage.log import Log

#: The longest a periodic pass over every log holds the event loop at once.
PASS_SLICE_S = 0.02
#: A walk looks at the clock once per this many logs.
SLICE_CHECK_EVERY = 256
#: How often the logs that could not be opened (a resource limit, a disk
#: error) are tried again.
OFFLINE_RETRY_MS = 10_000

_PASS_NAMES = {"flush": "flush.ms", "hw": "high-watermark checkpoint", "recovery": "recovery-point checkpoint",
               "retention": "retention", "producers": "producer-id expiration", "offline": "offline-partition retry"}

_log = logging.getLogger("broker")


class Slices:
    """Lets the event loop run every `slice_s` of a long walk."""

    def __init__(self, slice_s: float) -> None:
        self.slice_s = slice_s
        self._started = time.monotonic()

    async def check(self) -> None:
        if time.monotonic() - self._started >= self.slice_s:
            await trio.lowlevel.checkpoint()
            self._started = time.monotonic()


async def run_log_passes(broker) -> None:
    """The passes of the module doc, until cancelled."""
    config = broker.config
    due = {
        "hw": config.replica_high_watermark_checkpoint_interval_ms,
        "recovery": min(config.log_flush_offset_checkpoint_interval_ms,
                        config.log_flush_start_offset_checkpoint_interval_ms),
        "retention": config.log_retention_check_interval_ms,
        "producers": config.producer_id_expiration_check_interval_ms,
        "offline": OFFLINE_RETRY_MS,
    }
    log_manager: LogManager = broker.log_manager
    replicas: ReplicaManager = broker.replicas

    async def flush(now: int) -> None:
        log_manager.flush_due(now)

    async def checkpoint_high_watermarks(now: int) -> None:
        await log_manager.checkpoint_high_watermarks_in_thread(await high_watermarks_in_slices(replicas))

    async def checkpoint_logs(now: int) -> None:
        await log_manager.checkpoint_logs_in_slices()

    async def retention(now: int) -> None:
        await enforce_retention_in_slices(log_manager, now)

    async def producers(now: int) -> None:
        await remove_expired_producers_in_slices(log_manager, now)

    async def retry_offline(now: int) -> None:
        if replicas.offline:
            replicas.retry_offline(broker.image)

    steps = (("flush", flush), ("hw", checkpoint_high_watermarks), ("recovery", checkpoint_logs),
             ("retention", retention), ("producers", producers), ("offline", retry_offline))
    last = {name: broker.clock_ms() for name in due}
    tick_s = min(1.0, min(due.values()) / 1000)
    failing: dict[str, str] = {}
    while True:
        await trio.sleep(tick_s)
        if not broker.loaded:
            continue
        now = broker.clock_ms()
        for name, step in steps:
            if name != "flush" and now - last[name] < due[name]:
                continue
            try:
                await step(now)
            except OSError as exc:
                if replicas.path_error(exc):
                    continue  # its log dir goes offline (`Broker._fail_log_dirs`); the pass runs on without it
                # A full or failing disk fails this pass, not the broker:
                # the appends that cannot be persisted already answer
                # KAFKA_STORAGE_ERROR, and the pass is tried again on its
                # next timer, so it succeeds once space returns.
                cause = f"{exc.strerror or exc} ({getattr(exc, 'filename', None) or 'a log directory'})"
                if failing.get(name) != cause:
                    _log.error("broker %d: the %s pass failed: %s; it is retried every %d ms: free space "
                               "on the log directory, or replace the failing disk", broker.node_id,
                               _PASS_NAMES[name], cause, due.get(name, tick_s * 1000))
                failing[name] = cause
                continue
            if failing.pop(name, None) is not None:
                _log.info("broker %d: the %s pass succeeds again", broker.node_id, _PASS_NAMES[name])
            if name != "flush":
                last[name] = now


async def high_watermarks_in_slices(replicas: ReplicaManager,
                                    slice_s: float = PASS_SLICE_S) -> dict[tuple[str, int], int]:
    """Every hosted partition's high watermark, letting the event loop run every `slice_s`."""
    out: dict[tuple[str, int], int] = {}
    slices = Slices(slice_s)
    for i, (tp, hp) in enumerate(list(replicas.partitions.items())):
        if i % SLICE_CHECK_EVERY == 0:
            await slices.check()
        out[tp] = hp.state.high_watermark
    return out


async def enforce_retention_in_slices(log_manager: LogManager, now_ms: int, slice_s: float = PASS_SLICE_S) -> int:
    """Delete segments by `retention.ms` / `retention.bytes`, letting the
    event loop run every `slice_s`; the count deleted."""
    deleted = 0
    async for log in walk_logs(log_manager.logs, slice_s):
        deleted += log.delete_old_segments(now_ms)
    return deleted


async def remove_expired_producers_in_slices(log_manager: LogManager, now_ms: int,
                                             slice_s: float = PASS_SLICE_S) -> int:
    """Forget idempotent producers idle for `producer.id.expiration.ms`,
    letting the event loop run every `slice_s`; how many."""
    removed = 0
    async for log in walk_logs(log_manager.logs, slice_s):
        if log.producer_state is not None:
            removed += len(log.producer_state.remove_expired_producers(now_ms))
    return removed


async def walk_logs(logs: Mapping[tuple[str, int], Log], slice_s: float) -> AsyncIterator[Log]:
    """The open logs, the event loop let run every `slice_s`; a log
    closed while the walk yielded is skipped."""
    slices = Slices(slice_s)
    for i, (tp, log) in enumerate(list(logs.items())):
        if i % SLICE_CHECK_EVERY == 0:
            await slices.check()
        if logs.get(tp) is log:
            yield log
