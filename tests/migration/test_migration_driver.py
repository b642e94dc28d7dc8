"""The active controller migrates a ZooKeeper-mode cluster: a one-voter quorum
in this trio run (real Raft node, real metadata log files) with its
`MigrationDriver`, against a real ZooKeeper."""

import random

import trio
from kazoo.client import KazooClient
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig
from quorum.metadata.records import ZkMigrationState, ZkMigrationStateRecord
from quorum.migration import MigrationConfig, MigrationDriver
from quorum.migration.zk_io import read_migration, read_zk_state
from quorum.node.controller_service import ControllerService
from quorum.node.driver import RaftNode
from quorum.node.workload import create_topics_request
from quorum.raft import QuorumConfig
from quorum.zookeeper import admin
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_side import notify_isr_changes, register_broker, write_isr_change
from quorum.zookeeper.znodes import NamedPartition
from common.wire.ports import free_ports

from migration_testing import broker_info, zk_cluster

FAST = QuorumConfig(controller_quorum_election_timeout_ms=150, controller_quorum_fetch_timeout_ms=2000,
                    controller_quorum_election_backoff_max_ms=150, controller_quorum_request_timeout_ms=1000,
                    controller_quorum_retry_backoff_ms=10, fetch_max_wait_ms=200)
SESSION_TIMEOUT_MS = 1500


async def start_controller(nursery, tmp_path, zk_connect, expected=frozenset({1, 2, 3})):
    [port] = free_ports(1)
    node = RaftNode(node_id=1, voters={1: ("127.0.0.1", port)}, log_dir=str(tmp_path / "controller-1"),
                    cluster_id="migration-test", config=FAST, rng=random.Random(1))
    await nursery.start(node.run)
    service = ControllerService(node, ControllerConfig(cluster_id="migration-test",
                                                       broker_session_timeout_ms=SESSION_TIMEOUT_MS,
                                                       default_replication_factor=2), random.Random(1))
    await nursery.start(service.run)
    driver = MigrationDriver(node, service, MigrationConfig(zk_connect, 4000, expected))
    await nursery.start(driver.run)
    return node, service


async def until(predicate, timeout_s=15.0, what="condition"):
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


async def in_thread(fn, *args):
    return await trio.to_thread.run_sync(fn, *args)


async def test_copy_then_dual_write_then_zookeeper_brokers_stay_alive(tmp_path, zk_connect, nursery):
    # The ZooKeeper-mode cluster; this session holds brokers 1-3's registrations.
    zk = KazooClient(zk_connect, timeout=2.0)
    await in_thread(zk.start, 10)
    written = await in_thread(zk_cluster, zk)
    node, service = await start_controller(nursery, tmp_path, zk_connect)

    await until(lambda: node.image.zk_migration_state == ZkMigrationState.MIGRATION, what="the copy")
    image = node.image
    assert dict(image.topic_ids_by_name) == {"orders": written["orders"].topic_id, "logs": written["logs"].topic_id}
    assert image.topic("orders").partitions[0].leader_epoch == 7
    held = z.decode_controller((await in_thread(zk.get, z.CONTROLLER_PATH))[0])
    assert held.broker_id == 1 and held.kraft_controller_epoch >= 0, "the KRaft controller holds /controller"
    assert (await in_thread(read_zk_state, zk)).controller_epoch == 5, "the ZooKeeper controller epoch was bumped"

    # A topic created through the quorum appears in ZooKeeper (dual write), with the same id.
    answer = await service.handle(create_topics_request(["payments"], partitions=2))
    assert answer.topics[0].error_code == ErrorCode.none
    payments_id = node.image.topic_ids_by_name["payments"]

    def in_zk():
        state = read_zk_state(zk)
        a = state.topics.get("payments")
        return a is not None and a.topic_id == payments_id and len(
            [tp for tp in state.states if tp.topic == "payments"]) == 2

    await until(lambda: in_zk(), what="payments in ZooKeeper")
    migration = await in_thread(read_migration, zk)
    assert migration is not None and migration.kraft_controller_id == 1

    # A ZooKeeper-mode broker takes CreateTopics/DeleteTopics by writing znodes; the KRaft
    # controller, holding /controller, does the ZooKeeper controller's part for them.
    created = await in_thread(admin.create_topic, zk, "zkside", {0: (1, 2)}, {"retention.ms": "5000"})
    await in_thread(admin.delete_topic, zk, "logs")
    await until(lambda: "zkside" in node.image.topic_ids_by_name and "logs" not in node.image.topic_ids_by_name,
                what="ZooKeeper-side admin in the log")
    assert node.image.topic_ids_by_name["zkside"] == created.topic_id
    assert node.image.topic("zkside").partitions[0].leader == 1
    assert dict(node.image.topic_config("zkside")) == {"retention.ms": "5000"}

    def zk_admin_done():
        state = read_zk_state(zk)
        return (NamedPartition("zkside", 0) in state.states and "logs" not in state.topics
                and not zk.get_children(z.DELETE_TOPICS_PATH))

    await until(zk_admin_done, what="partition state written and deletion done in ZooKeeper")
    await in_thread(admin.set_topic_config, zk, "orders", {"retention.ms": "7000"})
    await until(lambda: dict(node.image.topic_config("orders")) == {"retention.ms": "7000"},
                what="a ZooKeeper-side topic config change in the log")

    # Brokers alive in ZooKeeper stay unfenced past the session timeout: their znode is their heartbeat.
    await trio.sleep(2 * SESSION_TIMEOUT_MS / 1000)
    assert all(not node.image.brokers[b].fenced for b in (1, 2, 3))

    # A ZooKeeper-mode leader's ISR change (conditional on the zkVersion it was sent) becomes a
    # PartitionChange in the log.
    tp = NamedPartition("orders", 0)
    current = (await in_thread(read_zk_state, zk)).states[tp]
    await in_thread(write_isr_change, zk, tp, current, (1,))
    await in_thread(notify_isr_changes, zk, [tp])
    orders = node.image.topic_ids_by_name["orders"]
    await until(lambda: node.image.partition(orders, 0).isr == (1,), what="the ZooKeeper-side ISR change in the log")

    # A broker that leaves ZooKeeper (stopped for its KRaft restart) is fenced at once, well within
    # the session timeout, and its leadership moves; ZooKeeper hears of the new leaders too.
    await in_thread(zk.delete, z.broker_path(3))
    await until(lambda: node.image.brokers[3].fenced, timeout_s=SESSION_TIMEOUT_MS / 1000 - 0.3,
                what="broker 3 fenced")
    await until(lambda: node.image.partition(orders, 2).leader == 1, what="orders-2 led by 1")
    assert node.image.partition(orders, 1).leader == -1, "orders-1's only in-sync replica was 3: offline"

    def zk_leader_moved():
        states = read_zk_state(zk).states
        return states[NamedPartition("orders", 2)].leader == 1 and states[NamedPartition("orders", 1)].leader == -1

    await until(zk_leader_moved, what="the new leader in ZooKeeper")

    # A ZooKeeper-mode leader that adds the fenced broker to an ISR wrote it before anyone could refuse:
    # the log refuses it (KIP-841) and ZooKeeper gets the log's state back.
    tp2 = NamedPartition("orders", 2)
    current = (await in_thread(read_zk_state, zk)).states[tp2]
    assert current.isr == (1,)
    await in_thread(write_isr_change, zk, tp2, current, (1, 3))
    await in_thread(notify_isr_changes, zk, [tp2])

    def reverted():
        return (not zk.get_children(z.ISR_CHANGE_NOTIFICATION_PATH)
                and read_zk_state(zk).states[tp2].isr == (1,))

    await until(reverted, what="the refused ISR change reverted in ZooKeeper")
    assert node.image.partition(orders, 2).isr == (1,)

    # The broker comes back in ZooKeeper mode: registered unfenced, it leads its offline partition again.
    await in_thread(register_broker, zk, broker_info(3))
    await until(lambda: not node.image.brokers[3].fenced and node.image.partition(orders, 1).leader == 3,
                what="broker 3 back and leading orders-1")
    await in_thread(zk.stop)
    await in_thread(zk.close)


