"""An in-memory file system that loses what was not fsynced when it crashes.

Theory of operation
-------------------
Each file is an inode with two contents: `data` (what reads see now: the
page cache) and `synced` (what is on disk), plus the list of operations
made since the last fsync. Each directory has two name tables: the
visible one and the durable one, which `fsync_dir` copies the visible one
into (directories themselves are created durable).

`crash()` is a power cut. Every handle opened before it dies, so a test
cannot keep writing through a stale `Log`. The durable name tables become
the visible ones (`lose_dir_ops=True`), undoing creates, renames and removes
not followed by `fsync_dir`. Every inode falls back to its synced content.
With `tear=True` a seeded `Random` also replays a random prefix of the
unsynced operations, the last of them possibly cut short, as a disk that
wrote back some pages before the cut would leave it.

All randomness comes from the `seed` given at construction, so a failing
test replays exactly.
"""

from __future__ import annotations

import os
import random
from typing import Iterable

from storage.errors import StorageError


class SimCrashedError(StorageError):
    """A handle opened before `SimFileSystem.crash()` was used after it:
    reopen the log (as a restarted process would) instead."""


class _Inode:
    __slots__ = ("data", "synced", "pending")

    def __init__(self) -> None:
        self.data = bytearray()
        self.synced = b""
        # ("write", position, bytes) or ("truncate", size), since the last fsync.
        self.pending: list[tuple] = []


class SimFile:
    """A handle on a simulated file (see `storage.fs.File`)."""

    __slots__ = ("path", "_fs", "_inode", "_generation")
    #: No descriptor: the log's append fast path writes through `append`.
    fd = -1

    def __init__(self, fs: SimFileSystem, path: str, inode: _Inode) -> None:
        self.path = path
        self._fs = fs
        self._inode = inode
        self._generation = fs.generation

    def _live(self) -> _Inode:
        if self._generation != self._fs.generation:
            raise SimCrashedError(
                f"{self.path} was opened before a simulated crash; reopen it after the crash"
            )
        return self._inode

    @property
    def size(self) -> int:
        return len(self._live().data)

    def append(self, data) -> int:
        inode = self._live()
        position = len(inode.data)
        chunk = bytes(data)
        inode.data += chunk
        inode.pending.append(("write", position, chunk))
        return position

    def appendv(self, parts: Iterable) -> int:
        return self.append(b"".join(bytes(p) for p in parts))

    def pwrite(self, data, position: int) -> None:
        inode = self._live()
        chunk = bytes(data)
        if position > len(inode.data):
            inode.data += bytes(position - len(inode.data))
        inode.data[position : position + len(chunk)] = chunk
        inode.pending.append(("write", position, chunk))

    def pread(self, size: int, position: int) -> bytes:
        return bytes(self._live().data[position : position + size])

    def readinto(self, buf, position: int) -> int:
        chunk = self.pread(len(buf), position)
        memoryview(buf)[: len(chunk)] = chunk
        return len(chunk)

    def truncate(self, size: int) -> None:
        inode = self._live()
        if size < len(inode.data):
            del inode.data[size:]
        else:
            inode.data += bytes(size - len(inode.data))
        inode.pending.append(("truncate", size))

    def fsync(self) -> None:
        inode = self._live()
        inode.synced = bytes(inode.data)
        inode.pending.clear()
        self._fs.fsync_count += 1

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"SimFile({self.path!r})"


class SimFileSystem:
    """In-memory `storage.fs.FileSystem` with crash simulation (see module doc)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.generation = 0
        self.fsync_count = 0
        self._visible: dict[str, dict[str, _Inode]] = {}
        self._durable: dict[str, dict[str, _Inode]] = {}

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.normpath(path)
        return os.path.dirname(path), os.path.basename(path)

    def _dir(self, dir_path: str) -> dict[str, _Inode]:
        d = self._visible.get(os.path.normpath(dir_path))
        if d is None:
            raise FileNotFoundError(f"simulated directory {dir_path} does not exist")
        return d

    def open(self, path: str) -> SimFile:
        parent, name = self._split(path)
        entries = self._dir(parent)
        inode = entries.get(name)
        if inode is None:
            inode = entries[name] = _Inode()
        return SimFile(self, path, inode)

    def exists(self, path: str) -> bool:
        parent, name = self._split(path)
        norm = os.path.normpath(path)
        return norm in self._visible or name in self._visible.get(parent, {})

    def listdir(self, dir_path: str) -> list[str]:
        norm = os.path.normpath(dir_path)
        names = list(self._dir(norm))
        names += [os.path.basename(d) for d in self._visible if os.path.dirname(d) == norm and d != norm]
        return names

    def makedirs(self, dir_path: str) -> None:
        norm = os.path.normpath(dir_path)
        while norm not in self._visible:
            self._visible[norm] = {}
            self._durable[norm] = {}
            parent = os.path.dirname(norm)
            if parent == norm:
                break
            norm = parent

    def remove(self, path: str) -> None:
        parent, name = self._split(path)
        entries = self._dir(parent)
        if name not in entries:
            raise FileNotFoundError(f"simulated file {path} does not exist")
        del entries[name]

    def rename(self, src: str, dst: str) -> None:
        src_parent, src_name = self._split(src)
        dst_parent, dst_name = self._split(dst)
        inode = self._dir(src_parent).pop(src_name, None)
        if inode is None:
            raise FileNotFoundError(f"simulated file {src} does not exist")
        self._dir(dst_parent)[dst_name] = inode

    def fsync_dir(self, dir_path: str) -> None:
        norm = os.path.normpath(dir_path)
        self._durable[norm] = dict(self._dir(norm))
        self.fsync_count += 1

    def read_file(self, path: str) -> bytes:
        parent, name = self._split(path)
        inode = self._dir(parent).get(name)
        if inode is None:
            raise FileNotFoundError(f"simulated file {path} does not exist")
        return bytes(inode.data)

    def crash(self, *, tear: bool = False, lose_dir_ops: bool = True) -> None:
        """Cut the power: see the module docstring."""
        self.generation += 1
        if lose_dir_ops:
            self._visible = {d: dict(entries) for d, entries in self._durable.items()}
        else:
            self._durable = {d: dict(entries) for d, entries in self._visible.items()}
        seen: set[int] = set()
        for entries in self._visible.values():
            for inode in entries.values():
                if id(inode) not in seen:
                    seen.add(id(inode))
                    self._lose_unsynced(inode, tear)

    def _lose_unsynced(self, inode: _Inode, tear: bool) -> None:
        pending = inode.pending
        inode.data = bytearray(inode.synced)
        inode.pending = []
        if not (tear and pending):
            return
        keep = self.rng.randrange(len(pending))
        for op in pending[:keep]:
            _apply(inode.data, op)
        last = pending[keep]
        if last[0] == "write":
            _, position, chunk = last
            _apply(inode.data, ("write", position, chunk[: self.rng.randrange(len(chunk) + 1)]))
        # What survived is on disk now; a second crash cannot take it back.
        inode.synced = bytes(inode.data)


def _apply(data: bytearray, op: tuple) -> None:
    if op[0] == "write":
        _, position, chunk = op
        if position > len(data):
            data += bytes(position - len(data))
        data[position : position + len(chunk)] = chunk
    else:
        size = op[1]
        if size < len(data):
            del data[size:]
        else:
            data += bytes(size - len(data))
