"""Where a node's metadata log lives, and how it is opened.

The metadata log is the partition `__cluster_metadata-0` in the node's
first log dir, kept by `quorum.raft.storage_log.StorageReplicatedLog` over
the same storage engine as data partitions (so its files read like
Kafka's), with the snapshot files and the `quorum-state` file beside the
segments. Segments roll at `metadata.log.segment.bytes` (8 MiB here, so
that a snapshot soon frees whole segments; Kafka's default is 1 GiB);
nothing is deleted by time or size, only below a snapshot. A batch may
hold up to 8 MiB (Kafka's raft MAX_BATCH_SIZE_BYTES).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from quorum.raft.storage_log import StorageReplicatedLog
from storage.config import LogConfig

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION_DIR = f"{METADATA_TOPIC}-0"
MAX_BATCH_BYTES = 8 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 8 * 1024 * 1024


def metadata_log_dir(log_dir: str) -> str:
    return os.path.join(log_dir, METADATA_PARTITION_DIR)


def open_metadata_log(log_dir: str, *, clock_ms: Callable[[], int],
                      segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> StorageReplicatedLog:
    config = LogConfig(segment_bytes=segment_bytes, segment_ms=2**62, retention_ms=-1, retention_bytes=-1,
                       max_message_bytes=MAX_BATCH_BYTES + 1024)
    return StorageReplicatedLog.open(metadata_log_dir(log_dir), now_ms=clock_ms(), config=config, clock_ms=clock_ms)
