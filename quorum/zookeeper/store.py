"""The controller's ZooKeeper I/O: election, the state load, fenced writes (blocking kazoo calls).

Theory of operation
-------------------
Everything here blocks on ZooKeeper and runs in a worker thread
(`trio.to_thread.run_sync`) of the controller shell.

* **Election** (Kafka's `registerControllerAndIncrementControllerEpoch`):
  read `/controller_epoch` (creating it as "0"), then in one `multi` create
  the ephemeral `/controller` and set `/controller_epoch` to epoch + 1
  conditional on the zkVersion just read. Either both happen or neither: a
  controller always owns a unique, larger epoch, and the new zkVersion of
  `/controller_epoch` is what every later write of this controller checks.
* **Load** on election: brokers, topics, every partition state, pending
  deletions and ISR notifications. Reads are pipelined (all `get_async`
  calls issued, then collected), as Kafka's controller does with its async
  ZooKeeper client. This is the honest cost of a ZooKeeper-mode failover:
  one round of reads per znode, growing with the number of partitions.
* **Fenced writes**: each `ZkTransaction` becomes a `multi` of
  `check(/controller_epoch, epoch_zk_version)` plus its ops; all are
  pipelined. A failed check means a newer controller exists:
  `ControllerMovedError`. A partition-state op that loses (BadVersion,
  NodeExists) is reported with the fresh state. A deletion that trips over
  a missing or non-empty znode is redone op by op (still fenced), recursively.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)

from quorum.zookeeper import znodes as z
from quorum.zookeeper.context import (
    ClusterSnapshot,
    CreateZNode,
    DeleteZNode,
    SetZNode,
    WriteOutcome,
    ZkTransaction,
)
from quorum.zookeeper.errors import ControllerMovedError
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState, TopicAssignment

_log = logging.getLogger("quorum.zookeeper.store")

Watch = Callable[[object], None] | None


# --- election ---------------------------------------------------------------------------


def read_controller_epoch(zk: KazooClient) -> tuple[int, int]:
    """(epoch, zkVersion) of `/controller_epoch`, creating it as 0 if missing."""
    try:
        data, stat = zk.get(z.CONTROLLER_EPOCH_PATH)
        return z.decode_controller_epoch(data), stat.version
    except NoNodeError:
        try:
            zk.create(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(0))
            return 0, 0
        except NodeExistsError:
            data, stat = zk.get(z.CONTROLLER_EPOCH_PATH)
            return z.decode_controller_epoch(data), stat.version


def active_controller(zk: KazooClient, watch: Watch = None) -> int | None:
    """The broker id in `/controller`, or None; `watch` fires when it is created, changed or deleted."""
    stat = zk.exists(z.CONTROLLER_PATH, watch=watch)
    if stat is None:
        return None
    try:
        data, _ = zk.get(z.CONTROLLER_PATH)
    except NoNodeError:
        return None
    return z.decode_controller(data).broker_id


def try_become_controller(zk: KazooClient, broker_id: int, now_ms: int) -> tuple[int, int] | None:
    """Create `/controller` and bump `/controller_epoch` atomically.

    (epoch, epoch zkVersion) if this broker won, None if another holds `/controller`.
    """
    epoch, version = read_controller_epoch(zk)
    t = zk.transaction()
    t.create(z.CONTROLLER_PATH, z.encode_controller(z.ControllerRegistration(broker_id, now_ms)), ephemeral=True)
    t.set_data(z.CONTROLLER_EPOCH_PATH, z.encode_controller_epoch(epoch + 1), version)
    results = t.commit()
    if not any(isinstance(r, Exception) for r in results):
        return epoch + 1, results[1].version
    # Lost, or won in an attempt whose answer was lost: ours if /controller is
    # our session's and the epoch is the one we wrote.
    try:
        data, stat = zk.get(z.CONTROLLER_PATH)
        epoch_now, version_now = read_controller_epoch(zk)
    except NoNodeError:
        return None
    if (stat.ephemeralOwner == zk.client_id[0] and z.decode_controller(data).broker_id == broker_id
            and epoch_now == epoch + 1):
        return epoch_now, version_now
    return None


def controller_znode_is_ours(zk: KazooClient, broker_id: int, watch: Watch = None) -> bool:
    """Whether `/controller` still belongs to this session (re-arming `watch`)."""
    stat = zk.exists(z.CONTROLLER_PATH, watch=watch)
    return stat is not None and stat.ephemeralOwner == zk.client_id[0]


def resign(zk: KazooClient) -> None:
    """Delete `/controller` if this session holds it (a clean step-down)."""
    stat = zk.exists(z.CONTROLLER_PATH)
    if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
        try:
            zk.delete(z.CONTROLLER_PATH, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass


# --- reads -----------------------------------------------------------------------------------


def _gather(calls: Sequence) -> list:
    """Results of pipelined async calls; a missing znode reads as None."""
    out = []
    for call in calls:
        try:
            out.append(call.get())
        except NoNodeError:
            out.append(None)
    return out


def read_brokers(zk: KazooClient, watch: Watch = None) -> dict[int, BrokerInfo]:
    """Every registered broker (its czxid as broker epoch); `watch` fires on membership changes."""
    ids = sorted(int(c) for c in zk.get_children(z.BROKER_IDS_PATH, watch=watch) if c.isdigit())
    out = {}
    for b, found in zip(ids, _gather([zk.get_async(z.broker_path(b)) for b in ids])):
        if found is not None:
            data, stat = found
            out[b] = z.decode_broker_info(b, data, stat.czxid)
    return out


def read_topic_names(zk: KazooClient, watch: Watch = None) -> set[str]:
    return {t for t in zk.get_children(z.TOPICS_PATH, watch=watch) if z.is_legal_topic_name(t)}


def read_topic_assignments(zk: KazooClient, names: Iterable[str]) -> dict[str, TopicAssignment]:
    """Assignments of `names`; a topic without a topic id gets one written (as Kafka's controller does)."""
    names = sorted(names)
    out = {}
    for name, found in zip(names, _gather([zk.get_async(z.topic_path(n)) for n in names])):
        if found is None:
            continue
        data, stat = found
        a = z.decode_topic_assignment(name, data)
        if a.topic_id is None:
            a = TopicAssignment(a.partitions, uuid.uuid4(), a.adding_replicas, a.removing_replicas)
            try:
                zk.set(z.topic_path(name), z.encode_topic_assignment(a), version=stat.version)
            except BadVersionError:
                data, _ = zk.get(z.topic_path(name))
                a = z.decode_topic_assignment(name, data)
                if a.topic_id is None:
                    continue  # someone keeps rewriting it; the next topics event retries
        out[name] = a
    return out


def watch_topics(zk: KazooClient, names: Iterable[str], watch: Watch) -> None:
    """Arm a data watch on each `/brokers/topics/<t>` (partitions added to it)."""
    _gather([zk.exists_async(z.topic_path(n), watch=watch) for n in sorted(names)])


def read_partition_states(zk: KazooClient, tps: Iterable[NamedPartition]) -> dict[NamedPartition, PartitionState]:
    tps = list(tps)
    out = {}
    for tp, found in zip(tps, _gather([zk.get_async(z.partition_state_path(*tp)) for tp in tps])):
        if found is not None:
            data, stat = found
            out[tp] = z.decode_partition_state(tp.topic, tp.partition, data, stat.version)
    return out


def read_isr_notifications(zk: KazooClient, watch: Watch = None) -> tuple[tuple[str, ...], set[NamedPartition]]:
    """Pending ISR-change notifications and the partitions they name."""
    names = tuple(sorted(c for c in zk.get_children(z.ISR_CHANGE_NOTIFICATION_PATH, watch=watch)
                         if c.startswith(z.ISR_CHANGE_PREFIX)))
    partitions: set[NamedPartition] = set()
    paths = [f"{z.ISR_CHANGE_NOTIFICATION_PATH}/{n}" for n in names]
    for found in _gather([zk.get_async(p) for p in paths]):
        if found is not None:
            partitions.update(z.decode_isr_change_notification(found[0]))
    return names, partitions


def read_topic_configs(zk: KazooClient, names: Iterable[str]) -> dict[str, dict[str, str]]:
    names = sorted(names)
    calls = [zk.get_async(z.topic_config_path(n)) for n in names]
    return {n: ({} if found is None else z.decode_entity_config(z.topic_config_path(n), found[0]))
            for n, found in zip(names, _gather(calls))}


def read_config_changes(zk: KazooClient, after: str | None, watch: Watch = None) -> tuple[str | None, set[str]]:
    """(newest notification name, topics whose config changed after notification `after`)."""
    names = sorted(c for c in zk.get_children(z.CONFIG_CHANGES_PATH, watch=watch)
                   if c.startswith(z.CONFIG_CHANGE_PREFIX))
    fresh = [n for n in names if after is None or n > after]
    topics = set()
    for found in _gather([zk.get_async(f"{z.CONFIG_CHANGES_PATH}/{n}") for n in fresh]):
        if found is not None:
            entity = z.decode_config_change(found[0])
            kind, _, name = entity.partition("/")
            if kind == "topics" and z.is_legal_topic_name(name):
                topics.add(name)
    return (names[-1] if names else after), topics


def load_snapshot(zk: KazooClient, epoch: int, epoch_zk_version: int,
                  watches: dict[str, Watch]) -> ClusterSnapshot:
    """Everything the controller needs after winning, arming `watches` (keyed by
    "brokers", "topics", "delete_topics", "isr_change") as it reads."""
    brokers = read_brokers(zk, watches.get("brokers"))
    topics = read_topic_assignments(zk, read_topic_names(zk, watches.get("topics")))
    tps = [NamedPartition(t, p) for t, a in sorted(topics.items()) for p in sorted(a.partitions)]
    states = read_partition_states(zk, tps)
    deleting = frozenset(zk.get_children(z.DELETE_TOPICS_PATH, watch=watches.get("delete_topics")))
    notifications, _ = read_isr_notifications(zk, watches.get("isr_change"))
    return ClusterSnapshot(epoch, epoch_zk_version, brokers, topics, states, deleting, notifications)


def ensure_paths(zk: KazooClient, paths: Iterable[str] = z.PERSISTENT_PATHS) -> None:
    for path in paths:
        zk.ensure_path(path)


# --- fenced writes ------------------------------------------------------------------------------


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _make_parents(zk: KazooClient, transactions: Sequence[ZkTransaction]) -> None:
    """Create missing empty parents of every CreateZNode, shallowest first, pipelined per depth."""
    wanted = {p for t in transactions for op in t.ops if isinstance(op, CreateZNode) and op.make_parents
              for p in _parents(op.path)}
    for depth in sorted({p.count("/") for p in wanted}):
        level = sorted(p for p in wanted if p.count("/") == depth)
        for call in [zk.create_async(p, b"") for p in level]:
            try:
                call.get()
            except NodeExistsError:
                pass


def _fenced(zk: KazooClient, epoch_zk_version: int, ops: Iterable) -> object:
    t = zk.transaction()
    t.check(z.CONTROLLER_EPOCH_PATH, epoch_zk_version)
    for op in ops:
        if isinstance(op, CreateZNode):
            t.create(op.path, op.data)
        elif isinstance(op, SetZNode):
            t.set_data(op.path, op.data, op.version)
        else:
            t.delete(op.path)
    return t.commit_async()


def _check_fence(results: list, epoch_zk_version: int) -> None:
    if results and isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
        raise ControllerMovedError(
            f"/controller_epoch is no longer at zkVersion {epoch_zk_version} ({type(results[0]).__name__}): "
            f"a newer controller was elected; resigning")


def _delete_one_by_one(zk: KazooClient, epoch_zk_version: int, ops: Sequence[DeleteZNode]) -> None:
    for op in ops:
        results = _fenced(zk, epoch_zk_version, [op]).get()
        _check_fence(results, epoch_zk_version)
        if isinstance(results[-1], NotEmptyError):
            for child in zk.get_children(op.path):
                _delete_one_by_one(zk, epoch_zk_version, [DeleteZNode(f"{op.path}/{child}")])
            _delete_one_by_one(zk, epoch_zk_version, [op])


def apply_transactions(zk: KazooClient, epoch_zk_version: int,
                       transactions: Sequence[ZkTransaction]) -> list[WriteOutcome]:
    """Apply the core's writes, pipelined; raise ControllerMovedError if fenced off."""
    _make_parents(zk, transactions)
    calls = [_fenced(zk, epoch_zk_version, t.ops) for t in transactions]
    outcomes = []
    for t, call in zip(transactions, calls):
        results = call.get()
        _check_fence(results, epoch_zk_version)
        if not any(isinstance(r, Exception) for r in results):
            outcomes.append(WriteOutcome(t, ok=True))
        elif t.partition is not None:
            fresh = read_partition_states(zk, [t.partition]).get(t.partition)
            outcomes.append(WriteOutcome(t, ok=False, fresh=fresh))
        elif all(isinstance(op, DeleteZNode) for op in t.ops):
            _delete_one_by_one(zk, epoch_zk_version, t.ops)
            outcomes.append(WriteOutcome(t, ok=True))
        else:
            _log.warning("controller write %s failed: %s", t, results)
            outcomes.append(WriteOutcome(t, ok=False))
    return outcomes
