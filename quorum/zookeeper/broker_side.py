"""What a broker itself writes to ZooKeeper: its registration and its leaders' ISR changes.

Theory of operation
-------------------
**Registration.** A broker announces itself with the ephemeral
`/brokers/ids/<id>` (Kafka's JSON, version 5). It lives exactly as long as
the broker's ZooKeeper session: when the session expires (the broker died,
or was cut off for `zookeeper.session.timeout.ms`), ZooKeeper deletes it
and the controller's watch on `/brokers/ids` fires. The broker epoch is the
znode's czxid, so a broker that re-registers after losing its session has
a larger epoch and the controller's requests to its old life are refused.
`ZkBrokerRegistration` re-registers on every new session.

**ISR changes** (the pre-KIP-497 design, which ZooKeeper mode keeps): the
partition leader writes the new ISR straight to the partition's state
znode, conditional on the zkVersion it last saw (from its latest
LeaderAndIsr, or its own last write), keeping the leader and leader epoch.
A BadVersion means the controller (or a newer leader) changed the state
since: the leader drops its change and waits for the controller's
LeaderAndIsr (`StaleZNodeVersionError`). After a successful write the
leader creates a sequential `/isr_change_notification/isr_change_` listing
the partitions, so the controller can tell every broker (it batches them,
as Kafka's `ReplicaManager.maybePropagateIsrChanges` does every few seconds).

All functions block; trio code calls them through `trio.to_thread`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from quorum.zookeeper import znodes as z
from quorum.zookeeper.errors import StaleZNodeVersionError, ZooKeeperModeError
from quorum.zookeeper.znodes import BrokerInfo, NamedPartition, PartitionState

_log = logging.getLogger("quorum.zookeeper.broker_side")


class BrokerIdInUseError(ZooKeeperModeError):
    """Another live broker holds this broker id in `/brokers/ids`.

    Give each broker a unique `broker.id`, or wait for the old process's
    ZooKeeper session to expire (`zookeeper.session.timeout.ms`).
    """


def ensure_cluster_paths(zk: KazooClient) -> None:
    """Create the persistent paths every broker expects (Kafka's `ZkData.PersistentZkPaths`)."""
    for path in z.PERSISTENT_PATHS:
        zk.ensure_path(path)


def get_or_create_cluster_id(zk: KazooClient, proposed: str | None = None) -> str:
    """The cluster id in `/cluster/id`, creating it (a fresh Kafka Uuid, or `proposed`) if missing."""
    try:
        return z.decode_cluster_id(zk.get(z.CLUSTER_ID_PATH)[0])
    except NoNodeError:
        cluster_id = proposed or z.kafka_uuid_str(uuid.uuid4())
        try:
            zk.create(z.CLUSTER_ID_PATH, z.encode_cluster_id(cluster_id), makepath=True)
            return cluster_id
        except NodeExistsError:
            return z.decode_cluster_id(zk.get(z.CLUSTER_ID_PATH)[0])


def register_broker(zk: KazooClient, info: BrokerInfo) -> int:
    """Create `/brokers/ids/<id>` for this session; return the broker epoch (its czxid).

    Idempotent within a session; BrokerIdInUseError if another session holds the id.
    """
    path = z.broker_path(info.broker_id)
    data = z.encode_broker_info(info)
    try:
        zk.create(path, data, ephemeral=True, makepath=True)
    except NodeExistsError:
        pass
    stat = zk.exists(path)
    if stat is None:
        return register_broker(zk, info)
    if stat.ephemeralOwner != zk.client_id[0]:
        raise BrokerIdInUseError(f"broker id {info.broker_id} is registered by another ZooKeeper session "
                                 f"(0x{stat.ephemeralOwner:x}); is another broker running with this id?")
    return stat.czxid


class ZkBrokerRegistration:
    """Keeps `/brokers/ids/<id>` registered across ZooKeeper sessions.

    `start()` registers now (raising if the id is taken) and re-registers
    whenever kazoo reconnects with a new session; `on_epoch(epoch)` is
    called each time with the new broker epoch.
    """

    def __init__(self, zk: KazooClient, info: BrokerInfo, on_epoch: Callable[[int], None] | None = None) -> None:
        self.zk = zk
        self.info = info
        self.on_epoch = on_epoch
        self.broker_epoch = -1
        self._session_lost = False
        self._lock = threading.Lock()

    def start(self) -> int:
        self.zk.add_listener(self._listener)
        try:
            return self._register()
        except BaseException:
            self.zk.remove_listener(self._listener)  # so that start() may be tried again
            raise

    def stop(self, *, deregister: bool = True) -> None:
        """Stop re-registering; with `deregister`, delete the znode now (a clean shutdown),
        so the controller moves leadership at once instead of after the session timeout."""
        self.zk.remove_listener(self._listener)
        if deregister:
            stat = self.zk.exists(z.broker_path(self.info.broker_id))
            if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                try:
                    self.zk.delete(z.broker_path(self.info.broker_id))
                except NoNodeError:
                    pass

    def _register(self) -> int:
        with self._lock:
            info = BrokerInfo(self.info.broker_id, self.info.endpoints, self.info.rack, self.info.jmx_port,
                              int(time.time() * 1000), self.info.features)
            self.broker_epoch = register_broker(self.zk, info)
        _log.info("broker %d registered in ZooKeeper with epoch %d", info.broker_id, self.broker_epoch)
        if self.on_epoch:
            self.on_epoch(self.broker_epoch)
        return self.broker_epoch

    def _listener(self, state: str) -> None:
        # kazoo's thread; no blocking calls here.
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self.zk.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            self._register()
        except Exception:
            _log.exception("broker %d could not re-register in ZooKeeper", self.info.broker_id)


def write_isr_change(zk: KazooClient, tp: NamedPartition, current: PartitionState, new_isr: Iterable[int]) -> PartitionState:
    """As leader of `tp`, replace its ISR in ZooKeeper, conditional on `current.zk_version`.

    Returns the state written (with its new zkVersion). StaleZNodeVersionError
    if the state changed since `current` was read: wait for LeaderAndIsr.
    """
    new_isr = tuple(new_isr)
    assert current.leader in new_isr, f"the leader {current.leader} must stay in the ISR {new_isr}"
    state = PartitionState(current.leader, current.leader_epoch, new_isr, current.controller_epoch,
                           current.zk_version, current.leader_recovery_state)
    try:
        stat = zk.set(z.partition_state_path(*tp), z.encode_partition_state(state), version=current.zk_version)
    except (BadVersionError, NoNodeError):
        raise StaleZNodeVersionError(
            f"the state of {tp.topic}-{tp.partition} is no longer at zkVersion {current.zk_version}: the "
            f"controller changed it; the leader keeps its ISR until the next LeaderAndIsr") from None
    return PartitionState(state.leader, state.leader_epoch, state.isr, state.controller_epoch, stat.version,
                          state.leader_recovery_state)


def notify_isr_changes(zk: KazooClient, partitions: Iterable[NamedPartition]) -> str:
    """Tell the controller these partitions' ISRs changed; returns the notification's path."""
    return zk.create(f"{z.ISR_CHANGE_NOTIFICATION_PATH}/{z.ISR_CHANGE_PREFIX}",
                     z.encode_isr_change_notification(partitions), sequence=True, makepath=True)
