"""The `clock` fault: a broker's wall clock jumps by the fault's offset
(forward or back) through the test-only `raftka.test.clock.offset.file`
every broker of the run is started with (common.clock); the heal writes 0.
It needs nothing but that setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.nemesis.errors import NemesisError
from chaos.schedule import Fault

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis

#: In each broker's log dir: its wall clock's offset in ms (`raftka.test.clock.offset.file`).
CLOCK_FILE = "chaos-clock-offset-ms"


class Clocks:
    """Each broker's clock offset, written where the broker reads it (common.clock)."""

    def __init__(self, dirs: dict[int, Path]) -> None:
        self.dirs = dict(dirs)
        self.skewed: dict[int, int] = {}

    def set(self, node_id: int, offset_ms: int) -> None:
        path = self.dirs[node_id] / CLOCK_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(f"{offset_ms}\n")
        tmp.replace(path)  # the broker never reads half a number
        if offset_ms:
            self.skewed[node_id] = offset_ms
        else:
            self.skewed.pop(node_id, None)

    def heal(self) -> list[int]:
        """Every moved clock set back; the brokers whose clocks those were."""
        healed = sorted(self.skewed)
        for node_id in healed:
            self.set(node_id, 0)
        return healed


def start(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    clocks = nemesis.clocks
    if clocks is None:
        raise NemesisError("clock needs the brokers started with raftka.test.clock.offset.file (Clocks)")
    # Only the brokers read the offset: a controller target gives way to a broker.
    node = nemesis.resolve_among(fault.target, sorted(clocks.dirs))
    clocks.set(node, fault.offset_ms)
    return {"nodes": [node], "offset_ms": fault.offset_ms}


def heal(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    if nemesis.clocks is None:
        return {}
    return {"nodes": nemesis.clocks.heal()}
