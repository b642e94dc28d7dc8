"""A storage error on a partition: logged once per partition and cause, with what an operator does about it."""

from __future__ import annotations

import errno
import logging

_log = logging.getLogger("broker.replica_manager")


class StorageErrorLogger:
    """Logs a storage error once per partition and cause (errno), with the
    fix; the same error again goes to DEBUG (a client retrying a produce
    to a partition whose disk is full would otherwise flood the log)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int | None]] = set()
        self._fixes_told: set[int | None] = set()
        self._reports: dict[int | None, int] = {}

    #: Partitions reported at ERROR per cause; past that, DEBUG (a limit hit
    #: while creating 10,000 partitions is one problem, not 10,000 lines).
    MAX_REPORTS = 10

    def report(self, where: str, what: str, exc: OSError,
               consequence: str = "it answers KAFKA_STORAGE_ERROR, the other partitions serve on") -> None:
        key = (where, exc.errno)
        if key in self._seen:
            _log.debug("%s: %s: %s", where, what, exc)
            return
        self._seen.add(key)
        reported = self._reports.get(exc.errno, 0)
        self._reports[exc.errno] = reported + 1
        if reported >= self.MAX_REPORTS:
            if reported == self.MAX_REPORTS:
                _log.error("more partitions fail with %s; those are logged at DEBUG", exc.strerror)
            _log.debug("%s: %s: %s", where, what, exc)
            return
        # The fix once per cause: a burst of partitions failing alike is one problem.
        fix = "" if exc.errno in self._fixes_told else " " + storage_error_fix(exc)
        self._fixes_told.add(exc.errno)
        _log.error("%s: %s: %s; %s.%s", where, what, exc, consequence, fix)


def storage_error_fix(exc: OSError) -> str:
    """What an operator does about `exc`."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ("Fix: raise the open-files limit (ulimit -n, LimitNOFILE) or lower log.max.open.files "
                "(segment files kept open; sockets need the rest).")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "Fix: free space on the log directory's disk, or lower retention.bytes / retention.ms."
    if exc.errno == errno.EIO:
        return ("Fix: the disk failed an I/O; reads are still served, writes answer KAFKA_STORAGE_ERROR until "
                "the disk writes again. Check the device (dmesg); if it is failing, stop the broker, move the "
                "log directory off it and start it again: it recovers its logs from their files, and its "
                "replicas catch up from the leaders.")
    return "Fix: check the log directory's permissions and disk."


storage_error_logger = StorageErrorLogger()
