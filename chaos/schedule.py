"""The nemesis schedule: which fault, on which target, when, and for how long.

Pure: every draw comes from the `random.Random` the caller seeds, so one
seed gives one schedule. Faults follow each other with a quiet gap between
them (one fault at a time, so that each window on the plot has one cause
and each recovery is measured on its own).

A target is symbolic when it can only be resolved at the moment of the
fault (the nemesis does it then):

    broker:<id>, controller:<id>   that node
    active-controller              the quorum leader (KRaft) or the broker
                                   ZooKeeper elected (zk mode)
    leader:<partition>             the leader of that partition of the workload's topic

Partition faults (`kind == "partition"`) carry a `shape`:

    isolate-leader        two-way: the partition leader cannot reach the other
                          brokers nor they it (nor the controllers); the
                          clients still reach it (the Kafka 2013 case)
    isolate-controller    two-way: the active controller from every other node
    majority-minority     two-way: the nodes split in two, the quorum's
                          majority on one side (`groups` lists both sides)
    one-way-leader        one-way: the partition leader's packets to the
                          other nodes are dropped, theirs to it arrive

A `disk` fault fills one broker's disk (a broker, or a partition's leader).

An `eio` fault makes one broker's partition logs (a broker's, or a
partition leader's) fail their writes with EIO.

A `voters` fault takes a controller (the active one, or any) out of a
dynamic quorum's voter set; a `replace` fault wipes one's disk and swaps
the reformatted controller in for its old identity (`Nemesis`).

A `clock` fault moves one broker's wall clock (a broker, or a partition's
leader) by `offset_ms`, forward or back, until the heal sets it right
(itself a jump the other way).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

NEMESES = ("kill", "pause", "partition", "disk", "eio", "clock")
#: Nemeses that need a dynamic KRaft quorum (`raftka chaos run --dynamic-quorum`).
DYNAMIC_QUORUM_NEMESES = ("voters", "replace")
ALL_NEMESES = NEMESES + DYNAMIC_QUORUM_NEMESES
#: The clock nemesis' jumps: seconds to minutes either way (shorter than the
#: timestamp window a broker accepts, message.timestamp.after.max.ms, an hour).
CLOCK_OFFSETS_S = (5, 15, 30, 60, 300)
KILL_TARGETS = ("broker", "controller", "active-controller", "leader")
PARTITION_SHAPES = ("isolate-leader", "isolate-controller", "majority-minority", "one-way-leader")


@dataclasses.dataclass(frozen=True)
class Fault:
    index: int
    start: float      # seconds after the workload started
    duration: float   # until the heal (the restart, SIGCONT, the links restored)
    kind: str         # kill, pause, partition
    target: str = ""  # kill and pause (see the module docstring)
    shape: str = ""   # partition
    groups: tuple[tuple[int, ...], ...] = ()  # majority-minority: the two sides
    offset_ms: int = 0  # clock: the jump

    @property
    def end(self) -> float:
        return self.start + self.duration

    def describe(self) -> str:
        if self.kind == "partition":
            sides = " | ".join(",".join(map(str, g)) for g in self.groups)
            return f"partition {self.shape}" + (f" [{sides}]" if sides else "")
        if self.kind == "clock":
            return f"clock {self.target} {self.offset_ms / 1000:+g}s"
        return f"{self.kind} {self.target}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the schedule needs to know of the cluster."""

    mode: str                    # kraft or zk
    controllers: tuple[int, ...]  # KRaft voters' node ids (none in zk mode)
    brokers: tuple[int, ...]
    partitions: int