async def test_finalize_stops_dual_write(tmp_path, zk_connect, nursery):
    zk = KazooClient(zk_connect, timeout=2.0)
    await in_thread(zk.start, 10)
    await in_thread(zk_cluster, zk)
    node, service = await start_controller(nursery, tmp_path, zk_connect)
    await until(lambda: node.image.zk_migration_state == ZkMigrationState.MIGRATION, what="the copy")
    await service.propose_from_image(lambda working: [ZkMigrationStateRecord(ZkMigrationState.POST_MIGRATION)])
    await trio.sleep(1.0)  # the driver sees POST_MIGRATION
    answer = await service.handle(create_topics_request(["after-finalize"]))
    assert answer.topics[0].error_code == ErrorCode.none
    await trio.sleep(1.5)
    assert "after-finalize" not in (await in_thread(read_zk_state, zk)).topics, "ZooKeeper is no longer written"
    await in_thread(zk.stop)
    await in_thread(zk.close)


async def test_a_controller_restarted_mid_migration_reconciles_zookeeper(tmp_path, zk_connect, nursery):
    zk = KazooClient(zk_connect, timeout=2.0)
    await in_thread(zk.start, 10)
    await in_thread(zk_cluster, zk)
    with trio.CancelScope() as first:
        async with trio.open_nursery() as inner:
            node, service = await start_controller(inner, tmp_path, zk_connect)
            await until(lambda: node.image.zk_migration_state == ZkMigrationState.MIGRATION, what="the copy")
            answer = await service.handle(create_topics_request(["payments"], partitions=2))
            assert answer.topics[0].error_code == ErrorCode.none
            first.cancel()  # the controller dies; maybe before its dual write of "payments"
    # Meanwhile ZooKeeper drifts: a stale state from before (as a fenced ZooKeeper controller left it).
    state = await in_thread(read_zk_state, zk)
    tp = NamedPartition("orders", 2)
    await in_thread(zk.set, z.partition_state_path(*tp), z.encode_partition_state(
        z.PartitionState(1, 99, (1,), 1)))
    node, service = await start_controller(nursery, tmp_path, zk_connect)
    await until(lambda: node.is_active, what="the restarted controller active")
    assert node.image.zk_migration_state == ZkMigrationState.MIGRATION

    def reconciled():
        s = read_zk_state(zk)
        p = node.image.partition(node.image.topic_ids_by_name["orders"], 2)
        return ("payments" in s.topics and s.topics["payments"].topic_id == node.image.topic_ids_by_name["payments"]
                and (s.states[tp].leader, s.states[tp].leader_epoch, s.states[tp].isr) == (p.leader, p.leader_epoch,
                                                                                           p.isr))

    await until(reconciled, what="ZooKeeper reconciled with the log after the restart")
    assert state.controller_epoch < (await in_thread(read_zk_state, zk)).controller_epoch, "claimed again"
    await in_thread(zk.stop)
    await in_thread(zk.close)
