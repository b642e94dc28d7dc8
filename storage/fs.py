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
"""

from __future__ import annotations

import os
from typing import Iterable, Protocol


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


class OsFile:
    """A real file descriptor. `fileno()` is what `os.sendfile` needs."""

    __slots__ = ("path", "size", "_fd")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.size = os.fstat(self._fd).st_size

    def fileno(self) -> int:
        return self._fd

    def append(self, data) -> int:
        position = self.size
        n = os.pwrite(self._fd, data, position)
        if n != len(data):
            n += self._finish_short_write(memoryview(data)[n:], position + n)
        self.size = position + n
        return position

    def appendv(self, parts) -> int:
        position = self.size
        parts = list(parts)
        total = sum(len(p) for p in parts)
        n = os.pwritev(self._fd, parts, position)
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
            written += os.pwrite(self._fd, rest[written:], position + written)
        return written

    def pwrite(self, data, position: int) -> None:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.pwrite(self._fd, view[done:], position + done)
        self.size = max(self.size, position + len(view))

    def pread(self, size: int, position: int) -> bytes:
        return os.pread(self._fd, size, position)

    def readinto(self, buf, position: int) -> int:
        return os.preadv(self._fd, [buf], position)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self.size = size

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return f"OsFile({self.path!r}, size={self.size})"


class OsFileSystem:
    """The real file system."""

    def open(self, path: str) -> OsFile:
        return OsFile(path)

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
        fd = os.open(dir_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()
