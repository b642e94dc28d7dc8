"""The ZooKeeper-mode controller's decisions, as a pure core.

Theory of operation
-------------------
This is Kafka's pre-KRaft `KafkaController` (with its partition and replica
state machines) reduced to its decisions. `ZkControllerCore.handle(event)`
returns a `Decision` (see `context`); when the decision has writes, the
shell applies them and calls `writes_applied(outcomes)`, which returns the
next decision, until one has no writes. Requests to brokers are only ever
built from state ZooKeeper has confirmed. No clock is needed: ZooKeeper
times out broker sessions, and the controller reacts to what it sees.

    Inactive --Failover--> Active --handle() with writes--> Writing
    Writing --writes_applied() without new writes--> Active
    any --resign (a newer controller's write seen) / shell fenced--> discarded

The rules, with where Kafka has them:

* **Failover** (`onControllerFailover`): adopt the loaded snapshot; send
  every live broker UpdateMetadata for all partitions and a full
  LeaderAndIsr for the partitions it hosts; initialize partitions without a
  state znode; elect leaders for partitions whose leader is not live; resume
  pending topic deletions; delete pending ISR-change notifications (the load
  is fresher than they are).
* **Broker failure** (`onBrokerFailure`, `OfflineReplica`): for every
  partition on a dead broker, the dead brokers leave the ISR (the last
  member stays, so the ISR never empties) and a dead leader is replaced by
  the first live ISR member in replica order. With no live ISR member the
  partition goes offline (leader -1) unless the topic's
  `unclean.leader.election.enable` is set: then the first live replica leads
  alone. Each change bumps the leader epoch, as Kafka's ZooKeeper-mode
  `newLeaderAndIsr` does. The rule itself is `quorum.controller.elections.
  partition_change`, the same one the KRaft controller runs.
  A broker whose registration's czxid changed (it lost its session and
  re-registered) is handled as failed, then started.
* **Broker start-up** (`onBrokerStartup`): UpdateMetadata to everyone (the
  live broker list changed), all partitions to the new broker, a full
  LeaderAndIsr for what it hosts; offline partitions it can lead are
  elected; partitions never initialized are initialized; deletions blocked
  on it resume. It is not added back to any ISR: its leaders do that once
  it has caught up.
* **New topics** (`NewPartition -> OnlinePartition`): leader = first live
  replica, ISR = the live replicas, leader epoch 0; a state znode is
  created; LeaderAndIsr (is_new) to the replicas, UpdateMetadata to all. A
  partition with no live replica stays uninitialized until one registers.
* **New partitions** of a known topic (CreatePartitions rewrote its
  `/brokers/topics/<t>`): each goes online as a new topic's partition does.
* **Topic deletion** (`TopicDeletionManager`): a topic is deleted once all
  its replicas are live (a replica on a dead broker would keep its log):
  its znodes go, brokers get UpdateMetadata with leader -2 and
  StopReplica(delete). Until then it waits in `topics_to_delete`.
* **ISR changes**: leaders write ISR changes to the state znode themselves
  (conditional on its zkVersion) and leave a notification; the controller
  adopts the newer states, tells all brokers (UpdateMetadata) and deletes
  the notifications.
* **Lost races**: a partition-state write that loses to a write we did not
  see is retried from the fresh state. If that state carries a controller
  epoch above ours, a newer controller wrote it and we resign.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from quorum.controller.elections import partition_change
from quorum.metadata.image import PartitionRegistration
from quorum.metadata.topic_configs import TOPIC_CONFIGS
from quorum.zookeeper import znodes as z
from quorum.zookeeper.batch import RequestBatch
from quorum.zookeeper.context import (
    BrokersChanged,
    ControllerContext,
    ControllerEvent,
    CreateZNode,
    Decision,
    DeleteZNode,
    Failover,
    IsrChangesNotified,
    PartitionsAdded,
    SetZNode,
    TopicConfigsLoaded,
    TopicDeletionRequested,
    TopicsChanged,
    WriteOutcome,
    ZkTransaction,
)
from quorum.zookeeper.znodes import NamedPartition, PartitionState


@dataclass(frozen=True, slots=True)
class ZkControllerConfig:
    broker_id: int
    #: The listener brokers replicate over; LeaderAndIsr names leaders by it.
    inter_broker_listener_name: str = "PLAINTEXT"
    #: Cluster default of `unclean.leader.election.enable` (a topic config overrides it).
    unclean_leader_election_enable: bool = False


_NEEDS_CONFIG = object()


@dataclass(slots=True)
class _PartitionWrite:
    tp: NamedPartition
    state: PartitionState  # zk_version = the version the write expects (-1: create)
    is_new: bool


@dataclass(slots=True)
class _Work:
    """One event's work in progress: writes in flight and the requests to send when they settle."""

    batch: RequestBatch
    inflight: dict[ZkTransaction, object] = field(default_factory=dict)
    #: submitted since the last decision
    outgoing: list[ZkTransaction] = field(default_factory=list)
    #: handed to the shell with the last decision, awaiting outcomes
    awaiting: frozenset[ZkTransaction] = frozenset()
    #: partitions with a state write in flight
    writing: set[NamedPartition] = field(default_factory=set)
    config_reads: set[str] = field(default_factory=set)


