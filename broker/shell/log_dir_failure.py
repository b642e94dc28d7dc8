"""A failed log directory taken offline, the broker serving on from the others (I/O shell).

Theory of operation
-------------------
Kafka's LogDirFailureChannel. With several `log.dirs`, an I/O error that
says the directory's disk failed (`DIR_FAILURE_ERRNOS`: EIO, EROFS, a
device gone; or the directory removed or unmounted) takes that directory
offline; ENOSPC and EMFILE stay the operation's own error (retention or
closed files free them). With one log dir, the same errors fail only the
operation (the partition answers KAFKA_STORAGE_ERROR and writes resume
when the disk does): there is no other directory to serve from.

- **Found.** Whoever meets the error (a produce, a follower's append, a
  periodic pass) calls `ReplicaManager.disk_error` (or `path_error`, for a
  pass over many logs): `failing_dir` says whether the error is the
  directory's, and the directory is only queued (`pending_dir_failures`,
  `dir_failed`), because the error is met inside loops over the partitions.
- **Taken offline.** The broker's task calls `fail_pending_dirs`;
  `fail_log_dir` stops every replica in the directory (no leading, no
  fetching) and `LogManager.fail_dir` releases its logs without another
  write: no new log is placed there, its checkpoints and clean-shutdown
  marker are no longer written (its logs are recovered at the next start),
  and its partitions answer KAFKA_STORAGE_ERROR (`storage_error`) whatever
  later metadata says, until the broker is restarted with the directory
  healthy. The other directories serve on.
- **Reported.** Each directory has a stable id (`dir_id`, derived from its
  path). The broker lists the offline ones in its heartbeats and sends
  AssignReplicasToDirs for the partitions that were there
  (`broker.shell.quorum_link`); the controller moves their leadership and
  ISR membership to the other replicas.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from storage.log import parse_topic_partition

if TYPE_CHECKING:
    from broker.shell.log_manager import LogManager

#: The errors that say a log directory's disk failed, not one operation:
#: Kafka takes the directory offline on any IOException; ENOSPC and EMFILE
#: stay the operation's own error (retention or closed files free them).
DIR_FAILURE_ERRNOS = frozenset({errno.EIO, errno.EROFS, errno.ENODEV, errno.ENXIO, errno.ESTALE})

_log = logging.getLogger("broker.log_manager")


def dir_id(log_dir: str) -> uuid.UUID:
    """A log directory's id, as the broker reports it to the controller
    (Kafka's `directory.id`): stable for as long as the path is."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "raftka-log-dir:" + os.path.abspath(log_dir))


def failing_dir(log_dirs: list[str], offline_dirs: dict[str, str], log_dir: str | None,
                exc: OSError) -> str | None:
    """`log_dir`, when `exc`, met on a log in it, takes it offline; None
    when the error is the operation's own (module doc)."""
    if log_dir is None or len(log_dirs) < 2:
        return None
    if log_dir in offline_dirs:
        return log_dir
    if exc.errno in DIR_FAILURE_ERRNOS:
        return log_dir
    if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(log_dir):
        return log_dir  # the directory was removed, or its disk unmounted
    return None


def log_dir_offline(log_dir: str, reason: str, partitions: int, online: list[str]) -> None:
    """The one error line of a log dir going offline: the cause and the fix."""
    _log.error("log dir %s is offline: %s; its %d partition(s) answer KAFKA_STORAGE_ERROR and their "
               "leadership moves to other replicas; %s. Fix: check the disk (dmesg); replace or remount it "
               "(an empty directory is fine: the replicas are copied back from their leaders) and restart "
               "the broker.", log_dir, reason, partitions,
               f"the broker serves on from {', '.join(online)}" if online else "no log dir is left")


class ReplicaDirFailures:
    """The `ReplicaManager`'s part (module doc): finding, queueing and
    acting on a failed log dir. The attributes are the replica manager's."""

    log_manager: LogManager
    partitions: dict
    offline: dict
    on_follow: Callable[..., None]
    #: Partitions whose log dir is offline (`fail_log_dir`): key -> the dir.
    #: Never retried: the dir comes back only with a restart.
    dir_offline: dict[tuple[str, int], str]
    #: Log dirs a request or pass found failed, taken offline by the
    #: broker's task (`fail_pending_dirs`): dir -> the error.
    pending_dir_failures: dict[str, str]
    dir_failed: trio.Event
    #: Called with the dir after `fail_log_dir` (the broker tells the controller).
    on_dir_offline: Callable[[str], None]
    #: Whether a failed log dir goes offline: only where the controller can
    #: be told (KRaft: `broker.shell.quorum_link` sets it). A ZooKeeper-mode
    #: broker keeps the one-dir rule (the partition's operations fail).
    log_dirs_can_go_offline: bool

    def disk_error(self, topic: str, partition: int, exc: OSError) -> bool:
        """An I/O error on a partition's log: whether it takes the log dir
        offline (module doc). Only queued here (`fail_pending_dirs` acts):
        callers are inside loops over the partitions."""
        log_dir = self.log_manager.failed_dir(topic, partition, exc) if self.log_dirs_can_go_offline else None
        if log_dir is None:
            return False
        if log_dir not in self.log_manager.offline_dirs and log_dir not in self.pending_dir_failures:
            self.pending_dir_failures[log_dir] = f"{exc.strerror or exc} on {topic}-{partition}"
            self.dir_failed.set()
        return True

    def path_error(self, exc: OSError) -> bool:
        """`disk_error` for an error of a pass over many logs (checkpoints,
        retention): the dir is found from the file named by the error."""
        if not self.log_dirs_can_go_offline:
            return False
        path = os.path.abspath(str(getattr(exc, "filename", "") or ""))
        for log_dir in self.log_manager.log_dirs:
            if path == log_dir or path.startswith(log_dir + os.sep):
                name = os.path.relpath(path, log_dir).split(os.sep)[0]
                tp = parse_topic_partition(name)
                if tp is not None and self.log_manager.dir_of(*tp) == log_dir:
                    return self.disk_error(tp[0], tp[1], exc)
                if len(self.log_manager.log_dirs) > 1 and log_dir not in self.log_manager.offline_dirs and (
                        exc.errno in DIR_FAILURE_ERRNOS or not os.path.isdir(log_dir)):
                    self.pending_dir_failures.setdefault(log_dir, f"{exc.strerror or exc} on {path}")
                    self.dir_failed.set()
                    return True
        return False

    def fail_pending_dirs(self) -> list[str]:
        """Take offline the log dirs `disk_error` queued; the dirs."""
        pending, self.pending_dir_failures = self.pending_dir_failures, {}
        self.dir_failed = trio.Event()
        for log_dir, reason in pending.items():
            self.fail_log_dir(log_dir, reason)
        return list(pending)

    def fail_log_dir(self, log_dir: str, reason: str) -> None:
        """Stop every replica in `log_dir` and take it offline (module doc)."""
        for key in self.log_manager.fail_dir(log_dir, reason):
            self.dir_offline[key] = log_dir
            self.offline.pop(key, None)
            hp = self.partitions.pop(key, None)
            if hp is not None:
                self.on_follow(key[0], key[1], hp.state.topic_id, -1, -1)
                self._drop(hp)
                hp.state.stop()
                hp.notify()
        self.on_dir_offline(log_dir)
