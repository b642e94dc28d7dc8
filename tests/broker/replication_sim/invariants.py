"""The safety properties, checked after every simulated event.

1. **Acknowledged records survive.** Every record the leader acknowledged
   (acks=all) or a consumer read is, at its offset, in the log of the
   partition's current leader -- checked when a broker takes over as leader
   (all of them) and at each new acknowledgement -- unless the failure
   model was exceeded since (below).
2. **The HW of a leader never goes back within its leader epoch.**
3. **ISR members agree with the leader up to its HW**: every member of the
   leader's ISR that is up and has not failed holds exactly the leader's
   records below the HW.
4. **Committed prefixes agree**: any two replicas hold the same records
   below the smaller of their HWs (except where a loss was allowed).
5. **Consumers see only records below the HW**, at consecutive offsets,
   never the same offset with two values (checked by the consumer and here).

The failure model. A replica has *failed* from the moment it crashes (it
loses what was not flushed) or the controller fences it, until it holds the
current leader's records up to its HW and epoch start again (it caught up
and rejoined). The guarantee is for records while at most
`min.insync.replicas - 1` replicas have failed at once; when more fail
(a *danger window*), records acknowledged before or during the window may
be lost and are no longer checked. With unclean leader election on, loss is
allowed at any time, so only 2, 5 and final convergence are checked.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from quorum.metadata import MetadataImage

if TYPE_CHECKING:
    from replication_sim.broker import SimBroker


class SafetyViolation(AssertionError):
    pass


@dataclasses.dataclass
class Committed:
    value: bytes
    danger_epoch: int
    how: str  # "acked" or "consumed"


class Invariants:
    def __init__(self, brokers: dict[int, SimBroker], partitions: int, min_insync_replicas: int,
                 unclean: bool) -> None:
        self.brokers = brokers
        self.partitions = range(partitions)
        self.min_insync_replicas = min_insync_replicas
        self.unclean = unclean
        self.image = MetadataImage()
        self.registrations: dict = {}
        self.committed: list[dict[int, Committed]] = [{} for _ in self.partitions]
        self.failed: dict[tuple[int, int], bool] = {}
        self.danger_epoch = [0 for _ in self.partitions]
        self.in_danger = [False for _ in self.partitions]
        #: Offsets below this may differ between committed prefixes (a danger window let them be lost).
        self.loss_horizon = [0 for _ in self.partitions]
        self.max_end = [0 for _ in self.partitions]
        self.leaders: list[tuple[int, int] | None] = [None for _ in self.partitions]
        self.hw_seen: dict[tuple[int, int], tuple[int, int]] = {}
        #: Set by the simulation when an event may have changed replica state;
        #: events that cannot (heartbeats, timeouts of answered requests) skip the checks.
        self.dirty = True
        self.was_usable: set[int] = set()
        self.leader_changes = 0
        self.unclean_elections = 0
        #: Follower truncations that removed records.
        self.truncations = 0
        self.checked_acks = 0
        self.exempt_acks = 0
        self.danger_windows = 0

    def fail(self, what: str) -> None:
        raise SafetyViolation(what)

    # --- events reported by the simulation ------------------------------------------------

    def on_controller_image(self, image: MetadataImage) -> None:
        self.image = image
        self.dirty = True
        topic = image.topic("t")
        registrations = {} if topic is None else dict(topic.partitions.items())
        for p, now in registrations.items():
            was = self.registrations.get(p)
            if was is not None and now.leader_epoch != was.leader_epoch and now.leader >= 0:
                self.leader_changes += 1
                if now.leader not in was.isr:
                    self.unclean_elections += 1
        self.registrations = registrations
        for b in self.brokers:
            reg = image.brokers.get(b)
            if reg is not None and reg.usable:
                self.was_usable.add(b)
            elif b in self.was_usable:
                # Fenced (or re-registered): out of the cluster until it catches up again.
                self.was_usable.discard(b)
                for p in self.partitions:
                    self.failed[(b, p)] = True
        self._update_danger()

    def on_crash(self, broker_id: int) -> None:
        for p in self.partitions:
            self.failed[(broker_id, p)] = True
        self._update_danger()

    def on_ack(self, broker: SimBroker, p: int, base_offset: int, values: list[bytes]) -> None:
        mirror = broker.mirrors[p]
        for i, value in enumerate(values):
            offset = base_offset + i
            if mirror.value_at(offset) != value:
                self.fail(f"broker {broker.broker_id} acknowledged {value!r} at {p}/{offset} but holds "
                          f"{mirror.value_at(offset)!r}")
            self._commit(p, offset, value, "acked")
        legit = self._legit_leader(p)
        if legit is not None and legit is not broker:
            self._check_holds(legit, p, range(base_offset, base_offset + len(values)))

    def on_consume(self, p: int, offset: int, value: bytes, high_watermark: int) -> None:
        if offset >= high_watermark:
            self.fail(f"a consumer got {p}/{offset}, at or above the HW {high_watermark}")
        self._commit(p, offset, value, "consumed")

    def on_truncate(self, broker: SimBroker, p: int, removed: int) -> None:
        self.truncations += removed > 0
        part = broker.partitions[p]
        if part.is_leader:
            self.fail(f"leader {broker.broker_id} truncated {p}")

    # --- after every event -------------------------------------------------------------------

    def check(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        for p in self.partitions:
            self._track_max_end(p)
            legit = self._legit_leader(p)
            key = None if legit is None else (legit.broker_id, legit.partitions[p].leader_epoch)
            if key is not None and key != self.leaders[p]:
                # A new leader took over: it must hold every committed record.
                self._check_holds(legit, p, self.committed[p])
            self.leaders[p] = key
            self._check_high_watermarks(p)
            if legit is not None:
                self._check_isr_agrees(legit, p)
                self._maybe_recover(legit, p)
            if not self.unclean:
                self._check_committed_prefixes(p)

    def _check_high_watermarks(self, p: int) -> None:
        for b, broker in self.brokers.items():
            part = broker.partitions.get(p) if broker.alive else None
            if part is None:
                continue
            log_end = broker.logs[p].log_end_offset
            mirror = broker.mirrors[p]
            hw = part.high_watermark
            if mirror.start + len(mirror.values) != log_end:
                self.fail(f"broker {b} {p}: mirror ends at {mirror.end}, log at {log_end}")
            if hw > log_end:
                self.fail(f"broker {b} {p}: HW {hw} above its LEO {log_end}")
            if part.leader is not None:
                epoch = part.leader_epoch
                seen = self.hw_seen.get((b, p))
                if seen is not None and seen[0] == epoch and hw < seen[1]:
                    self.fail(f"leader {b} {p}: HW went back from {seen[1]} to {hw} in leader epoch {epoch}")
                self.hw_seen[(b, p)] = (epoch, hw)

    def _check_isr_agrees(self, leader: SimBroker, p: int) -> None:
        state = leader.partitions[p].leader
        hw = state.high_watermark
        lm = leader.mirrors[p]
        for b in state.isr:
            member = self.brokers[b]
            if member is leader or not member.alive or self.failed.get((b, p)) or p not in member.partitions:
                continue
            mm = member.mirrors[p]
            if mm.end < hw or mm.prefix_hash(hw) != lm.prefix_hash(hw):
                where = mm.first_difference(lm, min(hw, mm.end))
                self.fail(f"ISR member {b} of {p} disagrees with leader {leader.broker_id} below the HW {hw}: "
                          f"its LEO {mm.end}, first difference at {where}")

    def _check_committed_prefixes(self, p: int) -> None:
        live = [b for b in self.brokers.values() if b.alive and p in b.partitions]
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                end = min(a.partitions[p].high_watermark, b.partitions[p].high_watermark)
                ma, mb = a.mirrors[p], b.mirrors[p]
                if ma.prefix_hash(end) == mb.prefix_hash(end):
                    continue
                where = ma.first_difference(mb, end)
                if where >= self.loss_horizon[p]:
                    self.fail(f"brokers {a.broker_id} and {b.broker_id} disagree on committed {p}/{where}: "
                              f"{ma.value_at(where)!r} vs {mb.value_at(where)!r} (HWs "
                              f"{a.partitions[p].high_watermark}, {b.partitions[p].high_watermark})")

    # --- the failure model --------------------------------------------------------------------

    def _update_danger(self) -> None:
        for p in self.partitions:
            failed = sum(1 for b in self.brokers if self.failed.get((b, p)))
            danger = failed >= self.min_insync_replicas
            if danger and not self.in_danger[p]:
                self.danger_epoch[p] += 1
                self.danger_windows += 1
            if danger:
                self.loss_horizon[p] = max(self.loss_horizon[p], self.max_end[p])
            self.in_danger[p] = danger

    def _track_max_end(self, p: int) -> None:
        for broker in self.brokers.values():
            mirror = broker.mirrors.get(p) if broker.alive else None
            if mirror is not None and mirror.end > self.max_end[p]:
                self.max_end[p] = mirror.end
        if self.in_danger[p]:
            self.loss_horizon[p] = max(self.loss_horizon[p], self.max_end[p])

    def _maybe_recover(self, leader: SimBroker, p: int) -> None:
        """A failed replica recovers once it is registered again, back in the
        ISR, and holds the leader's records up to its HW and epoch start."""
        if not any(self.failed.get((b, p)) for b in self.brokers):
            return
        state = leader.partitions[p].leader
        upto = min(max(state.high_watermark, state.epoch_start_offset), leader.mirrors[p].end)
        registration = self.image.partition(leader.partitions[p].topic_id, p)
        if registration is None:
            return
        changed = False
        for b, broker in self.brokers.items():
            if not self.failed.get((b, p)) or not broker.alive or p not in broker.mirrors:
                continue
            reg = self.image.brokers.get(b)
            if reg is None or not reg.usable or reg.epoch != broker.broker_epoch or b not in registration.isr:
                continue
            mirror = broker.mirrors[p]
            if mirror.end >= upto and mirror.prefix_hash(upto) == leader.mirrors[p].prefix_hash(upto):
                self.failed[(b, p)] = False
                changed = True
        if changed:
            self._update_danger()

    # --- helpers ------------------------------------------------------------------------------

    def _legit_leader(self, p: int) -> SimBroker | None:
        """The broker the controller names leader, once it acts as leader of that epoch."""
        registration = self.registrations.get(p)
        if registration is None or registration.leader < 0:
            return None
        broker = self.brokers[registration.leader]
        part = broker.partitions.get(p) if broker.alive else None
        if part is None or not part.is_leader or part.leader_epoch != registration.leader_epoch:
            return None
        return broker

    def _commit(self, p: int, offset: int, value: bytes, how: str) -> None:
        known = self.committed[p].get(offset)
        stamp = self.danger_epoch[p] if not self.in_danger[p] else -1
        if known is not None and known.value != value and not self._exempt(p, known):
            self.fail(f"{p}/{offset} was {how} as {value!r} but was {known.how} as {known.value!r}")
        if known is None or known.value != value or self._exempt(p, known):
            self.committed[p][offset] = Committed(value, stamp, how)

    def _exempt(self, p: int, c: Committed) -> bool:
        return self.unclean or c.danger_epoch != self.danger_epoch[p]

    def _check_holds(self, broker: SimBroker, p: int, offsets) -> None:
        mirror = broker.mirrors[p]
        for offset in offsets:
            c = self.committed[p].get(offset)
            if c is None:
                continue
            if self._exempt(p, c):
                self.exempt_acks += 1
                continue
            self.checked_acks += 1
            if mirror.value_at(offset) != c.value:
                self.fail(f"{c.how} record {c.value!r} at {p}/{offset} is lost: leader {broker.broker_id} "
                          f"(epoch {broker.partitions[p].leader_epoch}) holds {mirror.value_at(offset)!r}")
