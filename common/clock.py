"""The wall clock a node reads, with an offset that tests (`raftka chaos`, the `clock` nemesis) can set.

`raftka.test.clock.offset.file=PATH` (for tests only; a relative PATH is
under the node's first log dir) makes the node's wall clock the system's
plus the whole number of milliseconds written in PATH (negative goes back;
no file, or an empty one, is no offset). The file is read again at most
every 100 ms, so a test moves a running node's clock by rewriting it.

The offset moves what a node takes from the wall clock: record timestamps,
the ISR's lag times, transaction and group timeouts, retention. Elections
and heartbeats run on the monotonic clock, as the system's own are not
skewed by a wall clock that jumps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

OFFSET_FILE_KEY = "raftka.test.clock.offset.file"
_REREAD_S = 0.1
log = logging.getLogger("common.clock")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class OffsetWallClock:
    """The wall clock plus the offset in `path`, in milliseconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_ms = 0
        self._next_read = 0.0
        self._complained = ""

    def read_offset_ms(self) -> int:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            self._complain(f"cannot read {self.path} ({exc}); the clock offset stays {self.offset_ms} ms")
            return self.offset_ms
        if not text:
            return 0
        try:
            return int(text)
        except ValueError:
            self._complain(f"{self.path} holds {text[:40]!r}, not a whole number of milliseconds; "
                           f"the clock offset stays {self.offset_ms} ms")
            return self.offset_ms

    def _complain(self, message: str) -> None:
        if message != self._complained:  # once per distinct problem, not every 100 ms
            self._complained = message
            log.warning("%s: %s", OFFSET_FILE_KEY, message)

    def __call__(self) -> int:
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + _REREAD_S
            offset = self.read_offset_ms()
            if offset != self.offset_ms:
                log.warning("wall clock offset %+d ms (from %s)", offset, self.path)
                self.offset_ms = offset
        return time.time_ns() // 1_000_000 + self.offset_ms


def node_wall_clock(props: Mapping[str, str], log_dir: str | Path) -> Callable[[], int]:
    """The wall clock of a node with these properties: the plain one, unless a test set an offset file."""
    path = props.get(OFFSET_FILE_KEY, "").strip()
    if not path:
        return wall_clock_ms
    return OffsetWallClock(Path(log_dir) / path)  # an absolute path stays itself
