"""Replica placement for new partitions.

Theory of operation
-------------------
Kafka's assignment (`AdminUtils`, and the striped placer in KRaft) walks
the brokers round-robin from a random start, with a shift between the
leader and its followers, over a rack-alternating broker list. That
balances one topic, but the random start means many small topics do not
add up to a balanced cluster. raftka places load-aware instead, over the
same idea:

* **Ring.** The usable brokers stand in a ring: id order, taken with a
  stride coprime with their number. The stride changes each *round* (each
  time every broker has led one more partition), which plays the part of
  Kafka's replica shift: a broker's followers rotate through all the others.
* **Leader.** Each new partition's first (preferred-leader) replica goes
  to the usable broker that is preferred leader of the fewest partitions.
  Ties go to a broker that can also take a replica without breaking the
  replica balance, then to the fewest replicas, then to ring order.
* **Followers.** Each next replica goes, among the brokers not yet chosen,
  to one on a rack this partition does not use yet if there is one (racks
  first, as Kafka's rack-aware assignment), then to the fewest replicas,
  then to the broker closest after the leader on the ring.
* A broker without a rack counts as a rack of its own.

The counts start from the image's indexes (`preferred_leader_counts`,
`broker_replicas`) and move as partitions are placed, so placement is
deterministic and needs no randomness. With one replication factor and
equal-sized racks, preferred leaders and replicas per broker stay within
one of each other across any number of topics; mixed replication factors
keep leaders within one and replicas within a few. Unequal racks trade replica
balance for rack spreading, as Kafka does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class BrokerLoad:
    """A usable broker and how much it already carries."""

    broker_id: int
    rack: str | None
    replicas: int = 0
    preferred_leaders: int = 0


def place_partitions(brokers: Sequence[BrokerLoad], num_partitions: int, replication_factor: int) -> list[tuple[int, ...]]:
    """Replica lists (preferred leader first) for `num_partitions` new partitions.

    `brokers` are the usable brokers; their counts are updated in place.
    The caller checks `1 <= replication_factor <= len(brokers)`.
    """
    assert 1 <= replication_factor <= len(brokers), (replication_factor, len(brokers))
    by_id = sorted(brokers, key=lambda b: b.broker_id)
    n = len(by_id)
    strides = [s for s in range(1, n) if math.gcd(s, n) == 1] or [1]
    rack = {b.broker_id: (b.rack if b.rack is not None else f"\0broker-{b.broker_id}") for b in by_id}
    out: list[tuple[int, ...]] = []
    for _ in range(num_partitions):
        # The ring changes once every broker has led one more partition: a
        # stride coprime with n permutes the brokers, so each broker's
        # followers rotate through all the others from one round to the next.
        round_number = sum(b.preferred_leaders for b in by_id) // n
        stride = strides[round_number % len(strides)]
        ring = [by_id[(j * stride) % n] for j in range(n)]
        position = {b.broker_id: i for i, b in enumerate(ring)}
        # Brokers with at most this many replicas can take one without
        # pushing the replica spread past one.
        cutoff = sorted(b.replicas for b in by_id)[replication_factor - 1]
        leader = min(ring, key=lambda b: (b.preferred_leaders, b.replicas > cutoff, b.replicas, position[b.broker_id]))
        chosen = [leader]
        racks_used = {rack[leader.broker_id]}
        lead_pos = position[leader.broker_id]
        while len(chosen) < replication_factor:
            free = [b for b in ring if b not in chosen]
            fresh = [b for b in free if rack[b.broker_id] not in racks_used] or free
            pick = min(fresh, key=lambda b: (b.replicas, (position[b.broker_id] - lead_pos) % n))
            chosen.append(pick)
            racks_used.add(rack[pick.broker_id])
        leader.preferred_leaders += 1
        for b in chosen:
            b.replicas += 1
        out.append(tuple(b.broker_id for b in chosen))
    return out
