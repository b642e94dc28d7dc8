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

from quorum.raft.messages import SnapshotId
from quorum.raft.storage_log import StorageReplicatedLog, snapshot_file_name
from quorum.raft.voters import VoterInfo, voters_control_batch
from storage.checkpoint import write_atomically
from storage.fs import OsFileSystem
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


def write_bootstrap_voters(log_dir: str, voters: tuple[VoterInfo, ...]) -> str:
    """Start a dynamic quorum's metadata log: the snapshot at offset 0
    (`00000000000000000000-0000000000.checkpoint`, as Kafka's
    `kafka-storage format --standalone / --initial-controllers` writes)
    holding the KRaftVersionRecord and the VotersRecord of the first voter
    set, before an empty image. Returns the file's path."""
    from quorum.node.snapshots import encode_snapshot

    snapshot_id = SnapshotId(end_offset=0, epoch=0)
    directory = metadata_log_dir(log_dir)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, snapshot_file_name(snapshot_id))
    data = voters_control_batch(voters, base_offset=0, epoch=0) + encode_snapshot([], snapshot_id)
    write_atomically(OsFileSystem(), path, data)
    return path
