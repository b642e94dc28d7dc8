"""The file layer under the log: a small interface and its real implementation.

Theory of operation
-------------------
The log engine touches files only through `FileSystem` and `File`, so a test
can run it on `storage.sim_fs.SimFileSystem`, an in-memory disk that loses
what was not fsynced when it "crashes". `OsFileSystem` is the real thing:
plain `os` calls on file descriptors, nothing buffered in Python, so what
`append` returns is in the page cache and what `fsync` returns is on disk.

The durability contract both implementations keep (POSIX's, read strictly):

- `File.fsync()` makes the file's bytes durable, not its name.
- A create, rename or remove is durable only after `fsync_dir` on the
  directory that holds the name.
- Until then a crash may undo any of them, and keep any prefix of unsynced
  writes (a "torn" write).

`File.size` is tracked in memory (one writer per file: the log), so the
append path costs one system call.

The broker's partition logs open their segment files (`open_segment`)
lazily through a bounded `OpenFileCache` (`log.max.open.files`) given to
their `OsFileSystem`: a broker holds a descriptor only for the segments in
use, not one per partition, so the open-files limit is no partition limit.
Other files (indexes, checkpoints) are open only while read or written.

A test-only variant that fails writes with EIO on a switch file
(`raftka.test.disk.fault.file`) lives in `storage.fault_fs`, apart from
the real classes here.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Protocol


class File(Protocol):
    """A file open for reading and writing; the log is its only writer."""

    path: str
    size: int

    def append(self, data) -> int:
        """Write `data` at the end; return the position it was written at."""

    def appendv(self, parts: Iterable) -> int:
        """Write the concatenation of `parts` at the end, in one system call
        where the platform has one; return the position."""

    def pwrite(self, data, position: int) -> None:
        """Write `data` at `position` (growing the file if needed)."""

    def pread(self, size: int, position: int) -> bytes:
        """Up to `size` bytes from `position` (fewer at the end of the file)."""

    def readinto(self, buf, position: int) -> int:
        """Fill `buf` from `position`; return the number of bytes read."""

    def truncate(self, size: int) -> None:
        """Cut the file to `size` bytes."""

    def fsync(self) -> None:
        """Make the bytes written so far durable."""

    def close(self) -> None:
        """Release the handle; the file stays."""


class FileSystem(Protocol):
    """Names and directories."""

    def open(self, path: str) -> File:
        """Open `path` read-write, creating it empty if it does not exist."""

    def exists(self, path: str) -> bool: ...

    def listdir(self, dir_path: str) -> list[str]: ...

    def makedirs(self, dir_path: str) -> None:
        """Create `dir_path` and its parents; durable at once."""

    def remove(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace `dst` with `src`."""

    def fsync_dir(self, dir_path: str) -> None:
        """Make creates, renames and removes in `dir_path` durable."""

    def read_file(self, path: str) -> bytes:
        """The whole content of `path`."""


logger = logging.getLogger("storage.fs")


class ClosedFileError(OSError, ValueError):
    """A use of a closed `OsFile`: an OSError (EBADF) to the log, a
    ValueError to a sender that checks for closed file objects."""


