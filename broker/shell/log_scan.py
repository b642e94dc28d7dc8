"""What a broker's log dirs hold at start, read before the logs open (I/O shell).

Theory of operation
-------------------
`scan_log_dirs` reads what opening the logs found at start needs: each log
dir's names, each partition directory's listing and `partition.metadata`
(the topic id, KIP-516), the directories read by `SCAN_THREADS` threads at
once. It only reads, so a broker runs it in a worker thread before
`LogManager.load`. At 100,000 partitions the directories, read one by one
as each log opened, were most of a restart. Two threads let one wait for
the disk while the other runs; more fight over the GIL for these short
calls: reading 100,000 directories (5 files each) took 14.0 s cold and
8.7-12.0 s warm with 2 threads, 17.3 s and 6.5-8.1 s with 1, 25 s and
13.4-18.5 s with 16 (cold: after dropping the page cache).

`finish_leftovers` removes what an earlier run left half done in a log
dir: a deletion renamed `-delete` and a replica move's `-future` copy.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import time
import uuid

from quorum.node.metadata_log import METADATA_PARTITION_DIR
from storage.log import parse_topic_partition

PARTITION_METADATA_FILE = "partition.metadata"
DELETE_SUFFIX = "-delete"
#: A replica's copy being moved into this dir (Kafka's future log).
FUTURE_SUFFIX = "-future"

#: Threads that read the partition directories at start (module doc).
SCAN_THREADS = 2

#: One log dir as read at start: its entries (name, is a directory), the
#: names of its partition directories, and per partition directory its
#: listing (None: it could not be listed) and topic id (None: no
#: `partition.metadata`).
ScannedDir = tuple[list[tuple[str, bool]], list[str], dict[str, tuple[list[str] | None, uuid.UUID | None]]]

_log = logging.getLogger("broker.log_manager")


def scan_log_dirs(log_dirs: list[str]) -> dict[str, ScannedDir]:
    """Each log dir (created if missing) as read at start (module doc)."""
    scanned: dict[str, ScannedDir] = {}
    for log_dir in log_dirs:
        started = time.monotonic()
        os.makedirs(log_dir, exist_ok=True)
        # One scandir: its entries say which are directories without a
        # stat each. The metadata log lives beside the partitions in the
        # first log dir (Kafka's metadata.log.dir default) and belongs
        # to the Raft node.
        with os.scandir(log_dir) as entries:
            names = [(e.name, e.is_dir()) for e in entries]
        partition_dirs = [n for n, is_dir in names
                          if is_dir and n != METADATA_PARTITION_DIR and parse_topic_partition(n) is not None]
        with concurrent.futures.ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="log-scan") as pool:
            found = dict(zip(partition_dirs, pool.map(_scan_partition_dir,
                                                      (os.path.join(log_dir, n) for n in partition_dirs),
                                                      chunksize=256)))
        scanned[log_dir] = (names, partition_dirs, found)
        if partition_dirs:
            _log.info("%s: read %d partition directories in %.1f s", log_dir, len(partition_dirs),
                      time.monotonic() - started)
    return scanned


def finish_leftovers(log_dir: str, names: list[tuple[str, bool]]) -> None:
    """Remove a deletion's and an unfinished replica move's leftovers (module doc)."""
    for name, _is_dir in names:
        if name.endswith(DELETE_SUFFIX):
            _log.info("%s: finishing the deletion of %s", log_dir, name)
            shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)
        elif name.endswith(FUTURE_SUFFIX):
            # A move between log dirs the last run did not finish (it is not resumed).
            _log.warning("%s: removing %s, the copy of a replica move between log dirs that did not "
                         "finish before the broker stopped; send the AlterReplicaLogDirs again",
                         log_dir, name)
            shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)


def _scan_partition_dir(path: str) -> tuple[list[str] | None, uuid.UUID | None]:
    """A partition directory's listing and topic id (in a worker thread)."""
    try:
        listing = os.listdir(path)
    except OSError:
        return None, None  # the log's open lists it again and reports the error
    try:
        topic_id = read_topic_id(path) if PARTITION_METADATA_FILE in listing else None
    except OSError:
        topic_id = None
    return listing, topic_id


def read_topic_id(path: str) -> uuid.UUID | None:
    """The topic id in the partition directory's `partition.metadata` (None: no such file)."""
    try:
        with open(os.path.join(path, PARTITION_METADATA_FILE)) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            try:
                return uuid.UUID(value.strip())
            except ValueError:
                break
    _log.warning("%s/%s is malformed; treating the log as of unknown topic id", path, PARTITION_METADATA_FILE)
    return None