class ZkControllerCore:
    """The active controller's decisions. Create one per election; `handle(Failover)` first."""

    def __init__(self, config: ZkControllerConfig) -> None:
        self.config = config
        self.ctx = ControllerContext(config.broker_id)
        self.active = False
        #: partitions whose election waits for their topic's config
        self._awaiting_config: dict[str, set[NamedPartition]] = {}
        self._work: _Work | None = None

    @property
    def writing(self) -> bool:
        return self._work is not None

    # --- entry points ---------------------------------------------------------------

    def handle(self, event: ControllerEvent) -> Decision:
        assert self._work is None, "feed writes_applied() until a decision has no writes before the next event"
        assert self.active or isinstance(event, Failover), f"{type(event).__name__} before Failover"
        self._work = _Work(RequestBatch(self.ctx, self.config.inter_broker_listener_name))
        handler: Callable = {
            Failover: self._failover,
            BrokersChanged: self._brokers_changed,
            TopicsChanged: self._topics_changed,
            TopicDeletionRequested: self._deletion_requested,
            IsrChangesNotified: self._isr_changes,
            TopicConfigsLoaded: self._configs_loaded,
            PartitionsAdded: self._partitions_added,
        }[type(event)]
        resign = handler(event)
        return Decision(resign=True) if resign else self._next()

    def writes_applied(self, outcomes: Sequence[WriteOutcome]) -> Decision:
        """What to do after the shell applied the last decision's writes (none of them fenced)."""
        work = self._work
        assert work is not None, "no writes in flight"
        assert {o.transaction for o in outcomes} == work.awaiting, "need one outcome per write of the last decision"
        for outcome in outcomes:
            action = work.inflight.pop(outcome.transaction)
            if isinstance(action, _PartitionWrite):
                work.writing.discard(action.tp)
                if outcome.ok:
                    self._partition_written(action)
                elif self._lost_race(action, outcome.fresh):
                    self._work = None
                    self.active = False
                    return Decision(resign=True)
            elif isinstance(action, str) and outcome.ok:
                # A deleted topic: tell brokers, then forget it.
                work.batch.topic_deleted(action)
                self.ctx.remove_topic(action)
        return self._next()

    # --- event handlers (return True to resign) ---------------------------------------

    def _failover(self, event: Failover) -> bool:
        snap = event.snapshot
        ctx = self.ctx = ControllerContext(self.config.broker_id, snap.controller_epoch, snap.epoch_zk_version,
                                           dict(snap.brokers))
        self._work.batch = RequestBatch(ctx, self.config.inter_broker_listener_name)
        self._awaiting_config.clear()
        self.active = True
        for name, assignment in snap.topics.items():
            ctx.add_topic(name, assignment)
        ctx.states = {tp: s for tp, s in snap.states.items() if tp.topic in ctx.topics}
        if any(s.controller_epoch > ctx.epoch for s in ctx.states.values()):
            return True
        self._write_plain([DeleteZNode(f"{z.ISR_CHANGE_NOTIFICATION_PATH}/{n}") for n in snap.isr_notifications])
        self._write_plain([DeleteZNode(z.delete_topic_path(t)) for t in sorted(snap.topics_to_delete - set(ctx.topics))])
        ctx.topics_to_delete = set(snap.topics_to_delete) & set(ctx.topics)
        batch = self._work.batch
        batch.update_metadata(ctx.live_brokers, ctx.all_partitions())
        for b in ctx.live_brokers:
            batch.full_leader_and_isr(b)
        self._make_online(ctx.all_partitions())
        self._try_deleting_topics()
        return False

    def _brokers_changed(self, event: BrokersChanged) -> bool:
        ctx = self.ctx
        old, live = ctx.live_brokers, dict(event.live)
        bounced = {b for b in live if b in old and live[b].broker_epoch != old[b].broker_epoch}
        dead = (set(old) - set(live)) | bounced
        started = (set(live) - set(old)) | bounced
        if not dead and not started and live == old:
            return False
        ctx.live_brokers = live
        batch = self._work.batch
        batch.update_metadata(set(live) - started, ())
        for tp in ctx.partitions_on(dead):
            state = ctx.states.get(tp)
            if state is None or tp.topic in ctx.topics_to_delete:
                continue
            # A bounced broker first leaves (as failed), then may lead again (as started).
            without = self._next_state(tp, state, leaving=dead)
            if without is _NEEDS_CONFIG:
                self._await_config(tp)
                continue
            after = without or state
            if bounced & set(ctx.replicas(tp)):
                again = self._next_state(tp, after)
                after = after if again is None or again is _NEEDS_CONFIG else again
            if after is not state:
                self._write_partition(tp, after)
        for b in sorted(started):
            batch.update_metadata((b,), ctx.all_partitions())
            batch.full_leader_and_isr(b)
        self._make_online(tp for tp in ctx.partitions_on(started) if tp not in self._work.writing)
        self._try_deleting_topics()
        return False

    def _topics_changed(self, event: TopicsChanged) -> bool:
        ctx = self.ctx
        for name in sorted(set(ctx.topics) - event.names):
            # Deleted behind our back (not through /admin/delete_topics): brokers still must stop it.
            self._work.batch.topic_deleted(name)
            ctx.remove_topic(name)
        for name, assignment in sorted(event.new_assignments.items()):
            if name in ctx.topics or name not in event.names:
                continue
            ctx.add_topic(name, assignment)
            self._make_online(NamedPartition(name, p) for p in sorted(assignment.partitions))
        return False

    def _partitions_added(self, event: PartitionsAdded) -> bool:
        """CreatePartitions (Kafka's `onNewPartitionCreation` from the partition-modification
        watch): new partitions of a known topic go online as a new topic's do. Existing
        partitions never change this way (that would be a reassignment)."""
        ctx = self.ctx
        for name, assignment in sorted(event.assignments.items()):
            current = ctx.topics.get(name)
            if current is None or name in ctx.topics_to_delete or assignment.topic_id != current.topic_id:
                continue
            self._make_online(ctx.extend_topic(name, assignment))
        return False

    def _deletion_requested(self, event: TopicDeletionRequested) -> bool:
        ctx = self.ctx
        self._write_plain([DeleteZNode(z.delete_topic_path(t)) for t in sorted(event.names - set(ctx.topics))])
        ctx.topics_to_delete |= event.names & set(ctx.topics)
        self._try_deleting_topics()
        return False

    def _isr_changes(self, event: IsrChangesNotified) -> bool:
        ctx = self.ctx
        changed = []
        for tp, state in sorted(event.states.items()):
            if state is None or tp.topic not in ctx.topics:
                continue
            if state.controller_epoch > ctx.epoch:
                return True
            current = ctx.states.get(tp)
            if current is None or state.zk_version > current.zk_version:
                ctx.states[tp] = state
                changed.append(tp)
        self._work.batch.update_metadata(ctx.live_brokers, changed)
        self._write_plain([DeleteZNode(f"{z.ISR_CHANGE_NOTIFICATION_PATH}/{n}") for n in event.notifications])
        return False

    def _configs_loaded(self, event: TopicConfigsLoaded) -> bool:
        ctx = self.ctx
        for topic, config in sorted(event.configs.items()):
            if topic not in ctx.topics:
                continue
            ctx.topic_configs[topic] = dict(config)
            waiting = self._awaiting_config.pop(topic, set())
            offline = {NamedPartition(topic, p) for p in ctx.topics[topic].partitions
                       if (s := ctx.states.get(NamedPartition(topic, p))) is not None and not s.has_leader}
            self._make_online(sorted(waiting | offline))
        return False

    # --- rules ------------------------------------------------------------------------

    def _unclean(self, topic: str) -> bool | None:
        """The topic's `unclean.leader.election.enable`; None if its config is not loaded yet."""
        config = self.ctx.topic_configs.get(topic)
        if config is None:
            return None
        raw = config.get("unclean.leader.election.enable")
        if raw is None:
            return self.config.unclean_leader_election_enable
        return bool(TOPIC_CONFIGS["unclean.leader.election.enable"].parse(raw))

    def _next_state(self, tp: NamedPartition, state: PartitionState, leaving: Iterable[int] = ()):
        """The state after `leaving` (and every broker that is not live) left the ISR and a
        leader was elected if needed: None if nothing changes, `_NEEDS_CONFIG` if only the
        unclean-election setting can decide."""
        ctx = self.ctx
        replicas = ctx.replicas(tp)
        isr = tuple(b for b in state.isr if b in replicas) or replicas[:1]
        gone = set(leaving) | {b for b in isr if not ctx.is_live(b)}

        def is_live(b: int) -> bool:
            return b not in gone and ctx.is_live(b)

        target = tuple(b for b in isr if b not in gone) or isr[-1:]
        unclean = False
        if not (state.leader in target and is_live(state.leader)) and not any(is_live(b) for b in target):
            if not any(is_live(b) for b in replicas):
                unclean = False  # nobody could lead: no need to know the setting
            else:
                known = self._unclean(tp.topic)
                if known is None:
                    return _NEEDS_CONFIG
                unclean = known
        current = PartitionRegistration(replicas, isr, state.leader, state.leader_epoch, max(state.zk_version, 0))
        change = partition_change(ctx.topic_id(tp.topic), tp.partition, current, is_live=is_live, unclean=unclean,
                                  target_isr=target)
        if change is None and isr == state.isr:
            return None
        leader = state.leader if change is None or change.leader is None else change.leader
        new_isr = isr if change is None or change.isr is None else change.isr
        return PartitionState(leader, state.leader_epoch + 1, new_isr, ctx.epoch, state.zk_version)

    def _make_online(self, tps: Iterable[NamedPartition]) -> None:
        """Initialize partitions without a state znode; elect leaders for those without a live one."""
        ctx = self.ctx
        for tp in tps:
            if tp.topic in ctx.topics_to_delete or tp.topic not in ctx.topics:
                continue
            state = ctx.states.get(tp)
            if state is None:
                live = tuple(r for r in ctx.replicas(tp) if ctx.is_live(r))
                if live:
                    self._write_partition(tp, PartitionState(live[0], 0, live, ctx.epoch, -1), is_new=True)
                continue
            after = self._next_state(tp, state)
            if after is _NEEDS_CONFIG:
                self._await_config(tp)
            elif after is not None:
                self._write_partition(tp, after)

    def _try_deleting_topics(self) -> None:
        ctx = self.ctx
        in_flight = {a for a in self._work.inflight.values() if isinstance(a, str)}
        for topic in sorted(ctx.topics_to_delete - in_flight):
            assignment = ctx.topics[topic]
            if not all(ctx.is_live(b) for replicas in assignment.partitions.values() for b in replicas):
                continue  # ineligible until every replica can be told to delete its log
            ops: list = []
            for p in sorted(assignment.partitions):
                ops += [DeleteZNode(z.partition_state_path(topic, p)), DeleteZNode(z.partition_path(topic, p))]
            ops += [DeleteZNode(z.partitions_path(topic)), DeleteZNode(z.topic_path(topic)),
                    DeleteZNode(z.topic_config_path(topic)), DeleteZNode(z.delete_topic_path(topic))]
            self._submit(ZkTransaction(tuple(ops)), topic)

    # --- writes -------------------------------------------------------------------------

    def _await_config(self, tp: NamedPartition) -> None:
        self._awaiting_config.setdefault(tp.topic, set()).add(tp)
        self._work.config_reads.add(tp.topic)

    def _write_partition(self, tp: NamedPartition, state: PartitionState, *, is_new: bool = False) -> None:
        assert tp not in self._work.writing, f"two writes of {tp} in flight"
        self._work.writing.add(tp)
        path = z.partition_state_path(*tp)
        data = z.encode_partition_state(state)
        op = CreateZNode(path, data, make_parents=True) if state.zk_version < 0 else SetZNode(path, data,
                                                                                              state.zk_version)
        self._submit(ZkTransaction((op,), partition=tp), _PartitionWrite(tp, state, is_new))

    def _write_plain(self, ops: list) -> None:
        if ops:
            self._submit(ZkTransaction(tuple(ops)), None)

    def _submit(self, transaction: ZkTransaction, action: object) -> None:
        self._work.inflight[transaction] = action
        self._work.outgoing.append(transaction)

    def _partition_written(self, w: _PartitionWrite) -> None:
        ctx = self.ctx
        if w.tp.topic not in ctx.topics:
            return
        ctx.states[w.tp] = dataclasses.replace(w.state, zk_version=w.state.zk_version + 1)
        batch = self._work.batch
        batch.leader_and_isr([r for r in ctx.replicas(w.tp) if ctx.is_live(r)], w.tp, is_new=w.is_new)
        batch.update_metadata(ctx.live_brokers, (w.tp,))

    def _lost_race(self, w: _PartitionWrite, fresh: PartitionState | None) -> bool:
        """Adopt the state that beat our write and decide again; True if it proves we were deposed."""
        ctx = self.ctx
        if fresh is None or w.tp.topic not in ctx.topics:
            return False
        if fresh.controller_epoch > ctx.epoch:
            return True
        if dataclasses.replace(fresh, zk_version=w.state.zk_version) == w.state:
            # Our own write, whose answer was lost (the shell retried after a connection loss).
            self._partition_written(dataclasses.replace(w, state=dataclasses.replace(
                w.state, zk_version=fresh.zk_version - 1)))
            return False
        ctx.states[w.tp] = fresh
        # The fresh state is news to brokers whatever we decide next.
        self._work.batch.update_metadata(ctx.live_brokers, (w.tp,))
        self._make_online((w.tp,))
        return False

    def _next(self) -> Decision:
        work = self._work
        assert work is not None
        writes, work.outgoing = tuple(work.outgoing), []
        reads, work.config_reads = frozenset(work.config_reads), set()
        if writes:
            work.awaiting = frozenset(writes)
            return Decision(writes=writes, read_topic_configs=reads)
        self._work = None
        return Decision(requests=work.batch.build(), read_topic_configs=reads)