class OsFile:
    """A real file descriptor. `fileno()` is what `os.sendfile` needs.

    Built with a `cache` (`OpenFileCache`, the segments' files) it is
    opened lazily: the cache may close the descriptor of an idle file
    (`fd` is then -1), and the next use opens the same file again by path,
    its identity (device, inode) checked, so a reader never gets another
    file's bytes through a path that now names a new file."""

    __slots__ = ("_cache", "_closed", "_identity", "fd", "path", "pins", "size", "used")

    def __init__(self, path: str, cache: OpenFileCache | None = None, *, listed: bool = False) -> None:
        self.path = path
        self._cache = cache
        #: Set by every use; the cache's clock hand clears it (module doc of `OpenFileCache`).
        self.used = True
        #: While > 0 the cache never closes the descriptor.
        self.pins = 0
        self._closed = False
        self.fd = -1
        if listed and cache is not None:
            # A file the caller just listed (a log opened at start-up): its
            # size and identity from one stat, the descriptor at first use.
            # Opening 100,000 segments at start only to have the cache
            # close most of them again cost an open and a close each.
            st = os.stat(path)
            self.size = st.st_size
            self._identity = (st.st_dev, st.st_ino)
            return
        flags = os.O_RDWR | os.O_CREAT | _CLOEXEC
        fd = cache.open(path, flags) if cache is not None else os.open(path, flags, 0o644)
        st = os.fstat(fd)
        self.size = st.st_size
        self._identity = (st.st_dev, st.st_ino)
        self.fd = fd
        if cache is not None:
            cache.add(self)

    def fileno(self) -> int:
        fd = self.fd
        if fd < 0:
            fd = self._reopen()
        self.used = True
        return fd

    def _reopen(self) -> int:
        if self._closed:
            raise ClosedFileError(errno.EBADF, f"I/O operation on closed file {self.path}")
        cache = self._cache
        assert cache is not None
        fd = cache.open(self.path, os.O_RDWR | _CLOEXEC)  # never O_CREAT: a removed file stays removed
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise FileNotFoundError(
                errno.ESTALE, f"{self.path} now names another file (the segment was replaced or removed)"
            )
        self.fd = fd
        cache.add(self)
        return fd

    def evict(self) -> None:
        """Close the descriptor, keep the file usable (the cache calls it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def moved_to(self, path: str) -> None:
        """The file was renamed to `path`: reopen it there."""
        self.path = path

    def pin(self) -> None:
        """Open now, and keep the descriptor open until `unpin`."""
        self.fileno()
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1

    def append(self, data) -> int:
        position = self.size
        fd = self.fileno()
        n = os.pwrite(fd, data, position)
        if n != len(data):
            n += self._finish_short_write(memoryview(data)[n:], position + n)
        self.size = position + n
        return position

    def appendv(self, parts) -> int:
        position = self.size
        parts = list(parts)
        total = sum(len(p) for p in parts)
        n = os.pwritev(self.fileno(), parts, position)
        if n != total:
            rest = b"".join(bytes(p) for p in parts)[n:]
            n += self._finish_short_write(memoryview(rest), position + n)
        self.size = position + n
        return position

    def _finish_short_write(self, rest: memoryview, position: int) -> int:
        # A regular file writes short only when the disk fills up; the next
        # call then raises ENOSPC, which is what the caller should see.
        written = 0
        while written < len(rest):
            written += os.pwrite(self.fileno(), rest[written:], position + written)
        return written

    def pwrite(self, data, position: int) -> None:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fileno(), view[done:], position + done)
        self.size = max(self.size, position + len(view))

    def pread(self, size: int, position: int) -> bytes:
        return os.pread(self.fileno(), size, position)

    def readinto(self, buf, position: int) -> int:
        return os.preadv(self.fileno(), [buf], position)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fileno(), size)
        self.size = size

    def fsync(self) -> None:
        if _deferred_dirs is not None and threading.get_ident() == _deferring_thread:
            _deferred_dirs.add(os.path.dirname(self.path) or ".")
            return
        os.fsync(self.fileno())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._cache is not None:
            self._cache.discard(self)
        self.evict()

    def __repr__(self) -> str:
        return f"OsFile({self.path!r}, size={self.size})"


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Descriptors a process keeps for everything but segment files: sockets
#: (clients, replication, the quorum), checkpoints being written, the
#: interpreter's own. The default cache size leaves this many, or a quarter
#: of the limit if that is more.
FD_HEADROOM = 256


def default_max_open_files() -> int:
    """`log.max.open.files` by default: the process's open-files limit
    (RLIMIT_NOFILE, soft) less a headroom for sockets and other files."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(16, soft - max(FD_HEADROOM, soft // 4))


