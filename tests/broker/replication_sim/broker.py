"""A simulated broker: the thin shell around the replication core.

It does what the real broker shell must do, in the order the core's
docstrings ask, with events instead of trio tasks:

- **metadata**: register (BrokerRegistration) and heartbeat; apply images
  only once they include our own registration (KIP-631: a restarted broker
  must not act on a leadership its previous life held), through
  `image_delta` into `Partition.apply_registration`; record a new leader
  epoch in the epoch cache; move fetching as `RoleChange.follow` says.
- **leader**: append produces, park acks=all until `produce_outcome`
  answers; answer follower Fetches with `handle_replica_fetch` (long poll:
  park until the log grows or max wait); send AlterPartition proposals to
  the controller and feed the answers back; `tick` for ISR shrinks.
- **follower**: one fetcher per source broker; apply `FollowerAction`s to
  the log; update the follower HW.
- **durability**: no fsync per append (Kafka's default); optional periodic
  flush; a HW checkpoint every `HW_CHECKPOINT_MS`; a crash loses whatever
  the `SimFileSystem` had not synced.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.errors import ErrorCode

from broker.core.replication import (
    AlterPartitionProposal,
    FetcherManager,
    FetchPlan,
    LeaderUpdate,
    Partition,
    PartitionFetchResult,
    PendingProduce,
    ReplicaFetch,
    Role,
    TopicIdPartition,
    build_request,
    eligible_brokers,
    failed,
    split_response,
)
from quorum.metadata import MetadataImage, image_delta
from storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from storage.config import LogConfig
from storage.errors import StorageError
from storage.log import Log
from storage.sim_fs import SimFileSystem

from replication_sim.mirror import Mirror, decode
from replication_sim.network import Node

if TYPE_CHECKING:
    from replication_sim.cluster import SimCluster

DATA_DIR = "/data"
TOPIC = "t"
LOG_CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=256)
HEARTBEAT_MS = 80
METADATA_PULL_MS = 150
TICK_MS = 40
HW_CHECKPOINT_MS = 100
CONTROLLER_TIMEOUT_MS = 100
FETCH_TIMEOUT_MS = 150
CONSUMER_READ_BYTES = 2048


class SimBroker(Node):
    def __init__(self, broker_id: int, cluster: SimCluster, fs_seed: int) -> None:
        super().__init__(f"broker{broker_id}")
        self.broker_id = broker_id
        self.cluster = cluster
        self.loop = cluster.loop
        self.network = cluster.network
        self.fs = SimFileSystem(fs_seed)
        self.fs.makedirs(DATA_DIR)
        #: The newest image applied, kept across crashes: the broker's local
        #: copy of the metadata log, which it replays on start.
        self.disk_image: MetadataImage | None = None
        self.alive = False
        self._reset()

    def _reset(self) -> None:
        self.broker_epoch = -1
        self.incarnation_id = uuid.UUID(int=self.cluster.rng.getrandbits(128))
        self.latest_image: MetadataImage | None = None
        self.image = MetadataImage()
        self.partitions: dict[int, Partition] = {}
        self.logs: dict[int, Log] = {}
        self.mirrors: dict[int, Mirror] = {}
        self.fetchers = FetcherManager(self.broker_id, self.cluster.replication_config)
        self.produces: dict[int, list[tuple[PendingProduce, int, list[bytes], Any]]] = {}
        self.fetch_waiters: dict[int, list[Any]] = {}
        self._kick_scheduled: set[int] = set()

    # --- life ----------------------------------------------------------------------

    def start(self) -> None:
        assert not self.alive
        self._touch()
        self.alive = True
        self.incarnation += 1
        self._reset()
        if self.cluster.scenario.publish_before_registration and self.disk_image is not None:
            # The mistake the KIP-631 rule prevents: act on the replayed local
            # metadata before the image holds this process's registration.
            self.latest_image = self.disk_image
            self._apply_latest()
        self._register()
        self._every(HEARTBEAT_MS, self._heartbeat)
        self._every(METADATA_PULL_MS, self._pull_metadata)
        self._every(TICK_MS, self._tick)
        self._every(HW_CHECKPOINT_MS, self._checkpoint)
        if self.cluster.scenario.flush_interval_ms:
            self._every(self.cluster.scenario.flush_interval_ms, self._flush)

    def crash(self, tear: bool) -> None:
        """Power cut: the process dies and the disk keeps only what was synced."""
        self._touch()
        assert self.alive
        self.alive = False
        self.incarnation += 1
        self.fs.crash(tear=tear)
        self._reset()
        self.cluster.invariants.on_crash(self.broker_id)

    def _touch(self) -> None:
        """Something the invariants look at may have changed."""
        self.cluster.invariants.dirty = True

    def _every(self, period_ms: int, fn) -> None:
        life = self.incarnation

        def run() -> None:
            if self.alive and self.incarnation == life:
                fn()
                self.loop.after(period_ms, run)

        self.loop.after(self.cluster.rng.randint(1, period_ms), run)

    def _later(self, delay_ms: int, fn) -> None:
        life = self.incarnation
        self.loop.after(delay_ms, lambda: fn() if self.alive and self.incarnation == life else None)

    # --- controller ----------------------------------------------------------------------

    def _call_controller(self, request: Any, on_reply) -> None:
        controller = self.cluster.controller
        self.network.call(self, controller, controller.serve(request), on_reply, CONTROLLER_TIMEOUT_MS)

    def _register(self) -> None:
        request = BrokerRegistrationRequest(
            broker_id=self.broker_id, cluster_id="c", incarnation_id=self.incarnation_id,
            listeners=(Listener(name="PLAINTEXT", host="sim", port=9000 + self.broker_id, security_protocol=0),),
            features=(), rack=None)

        def on_reply(response) -> None:
            if response is None or response.error_code != ErrorCode.none:
                self._later(50, self._register)
                return
            self.broker_epoch = response.broker_epoch
            self._apply_latest()

        self._call_controller(request, on_reply)

    def _heartbeat(self) -> None:
        if self.broker_epoch < 0:
            return
        offset = self.latest_image.offset if self.latest_image is not None else -1
        self._call_controller(BrokerHeartbeatRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch, current_metadata_offset=offset,
            want_fence=False, want_shut_down=False), lambda response: None)

    def _pull_metadata(self) -> None:
        controller = self.cluster.controller
        self.network.call(self, controller, controller.serve_metadata(),
                          lambda image: image is not None and self.on_image(image), CONTROLLER_TIMEOUT_MS)

    def on_image(self, image: MetadataImage) -> None:
        if self.latest_image is None or image.offset > self.latest_image.offset:
            self.latest_image = image
            self._apply_latest()

    def _apply_latest(self) -> None:
        image = self.latest_image
        gated = not self.cluster.scenario.publish_before_registration
        if image is None or (gated and (self.broker_epoch < 0 or image.offset < self.broker_epoch)):
            return  # KIP-631: not before the image holds our own registration
        if image.offset <= self.image.offset:
            return
        old, self.image = self.image, image
        self.disk_image = image
        now = self.loop.now_ms
        eligible = eligible_brokers(image)
        delta = image_delta(old, image, self.broker_id)
        for local in (*delta.leaders, *delta.followers):
            self._apply_registration(local, eligible, now)
        if old.brokers is not image.brokers:
            for part in self.partitions.values():
                part.update_eligibility(eligible)

    def _apply_registration(self, local, eligible, now: int) -> None:
        self._touch()
        p = local.partition
        part = self.partitions.get(p)
        checkpointed = None
        if part is None:
            log = self.logs[p] = Log.open(f"{DATA_DIR}/{TOPIC}-{p}", LOG_CONFIG, now_ms=now, fs=self.fs)
            self.mirrors[p] = Mirror.of_log(log)
            self.cluster.note(f"broker {self.broker_id} {p}: opened log, LEO {log.log_end_offset}, "
                              f"epochs {log.epoch_cache.entries}")
            min_isr = int(self.image.topic_config(TOPIC).get("min.insync.replicas", "1"))
            part = self.partitions[p] = Partition(TOPIC, p, local.topic_id, self.broker_id,
                                                  self.cluster.replication_config, min_isr)
            checkpointed = self._read_hw_checkpoint().get((TOPIC, p))
        log = self.logs[p]
        before = (part.role, part.leader_epoch)
        change = part.apply_registration(local.registration, log, now, eligible=eligible,
                                         checkpointed_high_watermark=checkpointed)
        if (part.role, part.leader_epoch) != before or checkpointed is not None:
            self.cluster.note(f"broker {self.broker_id} {p}: {part.role.value} at epoch {part.leader_epoch} "
                              f"(leader {part.leader_id}, ISR {part.isr}, LEO {log.log_end_offset}, "
                              f"HW {part.high_watermark})")
        if change.epoch_start is not None:
            log.epoch_cache.assign(*change.epoch_start)
        if change.follow is not None:
            leader_id, leader_epoch = change.follow
            _, new = self.fetchers.follow(TopicIdPartition(part.topic_id, p), TOPIC, leader_id, leader_epoch)
            if new is not None:
                self._kick(new)
        self._act(p, change.update)

    def _read_hw_checkpoint(self) -> dict:
        try:
            return OffsetCheckpointFile(self.fs, f"{DATA_DIR}/{REPLICATION_OFFSET_CHECKPOINT}").read()
        except (FileNotFoundError, StorageError):
            return {}

    # --- acting on the core's decisions --------------------------------------------------

    def _act(self, p: int, update: LeaderUpdate) -> None:
        if update.alter_partition is None and not update.wake:
            return
        self._touch()
        if update.alter_partition is not None:
            self._send_alter_partition(p, update.alter_partition)
        if update.wake:
            self._check_produces(p)

    def _send_alter_partition(self, p: int, proposal: AlterPartitionProposal) -> None:
        key = TopicIdPartition(proposal.topic_id, proposal.partition)
        self.cluster.note(f"broker {self.broker_id} {p}: AlterPartition {proposal.kind} to {proposal.isr} "
                          f"(epochs {proposal.leader_epoch}/{proposal.partition_epoch})")

        def on_reply(response) -> None:
            results = split_response(response, [proposal]) if response is not None else failed([proposal])
            part = self.partitions.get(p)
            self.cluster.note(f"broker {self.broker_id} {p}: AlterPartition {proposal.isr} -> {results[key]}")
            if part is not None:
                self._act(p, part.on_alter_partition_result(proposal, results[key], self.loop.now_ms))

        self._call_controller(build_request(self.broker_id, self.broker_epoch, [proposal]), on_reply)

    def _tick(self) -> None:
        now = self.loop.now_ms
        for p, part in self.partitions.items():
            self._act(p, part.tick(now))
            self._check_produces(p)

    def _checkpoint(self) -> None:
        hws = {(TOPIC, p): part.high_watermark for p, part in self.partitions.items()}
        if hws:
            OffsetCheckpointFile(self.fs, f"{DATA_DIR}/{REPLICATION_OFFSET_CHECKPOINT}").write(hws)

    def _flush(self) -> None:
        for log in self.logs.values():
            log.flush()
            log.write_checkpoints()

    # --- leader: produce ---------------------------------------------------------------------

    def handle_produce(self, p: int, batch: bytes, values: list[bytes], timeout_ms: int, reply) -> None:
        self._touch()
        part = self.partitions.get(p)
        if part is None:
            reply((ErrorCode.not_leader_or_follower, -1))
            return
        error = part.produce_error(acks=-1)
        if error != ErrorCode.none:
            reply((error, -1))
            return
        log = self.logs[p]
        now = self.loop.now_ms
        base = log.append(bytearray(batch), now, leader_epoch=part.leader_epoch)
        self.mirrors[p].append([(base + i, v, part.leader_epoch) for i, v in enumerate(values)])
        pending = PendingProduce(log.log_end_offset, part.leader_epoch, now + timeout_ms)
        self.produces.setdefault(p, []).append((pending, base, values, reply))
        self._act(p, part.on_leader_append(log.log_end_offset))
        self._wake_fetches(p)
        self._check_produces(p)
        self._later(timeout_ms, lambda: self._check_produces(p))

    def _check_produces(self, p: int) -> None:
        parked = self.produces.get(p)
        if not parked:
            return
        self._touch()
        part = self.partitions.get(p)
        now = self.loop.now_ms
        waiting = []
        for entry in parked:
            pending, base, values, reply = entry
            outcome = part.produce_outcome(pending, now) if part is not None else ErrorCode.not_leader_or_follower
            if outcome is None:
                waiting.append(entry)
                continue
            if outcome == ErrorCode.none:
                self.cluster.note(f"broker {self.broker_id} {p}: ack {base}..{base + len(values) - 1} "
                                  f"(HW {part.high_watermark}, ISR {part.leader.maximal_isr})")
                self.cluster.invariants.on_ack(self, p, base, values)
            reply((outcome, base))
        self.produces[p] = waiting

    # --- leader: follower fetches ---------------------------------------------------------------

    def handle_replica_fetch(self, plan: FetchPlan, reply) -> None:
        deadline = self.loop.now_ms + plan.max_wait_ms
        done = False

        def attempt(final: bool) -> bool:
            nonlocal done
            if done or not self.alive:
                return True
            results, ready = self._read_for_follower(plan)
            if ready or final or self.loop.now_ms >= deadline:
                done = True
                reply(results)
            return done

        def park() -> None:
            for pf in plan.partitions:
                self.fetch_waiters.setdefault(pf.key.partition, []).append(retry)

        def retry() -> None:
            if not attempt(False):
                park()

        if attempt(False):
            return
        park()
        self._later(plan.max_wait_ms, lambda: attempt(True))

    def _read_for_follower(self, plan: FetchPlan) -> tuple[dict, bool]:
        self._touch()
        now = self.loop.now_ms
        results = {}
        ready = False
        for pf in plan.partitions:
            p = pf.key.partition
            part = self.partitions.get(p)
            if part is None:
                results[pf.key] = PartitionFetchResult(ErrorCode.not_leader_or_follower)
                ready = True
                continue
            log = self.logs[p]
            fetch = ReplicaFetch(plan.replica_id, pf.fetch_offset, pf.last_fetched_epoch, pf.current_leader_epoch,
                                 plan.broker_epoch)
            decision = part.handle_replica_fetch(fetch, log, now)
            self._act(p, decision.update)
            if decision.error != ErrorCode.none or decision.diverging_epoch is not None:
                results[pf.key] = PartitionFetchResult(decision.error, decision.high_watermark,
                                                       decision.log_start_offset, decision.diverging_epoch)
                ready = True
                continue
            records = b""
            if decision.read_offset < decision.read_max_offset:
                records = log.read_bytes(decision.read_offset, pf.partition_max_bytes,
                                         max_offset=decision.read_max_offset)
                ready = ready or bool(records)
            results[pf.key] = PartitionFetchResult(ErrorCode.none, decision.high_watermark,
                                                   decision.log_start_offset, None, records)
        return results, ready

    def _wake_fetches(self, p: int) -> None:
        waiters = self.fetch_waiters.pop(p, None)
        if waiters:
            for waiter in waiters:
                self._later(0, waiter)

    # --- leader: consumers -------------------------------------------------------------------------

    def handle_consumer_fetch(self, p: int, offset: int, reply) -> None:
        self._touch()
        part = self.partitions.get(p)
        error = part.fetch_error(-1) if part is not None else ErrorCode.not_leader_or_follower
        if error != ErrorCode.none:
            reply((error, -1, []))
            return
        log = self.logs[p]
        hw = part.fetch_upper_bound(read_committed=False)
        if offset < log.log_start_offset or offset > log.log_end_offset:
            reply((ErrorCode.offset_out_of_range, hw, []))
            return
        records = []
        if offset < hw:
            records = [(o, v) for o, v, _ in decode(log.read_bytes(offset, CONSUMER_READ_BYTES, max_offset=hw))]
        reply((ErrorCode.none, hw, records))

    # --- follower: fetchers ------------------------------------------------------------------------

    def _logs_by_key(self) -> dict[TopicIdPartition, Log]:
        return {TopicIdPartition(part.topic_id, p): self.logs[p] for p, part in self.partitions.items()}

    def _kick(self, source: int) -> None:
        fetcher = self.fetchers.fetcher(source)
        if fetcher is None or fetcher.in_flight is not None or self.broker_epoch < 0:
            return
        now = self.loop.now_ms
        logs = self._logs_by_key()
        plan = fetcher.build_fetch(logs, self.broker_epoch, now)
        if plan is None:
            wake = fetcher.next_wakeup_ms(now)
            if wake is not None and source not in self._kick_scheduled:
                self._kick_scheduled.add(source)

                def rekick() -> None:
                    self._kick_scheduled.discard(source)
                    self._kick(source)

                self._later(max(wake - now, 1), rekick)
            return
        leader = self.cluster.brokers[source]
        self.network.call(self, leader, lambda reply: leader.handle_replica_fetch(plan, reply),
                          lambda response: self._on_fetch_response(source, fetcher, plan, response),
                          FETCH_TIMEOUT_MS)

    def _on_fetch_response(self, source: int, fetcher, plan: FetchPlan, response) -> None:
        self._touch()
        now = self.loop.now_ms
        actions = fetcher.handle_response(plan, response, self._logs_by_key(), now)
        for action in actions:
            p = action.key.partition
            part, log, mirror = self.partitions[p], self.logs[p], self.mirrors[p]
            assert part.role is Role.FOLLOWER
            try:
                if action.truncate_to is not None:
                    self.cluster.note(f"broker {self.broker_id} {p}: truncate to {action.truncate_to} "
                                      f"(LEO {log.log_end_offset}, HW {part.high_watermark})")
                    before = log.log_end_offset
                    log.truncate_to(action.truncate_to)
                    # Kafka's truncateTo also drops epoch entries at the log end
                    # when no record goes (see FollowerAction); storage.Log does not.
                    log.epoch_cache.truncate_from_end(action.truncate_to)
                    mirror.truncate(log.log_end_offset)
                    self.cluster.invariants.on_truncate(self, p, before - log.log_end_offset)
                if action.start_at is not None:
                    before = log.log_end_offset
                    log.truncate_fully_and_start_at(action.start_at)
                    mirror.reset(action.start_at)
                    self.cluster.invariants.on_truncate(self, p, before)
                if action.records:
                    log.append_as_follower(action.records, now)
                    mirror.append(decode(action.records))
            except StorageError:
                fetcher.on_append_failed(action.key, now)
                continue
            if action.truncate_to is not None or action.start_at is not None or \
                    action.leader_high_watermark is not None:
                part.on_follower_log_changed(log.log_end_offset, action.leader_high_watermark)
        self.fetchers.on_response_done(source)
        self._kick(source)
