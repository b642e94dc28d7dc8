"""The active KRaft controller's side of a ZooKeeper migration (trio shell).

Theory of operation
-------------------
Every controller started with `zookeeper.metadata.migration.enable=true`
runs a `MigrationDriver` beside its `ControllerService`. Only the active
controller acts; on losing leadership its work is cancelled and the next
active controller picks up from the metadata log's `ZkMigrationState`:

    NONE/PRE_MIGRATION --copy--> MIGRATION --finalize--> POST_MIGRATION

1. **Claim** `/controller` and bump `/controller_epoch` (`zk_io.claim_controller`):
   from here a ZooKeeper-mode controller is fenced.
2. **Copy** (state NONE): wait until the expected brokers are registered in
   `/brokers/ids` (`copy.brokers_ready`), read ZooKeeper once and append
   `copy.migration_records` as one batch, which ends in
   ZkMigrationState(MIGRATION). Reading *after* the claim means no
   ZooKeeper controller can change the state between the read and the copy.
   A controller that finds MIGRATION instead reconciles: it reads ZooKeeper
   and dual-writes the difference to its image (a failover mid-migration).
3. **Dual write** (state MIGRATION): after each committed image,
   `dual_write.zk_writes` against the last image ZooKeeper got, applied
   fenced by the claimed epoch, then `/migration` records the offset; and
   `dual_write.zk_broker_requests` to the brokers still in ZooKeeper mode
   (those in `/brokers/ids`). Topics such a broker creates or marks for
   deletion in ZooKeeper (it takes admin requests as in ZooKeeper mode)
   are taken into the log (`copy.zk_admin_records`), as a ZooKeeper
   controller would act on them, and so are topic config changes it
   announces under `/config/changes` (`copy.zk_config_records`). Their partition epoch is the state znode's
   zkVersion, as a ZooKeeper-mode broker expects, so its own conditional
   ISR writes succeed; the driver turns those (announced under
   `/isr_change_notification`) into PartitionChange records, as the
   controller turns an AlterPartition into one.
4. Brokers still in ZooKeeper mode do not heartbeat the quorum; they are
   alive while their `/brokers/ids` znode is, and the driver counts that as
   their heartbeat (`ControllerService.keep_alive`). When the znode goes
   (a stopped broker, an expired session), the driver fences the broker at
   once and its leaderships move, as a ZooKeeper controller would do; the
   broker restarted in KRaft mode then registers with a new incarnation. A
   broker that (re)appears in `/brokers/ids` is registered unfenced and
   elected where it is the only choice (`changes_for_returning_broker`).
5. **Finalize**: ZkMigrationState(POST_MIGRATION) (`raftka migrate
   finalize`) stops all of it; ZooKeeper is no longer written.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import trio
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from quorum.metadata.image import MetadataImage
from quorum.controller.elections import changes_for_leaving_brokers, changes_for_returning_broker
from quorum.metadata.records import (
    BrokerRegistrationChangeRecord,
    PartitionChangeRecord,
    Record,
    RegisterBrokerRecord,
    ZkMigrationState,
    ZkMigrationStateRecord,
)
from quorum.migration import zk_io
from quorum.migration.copy import (
    ZkClusterState,
    brokers_ready,
    migration_records,
    zk_admin_records,
    zk_config_records,
)
from quorum.migration.dual_write import DualWrites, partition_state, zk_broker_requests, zk_writes
from quorum.migration.znode import MigrationZnode
from quorum.node.controller_service import ControllerService
from quorum.node.driver import RaftNode
from quorum.zookeeper import store
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_metadata import incarnation_id, zk_state_to_image
from quorum.zookeeper.channel import ControllerChannelManager
from quorum.zookeeper.context import SetZNode, ZkTransaction
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition
from common.config import NodeConfig
from common.errors import ConfigError, RaftkaError
from common.security.client import ClientSecurity, inter_broker_client_security

_log = logging.getLogger("quorum.migration")

#: How often the driver looks at /brokers/ids and /isr_change_notification when nothing else happens.
POLL_S = 0.5
RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    zookeeper_connect: str
    zookeeper_session_timeout_ms: int = 18000
    #: brokers that must be registered before the copy (empty: any registered broker will do)
    expected_broker_ids: frozenset[int] = frozenset()
    #: where ZooKeeper-mode brokers take controller requests (raftka's serve them on CONTROL_PLANE)
    control_plane_listener_name: str = "CONTROL_PLANE"
    #: How to reach those brokers: TLS and SASL of `inter.broker.listener.name`, whose
    #: security their control plane applies (None: PLAINTEXT)
    broker_security: ClientSecurity | None = field(default=None, compare=False)

    @classmethod
    def from_node_config(cls, config: NodeConfig) -> MigrationConfig | None:
        """None unless `zookeeper.metadata.migration.enable=true`."""
        raw = config.raw
        if raw.get("zookeeper.metadata.migration.enable", "false").strip().lower() != "true":
            return None
        connect = raw.get("zookeeper.connect")
        if not connect:
            raise ConfigError("zookeeper.metadata.migration.enable=true needs zookeeper.connect=host:port,... "
                              "(the ZooKeeper ensemble of the cluster being migrated)")
        try:
            timeout_ms = int(raw.get("zookeeper.session.timeout.ms", "18000"))
            ids = frozenset(int(x) for x in raw.get("zookeeper.metadata.migration.broker.ids", "").split(",")
                            if x.strip())
        except ValueError as e:
            raise ConfigError(f"zookeeper.session.timeout.ms / zookeeper.metadata.migration.broker.ids: {e}; "
                              f"use an integer and a comma-separated list of broker ids") from None
        inter_broker = raw.get("inter.broker.listener.name", "PLAINTEXT").strip().upper()
        return cls(connect, timeout_ms, ids, raw.get("control.plane.listener.name", "CONTROL_PLANE"),
                   inter_broker_client_security(raw, inter_broker))


class MigrationDriver:
    """Leadership listener of one controller; see the module docstring."""

    def __init__(self, node: RaftNode, service: ControllerService, config: MigrationConfig) -> None:
        self.node = node
        self.service = service
        self.config = config
        self._epoch: int | None = None
        self._changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self.zk: KazooClient | None = None
        #: ids of topics the log removed: never taken back from ZooKeeper as new
        self._removed: set[uuid.UUID] = set()
        node.add_leadership_listener(self)

    # --- leadership (driver loop callbacks: quick) --------------------------------------------

    def on_leader_active(self, epoch: int, image: MetadataImage) -> None:
        self._epoch = epoch
        self._changed.set()

    def on_leader_lost(self, epoch: int) -> None:
        self._epoch = None
        if self._scope is not None:
            self._scope.cancel()

    # --- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.zk = KazooClient(self.config.zookeeper_connect, timeout=self.config.zookeeper_session_timeout_ms / 1000)
        await trio.to_thread.run_sync(self.zk.start, 30)
        try:
            task_status.started()
            while True:
                while self._epoch is None:
                    self._changed = trio.Event()
                    await self._changed.wait()
                epoch = self._epoch
                with trio.CancelScope() as self._scope:
                    if self._epoch == epoch:
                        try:
                            await self._lead(epoch)
                        except (RaftkaError, KazooException, OSError) as e:
                            _log.warning("migration step failed (%s); retrying", e)
                            await trio.sleep(RETRY_S)
                self._scope = None
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.zk.stop)
                await trio.to_thread.run_sync(self.zk.close)

    async def _zk(self, fn, *args):
        return await trio.to_thread.run_sync(fn, self.zk, *args)

    async def _lead(self, epoch: int) -> None:
        image = self.node.image
        if image.zk_migration_state == ZkMigrationState.POST_MIGRATION:
            _log.info("migration finalized: ZooKeeper is not written any more")
            await trio.sleep_forever()
        now_ms = int(trio.current_time() * 1000)
        zk_epoch, epoch_version = await self._zk(zk_io.claim_controller, self.node.node_id, epoch, now_ms)
        _log.info("KRaft controller %d claimed /controller (ZooKeeper controller epoch %d)", self.node.node_id,
                  zk_epoch)
        if image.zk_migration_state in (ZkMigrationState.NONE, ZkMigrationState.PRE_MIGRATION):
            state = await self._wait_for_brokers()
            appended = await self.service.propose_from_image(lambda working: self._copy(working, state))
            await self.node.wait_until_applied(appended.last_offset + 1)
            written = self.node.image
            versions = {tp: s.zk_version for tp, s in state.states.items()}
            _log.info("copied ZooKeeper metadata: %d brokers, %d topics, %d partitions (offsets %d-%d)",
                      len(state.brokers), len(state.topics), len(state.states), appended.base_offset,
                      appended.last_offset)
        else:
            state = await self._zk(zk_io.read_zk_state)
            written = zk_state_to_image(state.brokers, state.topics, state.states, state.topic_configs)
            versions = {tp: s.zk_version for tp, s in state.states.items()}
            _log.info("resuming dual write: reconciling ZooKeeper with the image at offset %d", self.node.image.offset)
        await self._dual_write(epoch, zk_epoch, epoch_version, written, versions)

    def _copy(self, working: MetadataImage, state: ZkClusterState) -> list[Record]:
        if working.zk_migration_state != ZkMigrationState.NONE or working.topics_by_id:
            raise RaftkaError(f"the metadata log is not empty ({working!r}, migration state "
                              f"{working.zk_migration_state}): migrate into a freshly formatted quorum")
        return migration_records(state)

    async def _wait_for_brokers(self) -> ZkClusterState:
        while True:
            state = await self._zk(zk_io.read_zk_state)
            ready, missing = brokers_ready(state, self.config.expected_broker_ids)
            if ready:
                return state
            _log.info("waiting for ZooKeeper-mode brokers %s to register before the copy", missing or "(any)")
            await trio.sleep(POLL_S)

    async def _dual_write(self, epoch: int, zk_epoch: int, epoch_version: int, written: MetadataImage,
                          versions: dict[NamedPartition, int]) -> None:
        async with trio.open_nursery() as nursery:
            channel = ControllerChannelManager(nursery, self.config.control_plane_listener_name,
                                               client_id=f"kraft-controller-{self.node.node_id}",
                                               security=self.config.broker_security)
            zk_brokers: dict[int, BrokerInfo] = {}
            sent: MetadataImage | None = None
            polled_s = -POLL_S
            recorded = False  # /migration names the offset ZooKeeper has
            in_zookeeper: set[uuid.UUID] = set()  # topics a ZooKeeper-mode broker created in ZooKeeper
            # /config/changes notifications before the claim are ZooKeeper-mode history, already copied
            changes_seen, _ = await self._zk(store.read_config_changes, None)
            refused: set[NamedPartition] = set()
            while True:
                image = self.node.image
                if image.zk_migration_state == ZkMigrationState.POST_MIGRATION:
                    _log.info("migration finalized at offset %d: dual write stops", image.offset)
                    channel.close()
                    await trio.sleep_forever()
                poll = trio.current_time() - polled_s >= POLL_S
                if poll:
                    polled_s = trio.current_time()
                    fresh = await self._zk(store.read_brokers)
                    if fresh != zk_brokers:
                        zk_brokers = fresh
                        channel.update_brokers(zk_brokers)
                        sent = None  # a new or restarted ZooKeeper-mode broker needs everything
                    self.service.keep_alive(b for b in zk_brokers if self._zk_era(image, b))
                    gone = [b for b, reg in image.brokers.items()
                            if not reg.fenced and self._zk_era(image, b) and b not in zk_brokers]
                    if gone:
                        await self._fence(gone)
                        continue
                    back = {b: info for b, info in zk_brokers.items()
                            if b not in image.brokers or (image.brokers[b].fenced and self._zk_era(image, b))}
                    if back:
                        await self._register(back)
                        continue
                if image is not written or not recorded:
                    self._removed.update(written.topics_by_id.keys() - image.topics_by_id.keys())
                    writes = zk_writes(written, image, versions, zk_epoch, frozenset(in_zookeeper))
                    if not writes.empty:
                        versions.update(await self._zk(zk_io.apply_dual_writes, epoch_version, writes, versions))
                    await self._zk(zk_io.write_migration, epoch_version,
                                   MigrationZnode(image.offset, image.epoch, self.node.node_id, epoch))
                    written, recorded = image, True
                for r in zk_broker_requests(sent, image, zk_brokers, self.node.node_id, zk_epoch,
                                            zk_versions=versions, force=refused):
                    if r.broker_id in zk_brokers:
                        channel.send(r.broker_id, r.request)
                sent, refused = image, set()
                if poll:
                    refused = await self._accept_zk_isr_changes(versions, zk_epoch, epoch_version)
                    await self._accept_zk_admin(in_zookeeper)
                    changes_seen = await self._accept_zk_configs(written, changes_seen)
                with trio.move_on_after(POLL_S):
                    await self.node.wait_for_change()

    async def _fence(self, gone: list[int]) -> None:
        """ZooKeeper-mode brokers whose `/brokers/ids` znode went away (stopped, or their session
        expired) are fenced at once, as a ZooKeeper controller reacts to the znode's deletion;
        their leaderships move (a broker's controlled shutdown in ZooKeeper mode waits for that)."""

        def records(working: MetadataImage) -> list[Record]:
            leaving = [b for b in gone if b in working.brokers and not working.brokers[b].fenced
                       and self._zk_era(working, b)]
            out: list[Record] = [BrokerRegistrationChangeRecord(broker_id=b, broker_epoch=working.brokers[b].epoch,
                                                                fenced=True) for b in leaving]
            return out + list(changes_for_leaving_brokers(working, leaving, self.service.config)) if leaving else []

        _log.info("ZooKeeper-mode brokers %s left /brokers/ids: fencing them", gone)
        appended = await self.service.propose_from_image(records)
        await self.node.wait_until_applied(appended.last_offset + 1)

    async def _register(self, brokers: dict[int, BrokerInfo]) -> None:
        """ZooKeeper-mode brokers that (re)appeared in `/brokers/ids` (restarted, or new) are registered
        unfenced, and offline partitions they host elect them, as a ZooKeeper controller handles a
        broker's start-up."""

        def records(working: MetadataImage) -> list[Record]:
            out: list[Record] = []
            for b, info in sorted(brokers.items()):
                reg = working.brokers.get(b)
                if reg is not None and not (reg.fenced and self._zk_era(working, b)):
                    continue
                out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=incarnation_id(b), endpoints=info.endpoints,
                                                rack=info.rack, fenced=False))
                if reg is not None:
                    out += changes_for_returning_broker(working, b, self.service.config)
            return out

        _log.info("ZooKeeper-mode brokers %s (re)registered in /brokers/ids: registering them", sorted(brokers))
        appended = await self.service.propose_from_image(records)
        await self.node.wait_until_applied(appended.last_offset + 1)

    @staticmethod
    def _zk_era(image: MetadataImage, broker_id: int) -> bool:
        reg = image.brokers.get(broker_id)
        return reg is not None and reg.incarnation_id == incarnation_id(broker_id)

    async def _accept_zk_admin(self, in_zookeeper: set[uuid.UUID]) -> None:
        """Topics a ZooKeeper-mode broker created or marked for deletion in ZooKeeper, into the log."""
        image = self.node.image
        names = await self._zk(store.read_topic_names)
        deleting = set(await self._zk(_children, z.DELETE_TOPICS_PATH))
        new = names - set(image.topic_ids_by_name)
        if not new and not deleting:
            return
        assignments = {n: a for n, a in (await self._zk(store.read_topic_assignments, new)).items()
                       if a.topic_id not in self._removed}  # a removal not yet dual-written is no creation
        configs = await self._zk(store.read_topic_configs, list(assignments))
        if assignments or deleting & set(image.topic_ids_by_name):
            _log.info("taking ZooKeeper-side admin into the log: created %s, deleted %s", sorted(assignments),
                      sorted(deleting))
            appended = await self.service.propose_from_image(
                lambda working: zk_admin_records(working, assignments, configs, deleting))
            in_zookeeper.update(a.topic_id for a in assignments.values())
            await self.node.wait_until_applied(appended.last_offset + 1)
        for name in deleting:
            if name not in self.node.image.topic_ids_by_name:
                await self._zk(_delete_quietly, f"{z.DELETE_TOPICS_PATH}/{name}")

    async def _accept_zk_configs(self, written: MetadataImage, seen: str | None) -> str | None:
        """Topic configs a ZooKeeper-mode broker changed (announced under `/config/changes`), into the log."""
        newest, topics = await self._zk(store.read_config_changes, seen)
        if topics:
            configs = await self._zk(store.read_topic_configs, topics)
            records = zk_config_records(written, configs)
            if records:
                _log.info("taking ZooKeeper-side config changes of %s into the log", sorted(topics))
                appended = await self.service.propose_from_image(
                    lambda working: [r for r in records if r.resource_name in working.topic_ids_by_name])
                await self.node.wait_until_applied(appended.last_offset + 1)
        return newest

    async def _accept_zk_isr_changes(self, versions: dict[NamedPartition, int], zk_epoch: int,
                                     epoch_version: int) -> set[NamedPartition]:
        """ISR changes a ZooKeeper-mode leader wrote to its state znodes, as PartitionChange records;
        the partitions whose change was refused (their leaders must hear the log's state again)."""
        names, partitions = await self._zk(store.read_isr_notifications)
        if not names:
            return set()
        states = await self._zk(store.read_partition_states, sorted(partitions))
        versions.update((tp, s.zk_version) for tp, s in states.items())

        def changes(working: MetadataImage) -> list[Record]:
            out: list[Record] = []
            for tp, s in sorted(states.items()):
                topic_id = working.topic_ids_by_name.get(tp.topic)
                p = None if topic_id is None else working.partition(topic_id, tp.partition)
                # Only the current leader's change of the current leader epoch (KIP-497's AlterPartition rule).
                if p is None or (s.leader, s.leader_epoch) != (p.leader, p.leader_epoch) or s.isr == p.isr:
                    continue
                if not set(s.isr) <= set(p.replicas) or p.leader not in s.isr:
                    continue
                if not all(b in p.isr or working.is_usable(b) for b in s.isr):
                    continue  # only unfenced brokers join an ISR (KIP-841)
                out.append(PartitionChangeRecord(topic_id=topic_id, partition=tp.partition, isr=s.isr))
            return out

        appended = await self.service.propose_from_image(changes)
        await self.node.wait_until_applied(appended.last_offset + 1)
        # A refused change (a fenced broker, a stale leader epoch) is already in ZooKeeper, and its
        # leader believes it: put the log's state back and tell the leader again (a ZooKeeper
        # controller's LeaderAndIsr after a state it does not accept).
        image = self.node.image
        refused: set[NamedPartition] = set()
        reverts = []
        for tp, s in sorted(states.items()):
            topic_id = image.topic_ids_by_name.get(tp.topic)
            p = None if topic_id is None else image.partition(topic_id, tp.partition)
            if p is not None and (s.leader, s.leader_epoch, s.isr) != (p.leader, p.leader_epoch, p.isr):
                refused.add(tp)
                reverts.append(ZkTransaction((SetZNode(z.partition_state_path(*tp), z.encode_partition_state(
                    partition_state(p, zk_epoch)), versions.get(tp, -1)),), tp))
        if reverts:
            _log.info("ZooKeeper-side ISR changes of %s refused: writing the log's state back", sorted(refused))
            versions.update(await self._zk(zk_io.apply_dual_writes, epoch_version, DualWrites(tuple(reverts)),
                                           versions))
        for name in names:
            await self._zk(_delete_quietly, f"{z.ISR_CHANGE_NOTIFICATION_PATH}/{name}")
        return refused


