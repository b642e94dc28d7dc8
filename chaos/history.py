"""The history: every operation the workload and the nemesis performed, one JSON line each.

An operation is a pair of events sharing `process` and `value`: an
`invoke` when the client starts it, then its completion:

- `ok`: it happened (a send's acknowledgement carries the offset);
- `fail`: it certainly did not happen (the client never handed it on);
- `info`: unknown (a timeout, a connection lost after sending): the record
  may or may not be in the log, and the checker allows either.

A send that has no completion at all (the run ended first) counts as `info`.
Polls and the final read are recorded as `ok` events alone, one per record
received. `f` names the operation:

    open          a client session starts; `extra` describes it
                  ({"role": "producer", "idempotent": true, "ordered": true})
    send          produce `value` to `partition`
    poll          a consumer received `value` at `partition`/`offset`
    final-read    the read-back after healing, one event per record
    final-range   the read-back covered [extra.low, extra.high) of `partition`
    error         a client error worth keeping (not an operation)
    stored        after the run, a record as a broker's replica holds it on disk
                  (extra: producer_id, producer_epoch, sequence, broker);
                  recorded for the values read at more than one offset
    replica-divergence  after the run, two replicas disagree (value says where)
    leader-epoch-regression  after the run, a replica's batch leader epochs go back
    <nemesis>     kill, pause, partition, ...: process "nemesis", type `info`,
                  extra.phase "start" or "stop", value describes the fault

`session` numbers a consumer's assignments (a group rebalance starts a new
one; positions may move back between sessions, never within one).
`wall` is time.time() and `mono` time.monotonic() of the recording process.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

TYPES = ("invoke", "ok", "fail", "info")


@dataclasses.dataclass(frozen=True)
class Event:
    process: str
    type: str
    f: str
    partition: int | None = None
    value: str | None = None
    offset: int | None = None
    key: str | None = None
    session: int = 0
    wall: float = 0.0
    mono: float = 0.0
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> str:
        data = {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != {}}
        return json.dumps(data, separators=(",", ":"), sort_keys=False)

    @classmethod
    def from_json(cls, line: str) -> Event:
        data = json.loads(line)
        if data.get("type") not in TYPES:
            raise ValueError(f"history line with type {data.get('type')!r}: {line.strip()[:200]}")
        return cls(**data)


def dumps(events: Iterable[Event]) -> str:
    return "".join(e.to_json() + "\n" for e in events)


def loads(text: str) -> list[Event]:
    return [Event.from_json(line) for line in text.splitlines() if line.strip()]


def read_history(path: str | Path) -> list[Event]:
    return loads(Path(path).read_text())


class HistoryWriter:
    """Appends events to a file from any thread, each line flushed as written,
    so a run that dies still leaves the history up to that moment."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: TextIO = open(self.path, "a", buffering=1)
        self.events: list[Event] = []
        #: (f, type) -> how many events were recorded: progress without a scan.
        self.counts: dict[tuple[str, str], int] = {}

    def record(self, process: str, type: str, f: str, **fields: Any) -> Event:
        event = Event(process, type, f, wall=time.time(), mono=time.monotonic(), **fields)
        with self._lock:
            self.events.append(event)
            self.counts[(f, type)] = self.counts.get((f, type), 0) + 1
            self._file.write(event.to_json() + "\n")
        return event

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __iter__(self) -> Iterator[Event]:
        return iter(self.snapshot())
