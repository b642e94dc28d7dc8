"""Hypothesis strategies for replication scenarios.

A scenario is data (seed, partitions, min.insync.replicas, network
conditions, flush policy, timed faults), so when an invariant breaks,
hypothesis shrinks it to a short schedule and prints it, seed included,
for replay with `run_scenario`.
"""

from __future__ import annotations

from hypothesis import strategies as st

from replication_sim.cluster import FAULT_KINDS, FAULT_WINDOW_MS, Fault, Scenario
from replication_sim.network import NetworkConditions


@st.composite
def faults(draw: st.DrawFn) -> Fault:
    kind = draw(st.sampled_from(FAULT_KINDS))
    return Fault(
        at_ms=draw(st.integers(0, FAULT_WINDOW_MS - 50)),
        kind=kind,
        broker=draw(st.integers(0, 2)),
        duration_ms=draw(st.integers(20, 800)),
        arg=draw(st.integers(5, 50)) if kind == "lossy" else draw(st.integers(0, 1)),
    )


@st.composite
def scenarios(draw: st.DrawFn, unclean: bool = False) -> Scenario:
    return Scenario(
        seed=draw(st.integers(0, 2**32 - 1)),
        partitions=draw(st.sampled_from([1, 2])),
        min_insync_replicas=draw(st.sampled_from([2, 2, 2, 3])),
        unclean=unclean,
        conditions=NetworkConditions(
            min_delay_ms=1,
            max_delay_ms=draw(st.sampled_from([2, 5, 20])),
            drop_rate=draw(st.sampled_from([0.0, 0.0, 0.01, 0.05])),
        ),
        faults=tuple(draw(st.lists(faults(), max_size=6))),
        flush_interval_ms=draw(st.sampled_from([0, 0, 100, 400])),
    )