def _children(zk: KazooClient, path: str) -> list[str]:
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []


def _delete_quietly(zk: KazooClient, path: str) -> None:
    try:
        zk.delete(path)
    except NoNodeError:
        pass


class MigrationFinalizer:
    """Finalize (KIP-866): a controller restarted *without* `zookeeper.metadata.migration.enable`
    whose log is in MIGRATION appends ZkMigrationState(POST_MIGRATION) once it is active,
    provided no broker is still in ZooKeeper mode. From then on nothing writes to ZooKeeper."""

    def __init__(self, node: RaftNode, service: ControllerService) -> None:
        self.node = node
        self.service = service

    async def run(self) -> None:
        while True:
            if self.node.is_active and self.node.image.zk_migration_state == ZkMigrationState.MIGRATION:
                try:
                    await self.service.propose_from_image(self._finalize)
                except RaftkaError as e:
                    _log.warning("could not finalize the migration (%s); retrying", e)
                await trio.sleep(RETRY_S)
                continue
            await self.node.wait_for_change()

    @staticmethod
    def _finalize(working: MetadataImage) -> list[Record]:
        if working.zk_migration_state != ZkMigrationState.MIGRATION:
            return []
        zk_mode = sorted(b for b, reg in working.brokers.items()
                         if not reg.fenced and reg.incarnation_id == incarnation_id(b))
        if zk_mode:
            _log.warning("not finalizing the migration: brokers %s are still in ZooKeeper mode; restart them "
                         "in KRaft mode first", zk_mode)
            return []
        _log.info("finalizing the ZooKeeper migration: POST_MIGRATION")
        return [ZkMigrationStateRecord(ZkMigrationState.POST_MIGRATION)]