class OpenFileCache:
    """A bounded set of open segment files (`log.max.open.files`).

    Theory of operation: every lazily opened `OsFile` is registered here
    while its descriptor is open. Opening one more past `capacity` closes
    an idle one, chosen by the CLOCK rule: the files are kept in the order
    they were opened; the hand takes the oldest, and if it was used since
    the hand last passed (`used`), clears the flag and puts it back at the
    end; else closes it. A file in use at every pass (the active segment
    of a busy partition) keeps its descriptor; a use costs the hot path
    one attribute store. Pinned files are skipped.

    An open that fails with EMFILE/ENFILE (`log.max.open.files` set above
    what the process may open, or sockets took the rest) closes an eighth
    of the cache, lowers `capacity` to what is left, so that sockets and
    other files find descriptors from then on, logs that once with the fix,
    and tries once more; if that fails too it raises: the caller fails
    that one operation (`shrink` does the same for a failure elsewhere).

    Event-loop only: eviction closes descriptors that the loop's code reads
    without a lock; a worker thread opens its files without the cache.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity or default_max_open_files()
        self._open: dict[OsFile, None] = {}
        #: Counters, for tests and benches.
        self.opens = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def open(self, path: str, flags: int) -> int:
        if len(self._open) >= self.capacity:
            self._evict(len(self._open) - self.capacity + 1)
        self.opens += 1
        try:
            return os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._open:
                raise
            self.shrink(exc)
            return os.open(path, flags, 0o644)

    def shrink(self, exc: OSError) -> None:
        """The process ran out of descriptors (`exc`): close an eighth of
        the open files and keep the cache at most that size from now on."""
        was = self.capacity
        self._evict(max(1, len(self._open) // 8))
        self.capacity = max(16, min(self.capacity, len(self._open)))
        if self.capacity < was:
            logger.warning(
                "%s: log.max.open.files lowered from %d to %d, the segment files open when the process "
                "reached its open-files limit; fix: raise the open-files limit (ulimit -n) or lower "
                "log.max.open.files", exc.strerror, was, self.capacity)

    def add(self, f: OsFile) -> None:
        self._open[f] = None

    def discard(self, f: OsFile) -> None:
        self._open.pop(f, None)

    def _evict(self, count: int) -> None:
        entries = self._open
        # Two passes of the hand at most: the first clears every `used`.
        budget = 2 * len(entries) + 1
        while count > 0 and entries and budget > 0:
            budget -= 1
            f = next(iter(entries))
            del entries[f]
            if f.pins > 0 or f.used:
                f.used = False
                entries[f] = None
                continue
            f.evict()
            self.evictions += 1
            count -= 1


#: Inside `deferred_fsync`: the directories whose files' fsyncs were put off,
#: and the thread that defers them (another thread's fsyncs, the Raft
#: log's in a worker thread, happen as they always do).
_deferred_dirs: set[str] | None = None
_deferring_thread: int | None = None


@contextlib.contextmanager
def deferred_fsync() -> Iterator[None]:
    """Put off every fsync of real files inside the block to one `syncfs`
    per file system at its end (a clean shutdown closing tens of thousands
    of logs: nine fsyncs each took minutes; one syncfs flushes the same).

    Only for work whose durability is declared after the block: nothing
    written inside is durable before it ends, and a crash inside may leave
    any of it torn, so what the block writes must be recoverable without
    it (the recovery point checkpoint is written after the block)."""
    global _deferred_dirs, _deferring_thread
    assert _deferred_dirs is None, "deferred_fsync does not nest"
    _deferred_dirs, _deferring_thread = set(), threading.get_ident()
    try:
        yield
    finally:
        dirs, _deferred_dirs, _deferring_thread = _deferred_dirs, None, None
        _sync_file_systems(dirs)


def _sync_file_systems(dirs: set[str]) -> None:
    """One `syncfs(2)` per file system holding `dirs` (`sync` where there is none)."""
    seen: set[int] = set()
    syncfs = _libc_syncfs()
    for path in sorted(dirs):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except FileNotFoundError:
            continue  # removed since: nothing of it to make durable
        try:
            dev = os.fstat(fd).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            if syncfs is None or syncfs(fd) != 0:
                os.sync()
        finally:
            os.close(fd)


def _libc_syncfs():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).syncfs
    except (ImportError, OSError, AttributeError):
        return None


class OsFileSystem:
    """The real file system. With a `segment_cache`, segment files are
    opened lazily through it (`open_segment`); the broker's partition logs
    use one, the Raft metadata log (flushed from a worker thread) none."""

    def __init__(self, segment_cache: OpenFileCache | None = None) -> None:
        self.segment_cache = segment_cache

    def open(self, path: str) -> OsFile:
        return OsFile(path)

    def open_segment(self, path: str) -> OsFile:
        """`open`, for a segment's `.log`: through the bounded cache of
        open files (`OpenFileCache`), if this file system has one."""
        return OsFile(path, self.segment_cache)

    def open_listed_segment(self, path: str) -> OsFile:
        """`open_segment`, for a segment file the caller saw in its
        directory's listing: opened at its first use, not now."""
        return OsFile(path, self.segment_cache, listed=True)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, dir_path: str) -> list[str]:
        return os.listdir(dir_path)

    def makedirs(self, dir_path: str) -> None:
        os.makedirs(dir_path, exist_ok=True)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def fsync_dir(self, dir_path: str) -> None:
        if _deferred_dirs is not None and threading.get_ident() == _deferring_thread:
            _deferred_dirs.add(dir_path)
            return
        fd = os.open(dir_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()