def make_schedule(rng: random.Random, nemeses: list[str] | tuple[str, ...], duration_s: float, shape: Shape, *,
                  quiet_s: tuple[float, float] = (3.0, 6.0), fault_s: tuple[float, float] = (4.0, 10.0),
                  tail_s: float = 2.0) -> list[Fault]:
    """Faults from `nemeses`, one at a time, over `duration_s` seconds; the
    last heals at least `tail_s` before the end."""
    unknown = set(nemeses) - set(ALL_NEMESES)
    if unknown:
        raise ValueError(f"unknown nemesis {sorted(unknown)}: choose from {', '.join(ALL_NEMESES)}")
    for kind in DYNAMIC_QUORUM_NEMESES:
        if kind in nemeses and not shape.controllers:
            raise ValueError(f"the {kind} nemesis changes a KRaft quorum's voters: it needs --mode kraft "
                             "--dynamic-quorum")
    faults: list[Fault] = []
    if not nemeses:
        return faults
    t = rng.uniform(*quiet_s)
    while True:
        length = rng.uniform(*fault_s)
        if t + length > duration_s - tail_s:
            # A short run still gets a fault: shrink the last one to what fits.
            length = duration_s - tail_s - t
            if length < min(2.0, fault_s[0]):
                break
        kind = nemeses[len(faults) % len(nemeses)] if len(faults) < len(nemeses) else rng.choice(list(nemeses))
        faults.append(_fault(rng, len(faults), round(t, 3), round(length, 3), kind, shape))
        t += length + rng.uniform(*quiet_s)
    return faults


def _fault(rng: random.Random, index: int, start: float, length: float, kind: str, shape: Shape) -> Fault:
    if kind in ("voters", "replace"):
        # KIP-853: a controller leaves the voter set (the active one: it resigns once that commits),
        # or loses its disk (the active one: the others elect a leader) and is swapped in again.
        target = "active-controller" if rng.random() < 0.5 else f"controller:{rng.choice(shape.controllers)}"
        return Fault(index, start, length, kind, target=target)
    if kind == "clock":
        target = f"broker:{rng.choice(shape.brokers)}" if rng.random() < 0.5 else \
            f"leader:{rng.randrange(shape.partitions)}"
        offset_ms = rng.choice(CLOCK_OFFSETS_S) * 1000 * rng.choice((1, -1))
        return Fault(index, start, length, kind, target=target, offset_ms=offset_ms)
    if kind in ("disk", "eio"):
        if rng.random() < 0.5:
            return Fault(index, start, length, kind, target=f"broker:{rng.choice(shape.brokers)}")
        return Fault(index, start, length, kind, target=f"leader:{rng.randrange(shape.partitions)}")
    if kind in ("kill", "pause"):
        choices = [c for c in KILL_TARGETS if c != "controller" or shape.controllers]
        what = rng.choice(choices)
        if what == "broker":
            target = f"broker:{rng.choice(shape.brokers)}"
        elif what == "controller":
            target = f"controller:{rng.choice(shape.controllers)}"
        elif what == "leader":
            target = f"leader:{rng.randrange(shape.partitions)}"
        else:
            target = "active-controller"
        return Fault(index, start, length, kind, target=target)
    nodes = len(shape.controllers) + len(shape.brokers)
    shapes = [s for s in PARTITION_SHAPES if s != "majority-minority" or nodes >= 3]
    chosen = rng.choice(shapes)
    if chosen in ("isolate-leader", "one-way-leader"):
        return Fault(index, start, length, kind, target=f"leader:{rng.randrange(shape.partitions)}", shape=chosen)
    if chosen == "isolate-controller":
        return Fault(index, start, length, kind, target="active-controller", shape=chosen)
    return Fault(index, start, length, kind, shape=chosen, groups=_split(rng, shape))


def _split(rng: random.Random, shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A minority of the voters (of the brokers in zk mode) and some brokers on one side."""
    voters = list(shape.controllers) or list(shape.brokers)
    rng.shuffle(voters)
    minority = set(voters[: max(1, (len(voters) - 1) // 2)])
    others = [b for b in shape.brokers if b not in minority]
    rng.shuffle(others)
    minority |= set(others[: rng.randrange(len(others))]) if len(others) > 1 else set()
    everyone = set(shape.controllers) | set(shape.brokers)
    return tuple(sorted(minority)), tuple(sorted(everyone - minority))
