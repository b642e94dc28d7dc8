"""The migration's ZooKeeper I/O (blocking kazoo calls; trio code runs them in a worker thread).

Theory of operation
-------------------
* `read_zk_state`: one pass over Kafka's znodes -- brokers, topics (a topic
  without an id gets one written, as Kafka's controller does), every
  partition state with its zkVersion, topic and broker configs -- with the
  reads pipelined (`store`'s readers).
* `claim_controller` (KIP-866): the KRaft controller takes `/controller` and
  bumps `/controller_epoch` in one multi conditional on the epoch's
  zkVersion, exactly as a ZooKeeper-mode controller wins an election; the
  `/controller` znode names the KRaft node and its Raft epoch
  (`kraftControllerEpoch`). As in Kafka, that `/controller` is persistent:
  brokers' ZooKeeper controllers see a controller and stay candidates even
  while the KRaft controller fails over; the next active KRaft controller
  replaces the znode with its own claim (and a higher epoch). A ZooKeeper
  controller still acting is fenced, because each of its writes checks
  the zkVersion it had, and it steps down when it sees `/controller` is
  no longer its own. Rollback deletes it (`release`).
* `apply_dual_writes`: the transactions fenced by the claimed zkVersion
  (`store.apply_transactions`), returning each written partition's new
  zkVersion; a state znode that moved under us (a ZooKeeper-mode leader's
  ISR write) is overwritten from the fresh zkVersion, because during the
  migration the metadata log is the truth. Config upserts are fenced the
  same way, each followed by its `/config/changes` notification.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from quorum.migration.copy import ZkClusterState
from quorum.migration.dual_write import DualWrites
from quorum.migration.znode import MIGRATION_PATH, MigrationZnode, decode_migration, encode_migration
from quorum.zookeeper import store
from quorum.zookeeper import znodes as z
from quorum.zookeeper.context import CreateZNode, SetZNode, ZkTransaction
from quorum.zookeeper.errors import ControllerMovedError
from quorum.zookeeper.znodes import NamedPartition

_log = logging.getLogger("quorum.migration.zk_io")

BROKER_CONFIGS_PATH = "/config/brokers"


def read_broker_configs(zk: KazooClient) -> dict[str, dict[str, str]]:
    try:
        entities = sorted(zk.get_children(BROKER_CONFIGS_PATH))
    except NoNodeError:
        return {}
    out = {}
    for entity in entities:
        path = f"{BROKER_CONFIGS_PATH}/{entity}"
        try:
            data, _ = zk.get(path)
        except NoNodeError:
            continue
        config = z.decode_entity_config(path, data)
        if config:
            out[entity] = config
    return out


def read_cluster_id(zk: KazooClient) -> str | None:
    try:
        data, _ = zk.get(z.CLUSTER_ID_PATH)
    except NoNodeError:
        return None
    return z.decode_cluster_id(data)


def read_next_producer_id(zk: KazooClient) -> int:
    try:
        data, _ = zk.get(z.PRODUCER_ID_BLOCK_PATH)
    except NoNodeError:
        return 0
    return z.decode_producer_id_block(data).block_end + 1 if data else 0


def read_zk_state(zk: KazooClient) -> ZkClusterState:
    """Everything `migration_records` copies, read now."""
    epoch, _ = store.read_controller_epoch(zk)
    brokers = store.read_brokers(zk)
    topics = store.read_topic_assignments(zk, store.read_topic_names(zk))
    states = store.read_partition_states(zk, [NamedPartition(t, p) for t, a in sorted(topics.items())
                                              for p in sorted(a.partitions)])
    return ZkClusterState(read_cluster_id(zk), epoch, brokers, topics, states,
                          store.read_topic_configs(zk, topics), read_broker_configs(zk), read_next_producer_id(zk))


def claim_controller(zk: KazooClient, kraft_controller_id: int, kraft_epoch: int, now_ms: int) -> tuple[int, int]:
    """Take `/controller` for the KRaft controller; (ZooKeeper controller epoch, its zkVersion).

    Raises ControllerMovedError if `/controller` or `/controller_epoch`
    changed while claiming (retry).
    """
    epoch, version = store.read_controller_epoch(zk)
    registration = z.ControllerRegistration(kraft_controller_id, now_ms, kraft_epoch)
    stat = zk.exists(z.CONTROLLER_PATH)
    t = zk.transaction()
    if stat is not None:
        # A ZooKeeper-mode controller's (it sees /controller change and steps
        # down; its writes are fenced by the epoch bump) or an earlier KRaft
        # controller's claim: replace it.
        t.delete(z.CONTROLLER_PATH, stat.version)
    t.create(z.CONTROLLER_PATH, z.encode_controller(registration))
    t.set_data(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(epoch + 1), version)
    results = t.commit()
    if any(isinstance(r, Exception) for r in results):
        raise ControllerMovedError(f"claiming /controller for KRaft controller {kraft_controller_id} lost a race "
                                   f"({[type(r).__name__ for r in results]}); retrying")
    return epoch + 1, results[-1].version


def read_migration(zk: KazooClient) -> MigrationZnode | None:
    try:
        data, _ = zk.get(MIGRATION_PATH)
    except NoNodeError:
        return None
    return decode_migration(data)


def write_migration(zk: KazooClient, epoch_zk_version: int, m: MigrationZnode) -> None:
    """Create or overwrite `/migration`, fenced by the claimed controller epoch."""
    data = encode_migration(m)
    exists = zk.exists(MIGRATION_PATH) is not None
    op = SetZNode(MIGRATION_PATH, data, -1) if exists else CreateZNode(MIGRATION_PATH, data)
    [outcome] = store.apply_transactions(zk, epoch_zk_version, [ZkTransaction((op,))])
    if not outcome.ok:
        raise ControllerMovedError(f"could not write {MIGRATION_PATH}; retrying")


def _upsert_config(zk: KazooClient, epoch_zk_version: int, path: str, config: Mapping[str, str],
                   entity_path: str) -> None:
    data = z.encode_entity_config(config)
    for create in (False, True):
        t = zk.transaction()
        t.check(z.CONTROLLER_EPOCH_PATH, epoch_zk_version)
        if create:
            zk.ensure_path(path.rsplit("/", 1)[0])
            t.create(path, data)
        else:
            t.set_data(path, data)
        results = t.commit()
        if results and isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise ControllerMovedError("/controller_epoch moved: another controller was elected")
        if not any(isinstance(r, Exception) for r in results):
            break
        if not isinstance(results[-1], (NoNodeError, NodeExistsError)):
            _log.warning("config write to %s failed: %s", path, results)
            return
    zk.create(f"{z.CONFIG_CHANGES_PATH}/{z.CONFIG_CHANGE_PREFIX}", z.encode_config_change(entity_path),
              sequence=True, makepath=True)


def apply_dual_writes(zk: KazooClient, epoch_zk_version: int, writes: DualWrites,
                      zk_versions: Mapping[NamedPartition, int]) -> dict[NamedPartition, int]:
    """Apply `writes`; the new zkVersion of every partition state written (ControllerMovedError if fenced)."""
    versions: dict[NamedPartition, int] = {}
    pending = list(writes.transactions)
    for attempt in range(3):
        retry = []
        for outcome in store.apply_transactions(zk, epoch_zk_version, pending):
            t = outcome.transaction
            if outcome.ok:
                if t.partition is not None:
                    op = t.ops[-1]
                    versions[t.partition] = op.version + 1 if isinstance(op, SetZNode) else 0
                else:
                    for op in t.ops:
                        if isinstance(op, CreateZNode) and op.path.endswith("/state"):
                            parts = op.path.split("/")
                            versions[NamedPartition(parts[3], int(parts[5]))] = 0
            elif t.partition is not None and outcome.fresh is not None:
                # The state znode moved under us: the log is the truth, overwrite from its new zkVersion.
                op = t.ops[-1]
                retry.append(ZkTransaction((SetZNode(op.path, op.data, outcome.fresh.zk_version),), t.partition))
            elif t.partition is not None:
                op = t.ops[-1]
                retry.append(ZkTransaction((CreateZNode(op.path, op.data, make_parents=True),), t.partition))
            else:
                _log.warning("dual write %s failed", t)
        if not retry:
            break
        pending = retry
    else:
        _log.warning("dual writes of %d partitions kept losing races; the next change rewrites them", len(pending))
    for path, config, entity_path in writes.configs:
        _upsert_config(zk, epoch_zk_version, path, config, entity_path)
    return versions


def zk_versions_of(zk: KazooClient, partitions) -> dict[NamedPartition, int]:
    return {tp: s.zk_version for tp, s in store.read_partition_states(zk, partitions).items()}


def release(zk: KazooClient) -> None:
    """Rollback's ZooKeeper side: delete `/migration` and a KRaft controller's `/controller`,
    so a ZooKeeper-mode broker can be elected controller again."""
    try:
        data, stat = zk.get(z.CONTROLLER_PATH)
        if z.decode_controller(data).kraft_controller_epoch >= 0:
            zk.delete(z.CONTROLLER_PATH, version=stat.version)
    except (NoNodeError, BadVersionError):
        pass
    try:
        zk.delete(MIGRATION_PATH)
    except NoNodeError:
        pass
