"""A test-only disk fault switch over the real file layer (`storage.fs`).

`FaultSwitchFileSystem` is `OsFileSystem` with a switch for tests
(`raftka chaos`'s `eio` nemesis, `raftka.test.disk.fault.file`): while the
switch file says `eio`, every write, truncate, fsync, create, rename and
remove through it raises OSError(EIO), as a disk failing its writes does;
reads are served. `eio <dir>` fails only the paths under `dir` (one of
several `log.dirs`: one disk of a broker failing; a relative `dir` is
taken relative to the switch file's directory). A broker without the setting uses the plain classes
(`log_file_system` picks), so the switch costs the write path nothing there.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from storage.fs import OpenFileCache, OsFile, OsFileSystem

# The name the warnings always had: operators' log filters keep matching.
logger = logging.getLogger("storage.fs")


DISK_FAULT_FILE_KEY = "raftka.test.disk.fault.file"
#: What a switch file may hold: no fault (empty, or no file), or `eio` (optionally `eio <dir>`).
DISK_FAULTS = ("", "eio")
_FAULT_REREAD_S = 0.1


class DiskFaultSwitch:
    """The fault named in `path`, read again at most every 100 ms (from
    any thread: the state is two attributes, replaced whole).

    `check(path)` raises OSError(EIO) for `path` while the file says `eio`
    (and `path` is under the directory it names, if it names one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fault = ""
        #: The directory the fault is limited to ("" : every path).
        self.under = ""
        self._next_read = 0.0
        self._complained = ""

    def read(self) -> str:
        try:
            with open(self.path) as f:
                text = f.read(4096).strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:
            self._complain(f"cannot read {self.path} ({exc}); the disk fault stays {self.fault or 'none'}")
            return self._current_text()
        word, _, under = text.partition(" ")
        if word.lower() not in DISK_FAULTS or (under and not word):
            self._complain(f"{self.path} holds {text[:40]!r}; write `eio` (writes fail) or nothing (no fault), "
                           f"or `eio <dir>` (writes under dir fail); the disk fault stays {self.fault or 'none'}")
            return self._current_text()
        if not word:
            return ""
        under = under.strip()
        if under:
            under = os.path.join(os.path.dirname(os.path.abspath(self.path)), under)  # absolute stays itself
            return f"{word.lower()} {os.path.normpath(under)}"
        return word.lower()

    def _current_text(self) -> str:
        return f"{self.fault} {self.under}" if self.under else self.fault

    def _complain(self, message: str) -> None:
        if message != self._complained:  # once per distinct problem, not every 100 ms
            self._complained = message
            logger.warning("%s: %s", DISK_FAULT_FILE_KEY, message)

    def current(self) -> str:
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + _FAULT_REREAD_S
            text = self.read()
            if text != self._current_text():
                fault, _, under = text.partition(" ")
                logger.warning("%s: disk fault %s (from %s)", DISK_FAULT_FILE_KEY,
                               (f"on: writes under {under or 'the log dirs'} fail with EIO") if fault else "healed",
                               self.path)
                self.fault, self.under = fault, under
        return self.fault

    def check(self, path: str) -> None:
        if self.current():
            under = self.under
            if under and not (path == under or path.startswith(under + os.sep)):
                return
            raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (injected by {DISK_FAULT_FILE_KEY})", path)


class FaultSwitchFile(OsFile):
    """An `OsFile` whose writes and fsyncs ask the switch first.

    Its `fd` reads -1 always (the descriptor is in `_fd`), so the log's
    inline write paths, which write to `fd` directly when it is open, take
    the file's own `append` instead, where the switch is asked."""

    __slots__ = ("_fd", "_switch")

    def __init__(self, path: str, cache: OpenFileCache | None, switch: DiskFaultSwitch) -> None:
        self._switch = switch
        self._fd = -1
        super().__init__(path, cache)

    @property
    def fd(self) -> int:  # type: ignore[override]
        return -1

    @fd.setter
    def fd(self, value: int) -> None:
        self._fd = value

    def fileno(self) -> int:
        fd = self._fd
        if fd < 0:
            fd = self._reopen()
        self.used = True
        return fd

    def evict(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def append(self, data) -> int:
        self._switch.check(self.path)
        return super().append(data)

    def appendv(self, parts) -> int:
        self._switch.check(self.path)
        return super().appendv(parts)

    def pwrite(self, data, position: int) -> None:
        self._switch.check(self.path)
        super().pwrite(data, position)

    def truncate(self, size: int) -> None:
        # Cutting back a write the switch refused changes nothing: allowed,
        # so the log's rollback after a failed append does not fail too.
        if size < self.size:
            self._switch.check(self.path)
        super().truncate(size)

    def fsync(self) -> None:
        self._switch.check(self.path)
        super().fsync()




class FaultSwitchFileSystem(OsFileSystem):
    """`OsFileSystem` whose writes fail with EIO while `switch` says so (module doc)."""

    def __init__(self, switch: DiskFaultSwitch, segment_cache: OpenFileCache | None = None) -> None:
        super().__init__(segment_cache)
        self.switch = switch

    def _open(self, path: str, cache: OpenFileCache | None) -> OsFile:
        if not os.path.exists(path):
            self.switch.check(path)  # creating a file writes its directory
        return FaultSwitchFile(path, cache, self.switch)

    def open(self, path: str) -> OsFile:
        return self._open(path, None)

    def open_segment(self, path: str) -> OsFile:
        return self._open(path, self.segment_cache)

    def open_listed_segment(self, path: str) -> OsFile:
        # Opened at once: the descriptor lives in `FaultSwitchFile._fd`.
        return self._open(path, self.segment_cache)

    def makedirs(self, dir_path: str) -> None:
        if not os.path.isdir(dir_path):
            self.switch.check(dir_path)
        super().makedirs(dir_path)

    def remove(self, path: str) -> None:
        self.switch.check(path)
        super().remove(path)

    def rename(self, src: str, dst: str) -> None:
        self.switch.check(dst)
        super().rename(src, dst)

    def fsync_dir(self, dir_path: str) -> None:
        self.switch.check(dir_path)
        super().fsync_dir(dir_path)


def log_file_system(log_dir: str, fault_file: str = "", segment_cache: OpenFileCache | None = None) -> OsFileSystem:
    """The file system of a broker's partition logs: the plain one, or,
    when a test names a fault switch file (`raftka.test.disk.fault.file`,
    relative to the first log dir), one that fails writes on its word."""
    if not fault_file.strip():
        return OsFileSystem(segment_cache)
    switch = DiskFaultSwitch(os.path.join(log_dir, fault_file.strip()))  # an absolute path stays itself
    logger.warning("%s=%s: a test setting; the partition logs' writes fail with EIO while %s says `eio`",
                   DISK_FAULT_FILE_KEY, fault_file.strip(), switch.path)
    return FaultSwitchFileSystem(switch, segment_cache)
