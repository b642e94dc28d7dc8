"""Process faults.

- `kill`: SIGKILL, then a restart on the same data dir at the heal.
- `pause`: SIGSTOP, then SIGCONT at the heal (the process wakes up with
  the state it had: a paused leader must not act on it).

They need nothing but the processes.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from chaos.schedule import Fault

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis


def start(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    node = nemesis.resolve(fault.target)
    if fault.kind == "kill":
        nemesis.cluster.kill(node, signal.SIGKILL)
        nemesis.killed.add(node)
    else:
        nemesis.cluster.kill(node, signal.SIGSTOP)
        nemesis.paused.add(node)
    return {"nodes": [node]}


def heal_kill(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    restart_killed(nemesis)
    return {}


def heal_pause(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    resume_paused(nemesis)
    return {}


def restart_killed(nemesis: Nemesis) -> None:
    for node in sorted(nemesis.killed):
        if not nemesis.cluster.nodes[node].is_running():
            nemesis.cluster.start(node)
    nemesis.killed.clear()


def resume_paused(nemesis: Nemesis) -> None:
    for node in sorted(nemesis.paused):
        nemesis.cluster.kill(node, signal.SIGCONT)
    nemesis.paused.clear()
