"""SimCluster: voters and observers, a network, a clock, a fault schedule.

`run_scenario(scenario)` runs the fault phase (faults fire at their times,
a client proposes records to whoever is leader, and the leader is asked to
add or remove one voter at the times of `MEMBERSHIP_KINDS` faults; a `wipe`
loses a node's disk and the operator replaces it), then heals everything
(partitions end, crashed nodes restart, the network stops losing messages)
and demands liveness: within `LIVENESS_BOUND_MS` of simulated time a record
proposed after the heal must be committed and every node must have learned
it. The invariants are checked after every single event throughout.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import uuid
from collections.abc import Callable

from quorum.raft import NotLeaderError, QuorumConfig, RaftUsageError
from quorum.raft.voters import VoterInfo

from sim.invariants import Invariants, SafetyViolation
from sim.network import NetworkConditions, SimNetwork
from sim.node import SimNode, directory_id_of

SIM_CONFIG = QuorumConfig(
    controller_quorum_election_timeout_ms=150,
    controller_quorum_fetch_timeout_ms=300,
    controller_quorum_election_backoff_max_ms=150,
    controller_quorum_request_timeout_ms=100,
    controller_quorum_retry_backoff_ms=10,
    fetch_max_wait_ms=40,
    fetch_max_bytes=600,
    fetch_snapshot_max_bytes=500,
)
LIVENESS_BOUND_MS = 5000
FAULT_KINDS = ("crash", "isolate", "split", "crash_mid_event", "resign", "lossy", "pause")
#: Voter-set changes the leader is asked to make, drawn among the faults.
MEMBERSHIP_KINDS = ("add_voter", "remove_voter")
#: A node's disk is lost; it comes back formatted again, with a new directory
#: id, and the operator replaces its old identity (remove, then add).
WIPE_KINDS = ("wipe",)
#: How often the operator retries a step of replacing a wiped voter.
REPLACE_RETRY_MS = 50


@dataclasses.dataclass(frozen=True)
class Fault:
    at_ms: int
    kind: str
    node: int  # index into all nodes, taken modulo their number
    duration_ms: int
    arg: int  # split: bitmask choosing one side; lossy: drop percentage


@dataclasses.dataclass(frozen=True)
class Scenario:
    seed: int
    voters: int
    observers: int
    conditions: NetworkConditions
    faults: tuple[Fault, ...]
    snapshot_every_bytes: int
    propose_every_ms: int = 25
    disk: str = "memory"  # or "storage": StorageReplicatedLog on the storage engine's sim disk


@dataclasses.dataclass
class Result:
    heal_ms: int
    live_at_ms: int
    proposals: int
    committed: int
    leaders: dict[int, int]
    messages_sent: int
    checks: int
    wipes: int = 0
    replacements: int = 0


class SimCluster:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.now_ms = 0
        self.voters = frozenset(range(1, scenario.voters + 1))
        self.initial_directory_ids: dict[int, uuid.UUID | None] = {i: directory_id_of(i, 0) for i in self.voters}
        # Every voter identity (node id, directory id) any voter-set record ever named.
        self.ever_voters: set[tuple[int, uuid.UUID | None]] = set(self.initial_directory_ids.items())
        self.voter_changes: list[tuple[int, frozenset[int]]] = []  # (at ms, new set) the leader accepted
        # The wiped node the operator is replacing (at most one at a time), and
        # whether it was a voter (then it is added back under its new directory id).
        self.replacing: tuple[SimNode, bool] | None = None
        self.wipes = 0
        self.replacements = 0
        ids = list(range(1, scenario.voters + 1)) + [100 + i for i in range(scenario.observers)]
        config = dataclasses.replace(
            SIM_CONFIG, metadata_log_max_record_bytes_between_snapshots=scenario.snapshot_every_bytes
        )
        self.network = SimNetwork(random.Random(f"{scenario.seed}/net"), dataclasses.replace(scenario.conditions))
        self.invariants = Invariants()
        self.nodes = {i: SimNode(self, i, config, scenario.seed, scenario.disk) for i in ids}
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._timer_seq = 0
        self._partitions: dict[int, list[set[int]]] = {}
        self._proposal_seq = 0
        self.proposals: list[tuple[int, int, bytes]] = []  # (proposed at, offset, record)
        self.heal_ms: int | None = None

    # --- timers ---------------------------------------------------------------

    def at(self, when_ms: int, action: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when_ms, self._timer_seq, action))

    # --- faults -------------------------------------------------------------------

    def _node_at(self, index: int) -> SimNode:
        ids = sorted(self.nodes)
        return self.nodes[ids[index % len(ids)]]

    def _apply_partitions(self) -> None:
        self.network.heal()
        for groups in self._partitions.values():
            self.network.partition(groups)

    def schedule_fault(self, n: int, fault: Fault) -> None:
        node = self._node_at(fault.node)
        end = fault.at_ms + fault.duration_ms
        if fault.kind == "crash":

            def crash() -> None:
                if node.is_up:
                    node.crash(self.rng)
                    self.at(end, lambda: node.is_up or node.start(self.now_ms))

            self.at(fault.at_ms, crash)
        elif fault.kind in ("isolate", "split"):
            if fault.kind == "isolate":
                groups = [{node.node_id}, set(self.nodes) - {node.node_id}]
            else:
                ids = sorted(self.nodes)
                side = {i for k, i in enumerate(ids) if fault.arg >> k & 1}
                groups = [side, set(ids) - side]

            def cut() -> None:
                self._partitions[n] = groups
                self._apply_partitions()

            def mend() -> None:
                self._partitions.pop(n, None)
                self._apply_partitions()

            self.at(fault.at_ms, cut)
            self.at(end, mend)
        elif fault.kind == "crash_mid_event":

            def arm() -> None:
                if node.is_up:
                    node.crash_mid_next_event = True
                    self.at(end, lambda: node.is_up or node.start(self.now_ms))

            self.at(fault.at_ms, arm)
        elif fault.kind == "resign":

            def resign() -> None:
                for leader in [x for x in self.nodes.values() if x.is_leader() and x.paused_until_ms <= self.now_ms]:
                    assert leader.core is not None
                    leader.obey(leader.core.resign(self.now_ms), self.now_ms)

            self.at(fault.at_ms, resign)
        elif fault.kind == "pause":

            def pause() -> None:
                node.paused_until_ms = max(node.paused_until_ms, end)

            self.at(fault.at_ms, pause)
        elif fault.kind == "lossy":
            base = self.scenario.conditions.drop_rate

            def lossy() -> None:
                self.network.conditions.drop_rate = fault.arg / 100

            def calm() -> None:
                self.network.conditions.drop_rate = base

            self.at(fault.at_ms, lossy)
            self.at(end, calm)
        elif fault.kind in MEMBERSHIP_KINDS:
            self.at(fault.at_ms, lambda: self.change_voters(fault))
        elif fault.kind == "wipe":
            self.at(fault.at_ms, lambda: self.wipe(node, end))
        else:
            raise ValueError(fault.kind)

    # --- wiped disks ------------------------------------------------------------------

    def wipe(self, node: SimNode, back_at_ms: int) -> None:
        """Lose `node`'s disk, if the quorum can survive it: no other
        replacement is under way, and every voter set any log holds that
        names it has three voters or more (losing one of two voters, or the
        only one, loses the quorum for good, in Kafka too). It comes back at
        `back_at_ms` formatted again, and the operator replaces it."""
        if self.replacing is not None:
            return
        sets = [v for n in self.nodes.values() for _, v in n.log.voter_sets()]
        if any(not n.log.voter_sets() for n in self.nodes.values()):
            sets.append(self.voters)
        naming = [v for v in sets if node.node_id in v]
        if any(len(v) < 3 for v in naming):
            return
        voters, directory_ids = self.discover_voters()
        if node.is_up:
            node.crash(self.rng)
        node.wipe(voters, directory_ids)
        self.wipes += 1
        self.replacing = (node, bool(naming))
        self.at(back_at_ms, lambda: node.is_up or node.start(self.now_ms))
        self.at(self.now_ms + REPLACE_RETRY_MS, self.replace_step)

    def discover_voters(self) -> tuple[frozenset[int], dict[int, uuid.UUID | None]]:
        """The voters and directory ids a node formatted again learns from the
        quorum (DescribeQuorum): a leader's, else the longest log's."""
        up = [n for n in self.nodes.values() if n.core is not None]
        leaders = [n for n in up if n.is_leader()]
        source = (leaders or sorted(up, key=lambda n: -n.log.log_end_offset) or [None])[0]
        if source is None or source.core is None:
            return self.voters, dict(self.initial_directory_ids)
        voters = source.core.voters
        return voters, {v: source.core.recorded_directory_id(v) for v in voters}

    def replace_step(self) -> None:
        """The operator's procedure for a wiped controller (KIP-853): remove
        its old identity, then, once it runs on its new disk, add it back
        with its new directory id; each step once the previous is committed."""
        assert self.replacing is not None
        node, was_voter = self.replacing
        leaders = [n for n in self.nodes.values() if n.is_leader() and n.paused_until_ms <= self.now_ms]
        if leaders:
            leader = leaders[0]
            assert leader.core is not None
            current = leader.core.voters
            node_id = node.node_id
            new = None
            if node_id in current and leader.core.recorded_directory_id(node_id) != node.directory_id:
                new = current - {node_id}
            elif node_id not in current and was_voter and node.is_up:
                leader.log.remember_voter(VoterInfo(node_id, node.directory_id))
                new = current | {node_id}
            elif not leader.core.voter_change_pending:
                self.replacing = None
                self.replacements += 1
                return
            if new is not None:
                self.apply_voter_change(leader, new)  # refused while a change is pending: retried
        self.at(self.now_ms + REPLACE_RETRY_MS, self.replace_step)

    def apply_voter_change(self, leader: SimNode, new: frozenset[int]) -> bool:
        assert leader.core is not None
        try:
            _, out = leader.core.change_voters(new, self.now_ms)
        except RaftUsageError:
            return False  # a change is in flight, or the leader has not committed in its epoch yet
        self.note_voters(leader)
        self.voter_changes.append((self.now_ms, new))
        leader.obey(out, self.now_ms)
        self.invariants.after_event(leader)
        return True

    def was_voter(self, node_id: int, directory_id: uuid.UUID | None) -> bool:
        """Whether a voter set ever named this identity (a voter recorded
        without a directory id is that id on any disk)."""
        return (node_id, directory_id) in self.ever_voters or (node_id, None) in self.ever_voters

    def note_voters(self, leader: SimNode) -> None:
        """Record the identities of the voter set `leader` just appended."""
        infos = leader.log.latest_voters()
        assert infos is not None
        self.ever_voters |= {(v.node_id, v.directory_id) for v in infos}

    def change_voters(self, fault: Fault) -> None:
        """Ask the leader to add or remove one voter (AddRaftVoter /
        RemoveRaftVoter); it refuses while the previous change is uncommitted."""
        leaders = [n for n in self.nodes.values() if n.is_leader() and n.paused_until_ms <= self.now_ms]
        if not leaders or self.replacing is not None:
            return  # (the operator changes nothing else while it replaces a wiped voter)
        leader = leaders[0]
        assert leader.core is not None
        current = leader.core.voters
        ids = sorted(self.nodes)
        if fault.kind == "add_voter":
            candidates = [i for i in ids if i not in current]
        else:
            candidates = sorted(current) if len(current) > 1 else []
        if not candidates:
            return
        target = candidates[fault.arg % len(candidates)]
        if target not in current:
            # AddRaftVoter names the new voter's directory id
            leader.log.remember_voter(VoterInfo(target, self.nodes[target].directory_id))
        self.apply_voter_change(leader, current ^ {target})

    def heal(self) -> None:
        self.heal_ms = self.now_ms
        self._partitions.clear()
        self._apply_partitions()
        self.network.conditions.drop_rate = 0.0
        self.network.conditions.duplicate_rate = 0.0
        for node in self.nodes.values():
            node.crash_mid_next_event = False
            node.paused_until_ms = min(node.paused_until_ms, self.now_ms)
            if not node.is_up:
                node.start(self.now_ms)

    # --- the client ---------------------------------------------------------------

    def propose(self) -> None:
        leaders = [n for n in self.nodes.values() if n.is_leader() and n.paused_until_ms <= self.now_ms]
        if leaders:
            leader = self.rng.choice(leaders)
            assert leader.core is not None
            self._proposal_seq += 1
            record = b"v%d" % self._proposal_seq
            try:
                result, out = leader.core.propose([record], self.now_ms)
            except NotLeaderError:
                raise AssertionError("is_leader() and propose() disagree") from None
            self.proposals.append((self.now_ms, result.base_offset, record))
            leader.obey(out, self.now_ms)
            self.invariants.after_event(leader)
        self.at(self.now_ms + self.scenario.propose_every_ms, self.propose)

    def live(self) -> bool:
        """A record proposed after the heal is committed, and every node knows it."""
        assert self.heal_ms is not None
        committed = self.invariants.committed
        low = min(n.max_high_watermark for n in self.nodes.values())
        for proposed_ms, offset, record in reversed(self.proposals):
            if proposed_ms < self.heal_ms:
                break
            value = committed.get(offset)
            if value is not None and value[2] == record and low > offset:
                return True
        return False

    # --- the event loop --------------------------------------------------------------

    def run_until(self, end_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        nodes = list(self.nodes.values())
        while True:
            next_times = [end_ms + 1]
            if self._timers:
                next_times.append(self._timers[0][0])
            delivery = self.network.next_delivery_ms()
            if delivery is not None:
                next_times.append(delivery)
            next_times += [max(n.wake_at_ms, n.paused_until_ms) for n in nodes if n.is_up]
            t = min(next_times)
            if t > end_ms:
                self.now_ms = end_ms
                return False
            self.now_ms = max(self.now_ms, t)
            now = self.now_ms
            if self._timers and self._timers[0][0] <= now:
                _, _, action = heapq.heappop(self._timers)
                action()
                for n in nodes:
                    self.invariants.after_event(n)
            elif delivery is not None and delivery <= now:
                flight = self.network.pop_due(now)
                if flight is not None:
                    node = self.nodes[flight.destination_id]
                    if node.paused_until_ms > now:
                        self.network.hold(flight, node.paused_until_ms)
                    else:
                        node.receive(flight, now)
                        self.invariants.after_event(node)
            else:
                for n in nodes:
                    if n.is_up and n.wake_at_ms <= now and n.paused_until_ms <= now:
                        n.tick(now)
                        self.invariants.after_event(n)
            if stop is not None and stop():
                return True


def run_scenario(scenario: Scenario) -> Result:
    cluster = SimCluster(scenario)
    try:
        for node in cluster.nodes.values():
            cluster.at(0, lambda node=node: node.start(cluster.now_ms))
        for n, fault in enumerate(scenario.faults):
            cluster.schedule_fault(n, fault)
        cluster.at(1, cluster.propose)
        fault_end = max([f.at_ms + f.duration_ms for f in scenario.faults] + [500])
        cluster.run_until(fault_end)
        cluster.heal()
        deadline = cluster.now_ms + LIVENESS_BOUND_MS
        if not cluster.run_until(deadline, stop=cluster.live):
            status = {
                i: (n.core.role, n.core.epoch, n.core.high_watermark, n.log.log_end_offset) if n.core else "down"
                for i, n in cluster.nodes.items()
            }
            raise AssertionError(
                f"not live: no record proposed after the heal at {cluster.heal_ms} ms was committed on every node "
                f"within {LIVENESS_BOUND_MS} ms; nodes (role, epoch, HW, log end): {status}"
            )
    except AssertionError as e:
        kind = "SAFETY VIOLATION" if isinstance(e, SafetyViolation) else "failure"
        raise AssertionError(
            f"{kind} at t={cluster.now_ms} ms, replay with seed={scenario.seed}: {e}\nscenario={scenario!r}"
        ) from e
    assert cluster.heal_ms is not None
    return Result(
        heal_ms=cluster.heal_ms,
        live_at_ms=cluster.now_ms,
        proposals=len(cluster.proposals),
        committed=len(cluster.invariants.committed),
        leaders=dict(cluster.invariants.leaders),
        messages_sent=cluster.network.sent,
        checks=cluster.invariants.checks,
        wipes=cluster.wipes,
        replacements=cluster.replacements,
    )
