"""The recovery-point and log-start checkpoints of many logs at once.

A log directory holds one `recovery-point-offset-checkpoint` and one
`log-start-offset-checkpoint` for all its partitions, each rewritten whole
(temp file, fsync, rename). A broker's periodic pass and its shutdown write
them for thousands of logs: grouped here by directory, each file is read,
written and fsynced once, not once per log (which made a shutdown
quadratic in partitions).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_OFFSET_CHECKPOINT, OffsetCheckpointFile
from storage.fs import OsFileSystem


def write_checkpoints_of(
    logs: Iterable[Any], removed: Mapping[str, Iterable[tuple[str, int]]] | None = None
) -> None:
    """Write the recovery point and log start offset checkpoints of `logs`,
    each per-directory file once: one read, one write and one fsync per
    file, not per log (a broker's periodic pass over thousands of logs, its
    shutdown). `removed`: per parent directory, partitions whose entries go
    (deleted logs)."""
    by_parent: dict[str, list[Any]] = {}
    for log in logs:
        if log.checkpoint_files:
            parent = os.path.dirname(os.path.normpath(log.dir_path)) or "."
            by_parent.setdefault(parent, []).append(log)
    removed = removed or {}
    for parent in removed:
        by_parent.setdefault(parent, [])
    for parent, group in by_parent.items():
        fs = group[0].fs if group else OsFileSystem()
        gone = removed.get(parent, ())
        OffsetCheckpointFile(fs, os.path.join(parent, RECOVERY_POINT_OFFSET_CHECKPOINT)).update(
            {log.topic_partition: log.recovery_point for log in group}, removed=gone)
        OffsetCheckpointFile(fs, os.path.join(parent, LOG_START_OFFSET_CHECKPOINT)).update(
            {log.topic_partition: log.log_start_offset for log in group}, removed=gone)
        for log in group:
            log.checkpoints_written()
