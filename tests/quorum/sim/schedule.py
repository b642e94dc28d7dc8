"""Hypothesis strategies for simulation scenarios.

A scenario is drawn as data (seed, cluster shape, network conditions, a
list of timed faults), so when an invariant breaks, hypothesis shrinks it to
a short schedule and prints it, seed included, for replay with
`run_scenario`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sim.cluster import FAULT_KINDS, MEMBERSHIP_KINDS, WIPE_KINDS, Fault, Scenario
from sim.network import NetworkConditions

FAULT_WINDOW_MS = 3000


@st.composite
def faults(draw: st.DrawFn, kinds: tuple[str, ...] = FAULT_KINDS) -> Fault:
    kind = draw(st.sampled_from(kinds))
    return Fault(
        at_ms=draw(st.integers(0, FAULT_WINDOW_MS)),
        kind=kind,
        node=draw(st.integers(0, 6)),
        duration_ms=draw(st.integers(20, 1500)),
        arg=draw(st.integers(1, 126)) if kind == "split" else draw(st.integers(5, 60)),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    max_delay = draw(st.sampled_from([2, 10, 40]))
    return Scenario(
        seed=draw(st.integers(0, 2**32 - 1)),
        voters=draw(st.sampled_from([3, 5])),
        observers=draw(st.integers(1, 2)),
        conditions=NetworkConditions(
            min_delay_ms=1,
            max_delay_ms=max_delay,
            drop_rate=draw(st.sampled_from([0.0, 0.0, 0.02, 0.1])),
            duplicate_rate=draw(st.sampled_from([0.0, 0.05])),
        ),
        faults=tuple(draw(st.lists(faults(), max_size=12))),
        snapshot_every_bytes=draw(st.sampled_from([10**9, 300, 2000])),
        disk=draw(st.sampled_from(["memory", "memory", "memory", "storage"])),
    )


@st.composite
def reconfiguring_scenarios(draw: st.DrawFn) -> Scenario:
    """Scenarios whose faults include voter additions and removals (about
    one event in three), over 1 to 5 voters and 1-3 observers that may be
    made voters."""
    max_delay = draw(st.sampled_from([2, 10, 40]))
    kinds = FAULT_KINDS + MEMBERSHIP_KINDS * 4
    return Scenario(
        seed=draw(st.integers(0, 2**32 - 1)),
        voters=draw(st.sampled_from([1, 3, 5])),
        observers=draw(st.integers(1, 3)),
        conditions=NetworkConditions(
            min_delay_ms=1,
            max_delay_ms=max_delay,
            drop_rate=draw(st.sampled_from([0.0, 0.0, 0.02, 0.1])),
            duplicate_rate=draw(st.sampled_from([0.0, 0.05])),
        ),
        faults=tuple(draw(st.lists(faults(kinds), max_size=16))),
        snapshot_every_bytes=draw(st.sampled_from([10**9, 300, 2000])),
    )


@st.composite
def wiping_scenarios(draw: st.DrawFn) -> Scenario:
    """Scenarios where disks are lost (about one event in four): a wiped
    node comes back with a new directory id and the operator replaces its
    old identity, among crashes, partitions, lost messages and voter changes,
    over 3 or 5 voters and 1-2 observers, either log kind."""
    max_delay = draw(st.sampled_from([2, 10, 40]))
    kinds = FAULT_KINDS + MEMBERSHIP_KINDS + WIPE_KINDS * 3
    return Scenario(
        seed=draw(st.integers(0, 2**32 - 1)),
        voters=draw(st.sampled_from([3, 5])),
        observers=draw(st.integers(1, 2)),
        conditions=NetworkConditions(
            min_delay_ms=1,
            max_delay_ms=max_delay,
            drop_rate=draw(st.sampled_from([0.0, 0.0, 0.02, 0.1])),
            duplicate_rate=draw(st.sampled_from([0.0, 0.05])),
        ),
        faults=tuple(draw(st.lists(faults(kinds), min_size=1, max_size=12))),
        snapshot_every_bytes=draw(st.sampled_from([10**9, 300, 2000])),
        disk=draw(st.sampled_from(["memory", "memory", "storage"])),
    )
