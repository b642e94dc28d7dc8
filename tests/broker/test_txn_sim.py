"""A seeded simulation of the transaction coordinator's pure core, with
coordinator failover and lost markers.

The simulated shell does what `broker.shell.txn_runtime` does: it appends
each step's records to a log whose committed prefix grows at random
moments, holds each step's answer and markers until the log is committed
past them, sends markers that may be lost (and are then sent again), and
calls `markers_written` once every partition of a job has its marker. A
failover drops the uncommitted tail (a new leader truncates it) or keeps
it (the new leader had it), and a new shard at the next coordinator epoch
replays the log and resends the markers of what it finds preparing.

Producers (one client per transactional id, sometimes replaced by a new
instance, which fences the old one) init, add partitions, and commit or
abort, retrying CONCURRENT_TRANSACTIONS as clients do.

Checked after every event, and at the end once faults stop:
- no transaction gets both COMMIT and ABORT markers (a transaction is one
  Prepare record's (transactional id, producer id, epoch, instance));
- no answer and no marker goes out before the record it depends on is
  committed (the Prepare record of a marker; the record of an EndTxn NONE);
- every committed Prepare record is eventually marked on every partition
  and completed, and a client told "committed" sees COMMIT markers.
A failure names its seed: replay it with `SEEDS = [seed]`. A second test
lets hypothesis draw the schedule, so that a failure shrinks.

With `v2` the clients speak transactions v2 (KIP-890 part 2): partitions
added as a partition leader adds them for Produce v12, EndTxn v5 bumping
the epoch; a zombie of each finished transaction keeps trying to add a
partition at its old epoch, which must never succeed.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.core.txn import (
    MarkerJob,
    Step,
    TransactionCoordinatorConfig,
    TransactionCoordinatorShard,
    TxnState,
)
from broker.core.txn.records import decode_key, decode_value

CONFIG = TransactionCoordinatorConfig(transaction_max_timeout_ms=60_000,
                                      transaction_abort_timed_out_transaction_cleanup_interval_ms=500,
                                      transaction_remove_expired_transaction_cleanup_interval_ms=10**9)
PARTITIONS = [(t, p) for t in ("x", "y") for p in range(3)]
#: 40 seeds by default (a few seconds); RAFTKA_SOAK=1 runs 2000.
SEEDS = range(int(os.environ.get("RAFTKA_TXN_SIM_SEEDS", "2000" if os.environ.get("RAFTKA_SOAK") == "1" else "40")))


@dataclass
class Held:
    barrier: int
    coordinator_epoch: int
    response: object = None
    markers: tuple[MarkerJob, ...] = ()
    client: Client | None = None
    call: str = ""


@dataclass
class Client:
    tid: str
    pid: int = -1
    epoch: int = -1
    phase: str = "init"  # init -> add -> end -> (add ...) ; "fenced" ends it
    waiting: bool = False
    commit: bool = True
    partitions: frozenset = frozenset()
    #: (producer id, epoch, instance) of each transaction EndTxn answered NONE for.
    told_committed: list[tuple[int, int, int]] = field(default_factory=list)
    told_aborted: list[tuple[int, int, int]] = field(default_factory=list)
    #: Epochs of transactions this client ended (transactions v2: stale now).
    ended_epochs: list[int] = field(default_factory=list)


class Sim:
    def __init__(self, seed: int | None, rng: random.Random | None = None, v2: bool = False) -> None:
        self.v2 = v2
        self.rng = rng if rng is not None else random.Random(seed)
        self.seed = seed
        self.now = 0
        self.log: list[tuple[bytes, bytes | None]] = []
        self.committed = 0
        self.epoch = 0
        self.next_pid = 1000
        self.shard = self._new_shard()
        self.held: list[Held] = []
        #: marker jobs being delivered: job -> (partitions still without a marker, instance)
        self.in_flight: dict[MarkerJob, tuple[set, int]] = {}
        #: (tid, pid, epoch, instance) -> set of results marked
        self.marked: dict[tuple, set[bool]] = {}
        self.clients = {f"t{i}": Client(f"t{i}") for i in range(4)}

    def _new_shard(self) -> TransactionCoordinatorShard:
        shard = TransactionCoordinatorShard(0, self.epoch, CONFIG)
        # After a failover the whole log is committed (the tail was dropped or kept).
        for key, value in self.log:
            shard.replay(key, value)
        return shard

    # --- the simulated shell -------------------------------------------------------

    def absorb(self, step: Step, client: Client | None = None, call: str = "") -> None:
        for r in step.records:
            self.log.append((r.key, r.value))
        self.held.append(Held(len(self.log), self.epoch, step.response, step.markers, client, call))

    def committed_records(self):
        for key, value in self.log[:self.committed]:
            yield decode_key(key), decode_value(value)

    def prepare_logged(self, job: MarkerJob) -> bool:
        want = TxnState.PREPARE_COMMIT if job.commit else TxnState.PREPARE_ABORT
        return any(tid == job.transactional_id and v is not None and v.state is want
                   and v.producer_id == job.producer_id and v.producer_epoch == job.producer_epoch
                   for tid, v in self.committed_records())

    def instance_of(self, job: MarkerJob) -> int:
        """Which transaction of the id a job ends: the number of committed
        Prepare records of it so far (markers are released after theirs)."""
        return self.prepared_count(job.transactional_id)

    def prepared_count(self, transactional_id: str) -> int:
        return sum(1 for tid, v in self.committed_records()
                   if tid == transactional_id and v is not None and v.state.is_preparing)

    def release(self) -> None:
        ready = [h for h in self.held if h.barrier <= self.committed]
        self.held = [h for h in self.held if h.barrier > self.committed]
        for h in ready:
            if h.coordinator_epoch != self.epoch:
                continue  # that coordinator is gone: its answers were NOT_COORDINATOR
            for job in h.markers:
                assert self.prepare_logged(job), f"seed {self.seed}: marker before its Prepare record: {job}"
                self.in_flight[job] = (set(job.partitions), self.instance_of(job))
            if h.client is not None:
                self.answer(h.client, h.call, h.response)

    def answer(self, client: Client, call: str, response) -> None:
        client.waiting = False
        if client.phase == "fenced":
            return
        if call == "init":
            if response.error == ErrorCode.none:
                client.pid, client.epoch, client.phase = response.producer_id, response.producer_epoch, "add"
        elif call == "add":
            if response.error == ErrorCode.none:
                client.phase = "end"
            elif response.error == ErrorCode.producer_fenced:
                client.phase = "fenced"
        elif call == "late":
            assert response.error != ErrorCode.none, \
                f"seed {self.seed}: a late write at a finished transaction's epoch joined the next one"
        elif call == "end" and self.v2:
            if response.error == ErrorCode.none:
                told = client.told_committed if client.commit else client.told_aborted
                # The markers carry the bumped epoch the answer gives.
                told.append((response.producer_id, response.producer_epoch, self.prepared_count(client.tid)))
                client.ended_epochs.append(client.epoch)
                client.pid, client.epoch, client.phase = response.producer_id, response.producer_epoch, "add"
            elif response.error in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_id_mapping):
                client.phase = "fenced"
            elif response.error == ErrorCode.invalid_txn_state:
                client.phase = "add"
        elif call == "end":
            if response == ErrorCode.none:
                told = client.told_committed if client.commit else client.told_aborted
                told.append((client.pid, client.epoch, self.prepared_count(client.tid)))
                client.phase = "add"
            elif response in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_id_mapping):
                client.phase = "fenced"
            elif response == ErrorCode.invalid_txn_state:
                client.phase = "add"

    def deliver(self, lossy: bool) -> None:
        for job, (remaining, instance) in list(self.in_flight.items()):
            for tp in sorted(remaining):
                if lossy and self.rng.random() < 0.4:
                    continue  # lost: sent again later
                key = (job.transactional_id, job.producer_id, job.producer_epoch, instance)
                self.marked.setdefault(key, set()).add(job.commit)
                assert len(self.marked[key]) == 1, f"seed {self.seed}: both committed and aborted: {key}"
                remaining.discard(tp)
            if not remaining:
                del self.in_flight[job]
                if job.coordinator_epoch == self.epoch:
                    self.absorb(self.shard.markers_written(job, self.now))

    def failover(self) -> None:
        if self.rng.random() < 0.5:
            del self.log[self.committed:]  # the new leader did not have the tail
        else:
            self.committed = len(self.log)  # it had it, and commits it
        self.epoch += 1
        self.held = []
        self.in_flight = {}
        for client in self.clients.values():
            client.waiting = False  # NOT_COORDINATOR: the client retries
        self.shard = self._new_shard()
        self.absorb(self.shard.on_loaded(self.now))

    # --- the clients -------------------------------------------------------------

    def client_step(self, client: Client) -> None:
        if client.waiting or not self.shard.loaded:
            return
        if client.phase == "fenced" or self.rng.random() < 0.03:
            # A new instance of the producer (the old one is fenced).
            self.clients[client.tid] = client = Client(client.tid)
        if client.phase == "init":
            pid = None
            if self.shard.needs_producer_id(client.tid, -1, -1):
                pid, self.next_pid = self.next_pid, self.next_pid + 1
            client.waiting = True
            self.absorb(self.shard.init_producer_id(client.tid, 3000, -1, -1, self.now, pid), client, "init")
        elif self.v2 and client.ended_epochs and self.rng.random() < 0.2:
            # A zombie of an ended transaction: a late write, at its epoch.
            client.waiting = True
            late = frozenset(self.rng.sample(PARTITIONS, 1))
            self.absorb(self.shard.add_partitions(client.tid, client.pid, self.rng.choice(client.ended_epochs),
                                                  late, self.now, 2), client, "late")
        elif client.phase == "add":
            client.partitions = frozenset(self.rng.sample(PARTITIONS, self.rng.randint(1, 3)))
            client.commit = self.rng.random() < 0.6
            client.waiting = True
            self.absorb(self.shard.add_partitions(client.tid, client.pid, client.epoch, client.partitions,
                                                  self.now, 2 if self.v2 else 0), client, "add")
        elif client.phase == "end" and self.v2:
            client.waiting = True
            pid = None
            if self.shard.end_txn_needs_producer_id(client.tid, client.pid, client.epoch):
                pid, self.next_pid = self.next_pid, self.next_pid + 1
            self.absorb(self.shard.end_txn_v2(client.tid, client.pid, client.epoch, client.commit, self.now, pid),
                        client, "end")
        elif client.phase == "end":
            client.waiting = True
            self.absorb(self.shard.end_txn(client.tid, client.pid, client.epoch, client.commit, self.now),
                        client, "end")

    # --- the run -------------------------------------------------------------------

    def run(self, events: int) -> None:
        self.absorb(self.shard.on_loaded(self.now))
        for _ in range(events):
            self.now += self.rng.randint(0, 200)
            roll = self.rng.random()
            if roll < 0.45:
                self.client_step(self.rng.choice(list(self.clients.values())))
            elif roll < 0.65:
                self.committed = len(self.log)
            elif roll < 0.85:
                self.deliver(lossy=True)
            elif roll < 0.97:
                self.absorb(self.shard.tick(self.now))
            else:
                self.failover()
            self.release()
        # Faults stop: everything in flight settles.
        for _ in range(50):
            self.committed = len(self.log)
            self.release()
            self.deliver(lossy=False)
            self.now += 100
            self.absorb(self.shard.tick(self.now))
        self.committed = len(self.log)
        self.release()
        self.check_settled()

    def check_settled(self) -> None:
        assert not self.in_flight and not self.held, f"seed {self.seed}: work left over"
        for tid, txn in self.shard.txns.items():
            assert not txn.state.is_preparing, f"seed {self.seed}: {tid} stuck in {txn.state.display}"
        # Every committed Prepare was marked with its own outcome.
        seen: dict[str, int] = {}
        for tid, v in self.committed_records():
            if v is not None and v.state.is_preparing:
                seen[tid] = seen.get(tid, 0) + 1
                key = (tid, v.producer_id, v.producer_epoch, seen[tid])
                if v.partitions:
                    assert self.marked.get(key) == {v.state is TxnState.PREPARE_COMMIT}, \
                        f"seed {self.seed}: {key} marked {self.marked.get(key)}"
        # A client told "committed" finds COMMIT markers for that transaction, and "aborted" ABORT ones.
        for client in self.clients.values():
            for told, result in ((client.told_committed, {True}), (client.told_aborted, {False})):
                for pid, epoch, instance in told:
                    assert self.marked.get((client.tid, pid, epoch, instance)) == result, \
                        f"seed {self.seed}: {client.tid} told {result}, marked {self.marked.get((client.tid, pid, epoch, instance))}"


def test_simulated_coordinator_with_failover_and_lost_markers():
    for seed in SEEDS:
        Sim(seed).run(400)


def test_simulated_transactions_v2_with_failover_lost_markers_and_late_writes():
    for seed in SEEDS:
        Sim(seed, v2=True).run(400)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False))
def test_simulated_coordinator_with_a_schedule_hypothesis_draws(rng):
    # Hypothesis draws every choice of the run, so a failure shrinks to a
    # short schedule of events.
    Sim(None, rng, v2=rng.random() < 0.5).run(200)
