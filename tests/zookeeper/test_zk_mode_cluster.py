"""ZooKeeper mode as users run it: real ZooKeeper, real broker processes, a real client.

One cluster for the module (`LocalCluster(mode="zk")`: a 1-server ensemble
with tickTime=500, three brokers with zookeeper.session.timeout.ms=4000);
each test that stops a broker starts it again before it ends. What the
tests assert is what a user sees: records produced and consumed through
confluent-kafka, who clients are told leads a partition, and how fast that
changes when a broker dies or is stopped.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kazoo.client import KazooClient

from quorum.zookeeper import store
from quorum.zookeeper import znodes as z
from quorum.zookeeper.context import SetZNode, ZkTransaction
from quorum.zookeeper.ensemble import zookeeper_missing_reason
from quorum.zookeeper.errors import ControllerMovedError
from quorum.zookeeper.znodes import NamedPartition
from cluster import LocalCluster
from common.config import NodeConfig
from common.errors import ConfigError

SESSION_TIMEOUT_S = 4.0
#: Time past the session timeout for ZooKeeper to notice (a tick), the
#: controller to react and clients to hear, on a loaded 2-core machine.
SLACK_S = 4.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"ZooKeeper mode needs a local ZooKeeper: {reason}")
    c = LocalCluster(tmp_path_factory.mktemp("zk-mode"), controllers=1, brokers=3, mode="zk",
                     zookeeper_tick_time_ms=500, metrics=True,
                     overrides={"zookeeper.session.timeout.ms": str(int(SESSION_TIMEOUT_S * 1000)),
                                "raftka.controlled.shutdown.timeout.ms": "15000"})
    try:
        c.start_all()
        c.wait_ready(120)
        yield c
    finally:
        c.stop_all(20)


@pytest.fixture
def zk(cluster):
    client = KazooClient(cluster.zookeeper.connect_string)
    client.start(10)
    yield client
    client.stop()
    client.close()


def admin_client(cluster, brokers=None) -> AdminClient:
    nodes = brokers or [b for b in cluster.brokers if b.is_running()]
    return AdminClient({"bootstrap.servers": ",".join(b.address for b in nodes)})


def create_topic(cluster, name: str, partitions: int, replication: int, config=None) -> None:
    client = admin_client(cluster)  # referenced until the answer comes: its handle must outlive the future
    futures = client.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                                   operation_timeout=30)
    futures[name].result(60)


def leaders_seen_by_clients(cluster, topic: str) -> dict[int, int]:
    """partition -> leader, as a live broker's Metadata answer tells a client."""
    metadata = admin_client(cluster).list_topics(topic, timeout=10)
    return {p: m.leader for p, m in metadata.topics[topic].partitions.items()}


def settled_leaders(cluster, topic: str, partitions: int) -> dict[int, int]:
    """`leaders_seen_by_clients` once every partition has a leader: in
    ZooKeeper mode CreateTopics returns when ZooKeeper has the topic, before
    the controller's UpdateMetadata has reached every broker."""
    seen: dict[int, int] = {}

    def settled() -> bool:
        seen.clear()
        seen.update(leaders_seen_by_clients(cluster, topic))
        return len(seen) == partitions and all(leader >= 0 for leader in seen.values())

    wait_until(settled, 30, f"every partition of {topic} has a leader clients see")
    return dict(seen)


def zk_states(zk, topic: str, partitions: int):
    return store.read_partition_states(zk, [NamedPartition(topic, p) for p in range(partitions)])


def wait_until(predicate, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    last_error = None
    while time.monotonic() - start < timeout_s:
        try:
            if predicate():
                return time.monotonic() - start
        except KafkaException as exc:  # a client asked a broker that just went away
            last_error = exc
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s}s (last client error: {last_error})")


def produce(cluster, topic: str, values: list[str]) -> None:
    # Idempotent: each producer gets its id from a block claimed in /latest_producer_id_block.
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "message.timeout.ms": 60000,
                         "enable.idempotence": True})
    errors = []
    for i, v in enumerate(values):
        producer.produce(topic, key=str(i), value=v,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
    assert producer.flush(60) == 0
    assert errors == []


def consume_all(cluster, topic: str, count: int, group: str) -> list:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset(), m.value().decode()))
    finally:
        consumer.close()
    return got


def restart(cluster, node_id: int) -> None:
    cluster.start(node_id)
    cluster.wait_ready(120)


def controller_metrics(cluster) -> dict[int, dict[str, float]]:
    """broker id -> its ZooKeeper-mode controller metrics (name -> value), for the running brokers."""
    from prometheus_client.parser import text_string_to_metric_families

    scraped = {}
    for b in cluster.brokers:
        if b.is_running():
            with urllib.request.urlopen(f"http://{b.host}:{b.metrics_port}/metrics", timeout=10) as response:
                text = response.read().decode()
            scraped[b.node_id] = {s.name: s.value for f in text_string_to_metric_families(text)
                                  for s in f.samples if s.name.startswith("kafka_controller_") and not s.labels}
    return scraped


def controller(zk) -> tuple[int, int, int]:
    """(broker holding /controller, controller epoch, its zkVersion)."""
    holder = store.active_controller(zk)
    epoch, version = store.read_controller_epoch(zk)
    return holder, epoch, version


# --- tests -------------------------------------------------------------------------------------


def test_topics_created_by_a_client_then_produced_and_consumed(cluster, zk):
    create_topic(cluster, "orders", 3, 3, {"retention.ms": "3600000"})
    values = [f"order-{i}" for i in range(300)]
    produce(cluster, "orders", values)
    got = consume_all(cluster, "orders", len(values), "billing")
    assert sorted(v for _, _, v in got) == sorted(values)
    for p in range(3):
        offsets = [o for part, o, _ in got if part == p]
        assert offsets == list(range(len(offsets))), f"partition {p} offsets {offsets[:10]}..."
    # Kafka's znode layout, written through the broker's admin path.
    assignment = json.loads(zk.get("/brokers/topics/orders")[0])
    assert sorted(assignment["partitions"]) == ["0", "1", "2"]
    assert all(sorted(r) == [2, 3, 4] for r in assignment["partitions"].values())
    assert json.loads(zk.get("/config/topics/orders")[0])["config"] == {"retention.ms": "3600000"}
    state = json.loads(zk.get("/brokers/topics/orders/partitions/0/state")[0])
    assert state["leader"] in (2, 3, 4) and sorted(state["isr"]) == [2, 3, 4]
    # The configs a client reads back are ZooKeeper's.
    client = admin_client(cluster)
    described = client.describe_configs([ConfigResource("topic", "orders")])
    (entries,) = [f.result(30) for f in described.values()]
    assert entries["retention.ms"].value == "3600000"
    # A config changed through one broker reaches every broker (the /config/changes watch).
    change = ConfigResource("topic", "orders", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([change])[change].result(30)

    def everywhere(key: str, value: str) -> bool:
        for b in cluster.brokers:
            one = AdminClient({"bootstrap.servers": b.address})
            (entries,) = [f.result(10) for f in one.describe_configs([ConfigResource("topic", "orders")]).values()]
            if entries[key].value != value:
                return False
        return True

    wait_until(lambda: everywhere("retention.ms", "7200000"), 20, "the new retention.ms on every broker")
    assert json.loads(zk.get("/config/topics/orders")[0])["config"] == {"retention.ms": "7200000"}
    block = json.loads(zk.get("/latest_producer_id_block")[0])
    assert block["broker"] in (2, 3, 4) and int(block["block_end"]) >= int(block["block_start"]) >= 0
    # The topic grows: the new partition is led, and takes records.
    client.create_partitions([NewPartitions("orders", 4)], operation_timeout=30)["orders"].result(60)
    wait_until(lambda: sorted(leaders_seen_by_clients(cluster, "orders")) == [0, 1, 2, 3]
               and leaders_seen_by_clients(cluster, "orders")[3] in (2, 3, 4), 30, "partition 3 online")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    producer.produce("orders", value=b"in-partition-3", partition=3)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "p3", "enable.auto.commit": False})
    consumer.assign([TopicPartition("orders", 3, 0)])
    message = consumer.poll(30)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"in-partition-3"
    # Each log dir is marked as a ZooKeeper-mode broker's (what `raftka migrate` reads).
    for b in cluster.brokers:
        meta = (b.log_dir / "meta.properties").read_text()
        assert "version=0" in meta and f"broker.id={b.node_id}" in meta
        assert f"cluster.id={cluster.cluster_id}" in meta


def test_deleted_topic_leaves_clients_zookeeper_and_every_log_dir(cluster, zk):
    create_topic(cluster, "doomed", 2, 3)
    produce(cluster, "doomed", ["soon gone"])
    client = admin_client(cluster)
    client.delete_topics(["doomed"], operation_timeout=30)["doomed"].result(60)
    wait_until(lambda: "doomed" not in client.list_topics(timeout=10).topics, 30, "the topic gone from Metadata")
    wait_until(lambda: zk.exists("/brokers/topics/doomed") is None and not zk.get_children("/admin/delete_topics"),
               30, "the topic's znodes deleted by the controller")
    wait_until(lambda: not any(d.name.startswith("doomed-") for b in cluster.brokers for d in b.log_dir.iterdir()),
               30, "every replica's log deleted")
    # The name is free again: a new topic, with a new id.
    create_topic(cluster, "doomed", 1, 3)
    assert settled_leaders(cluster, "doomed", 1)[0] in (2, 3, 4)


def test_killed_controller_is_replaced_with_a_higher_epoch_and_its_stale_write_is_fenced(cluster, zk):
    create_topic(cluster, "failover", 2, 3)
    settled_leaders(cluster, "failover", 2)
    old_holder, old_epoch, old_version = controller(zk)
    assert old_holder in (2, 3, 4)
    # The controller's metrics as Kafka's ZooKeeper-mode controller has
    # them: one active controller among the brokers, counting the partitions.
    before = controller_metrics(cluster)
    assert {b: m["kafka_controller_kafkacontroller_activecontrollercount"] for b, m in before.items()} \
        == {b: (1 if b == old_holder else 0) for b in before}
    assert before[old_holder]["kafka_controller_kafkacontroller_globalpartitioncount"] >= 2
    assert before[old_holder]["kafka_controller_kafkacontroller_activebrokercount"] == 3
    assert before[old_holder]["kafka_controller_controllereventmanager_eventqueuetimems_count"] > 0
    cluster.kill(old_holder, signal.SIGKILL)
    took = wait_until(lambda: controller(zk)[0] not in (None, old_holder), SESSION_TIMEOUT_S + SLACK_S,
                      "a new controller elected")
    new_holder, new_epoch, _ = controller(zk)
    assert new_epoch > old_epoch
    assert took <= SESSION_TIMEOUT_S + SLACK_S
    wait_until(lambda: {b: m["kafka_controller_kafkacontroller_activecontrollercount"]
                        for b, m in controller_metrics(cluster).items()}
               == {b: (1 if b == new_holder else 0) for b in (2, 3, 4) if b != old_holder},
               SESSION_TIMEOUT_S + SLACK_S, "the new controller counted as the only active one")
    # The new controller serves the cluster: no partition is led by the dead broker.
    wait_until(lambda: all(leader not in (-1, old_holder)
                           for leader in leaders_seen_by_clients(cluster, "failover").values()),
               SESSION_TIMEOUT_S + SLACK_S, "leaders moved off the dead controller")
    # ... and it has left every ISR (onBrokerFailure). Until then the new
    # controller may still rewrite a state znode read below: when the dead
    # broker led no partition, the leaders above are settled from the start.
    wait_until(lambda: all(old_holder not in s.isr for s in zk_states(zk, "failover", 2).values()),
               SESSION_TIMEOUT_S + SLACK_S, "the dead controller out of every ISR")
    # The dead controller's view: a write it would make (its broker leading
    # again, at its epoch), fenced by the /controller_epoch zkVersion it won
    # with, is rejected as a whole, even though the partition's own zkVersion
    # is the current one.
    tp = NamedPartition("failover", 0)
    data, stat = zk.get(z.partition_state_path(*tp))
    current = z.decode_partition_state(tp.topic, tp.partition, data, stat.version)
    stale_state = z.PartitionState(old_holder, current.leader_epoch + 1, (old_holder,), old_epoch, stat.version)
    stale = ZkTransaction((SetZNode(z.partition_state_path(*tp), z.encode_partition_state(stale_state),
                                    stat.version),), tp)
    with pytest.raises(ControllerMovedError):
        store.apply_transactions(zk, old_version, [stale])
    assert zk.get(z.partition_state_path(*tp))[0] == data
    produce(cluster, "failover", ["after-failover"])
    restart(cluster, old_holder)
    # Back, it catches up and its leaders' ISR write (conditional on the
    # zkVersion) puts it back in the ISR, as the controller then tells clients.
    wait_until(lambda: all(old_holder in s.isr for s in zk_states(zk, "failover", 2).values()), 60,
               f"broker {old_holder} back in the ISR")


def test_paused_controller_is_replaced_and_steps_down_when_it_resumes(cluster, zk):
    """Split brain, as a long GC pause makes it: the old controller wakes up believing it leads."""
    create_topic(cluster, "pause", 3, 3)
    settled_leaders(cluster, "pause", 3)
    old_holder, old_epoch, _ = controller(zk)
    node = cluster.node(old_holder)
    node.process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: controller(zk)[0] not in (None, old_holder), SESSION_TIMEOUT_S + SLACK_S,
                   "a new controller elected while the old one is paused")
        wait_until(lambda: all(s.leader != old_holder for s in zk_states(zk, "pause", 3).values()),
                   SLACK_S, "leaders moved off the paused controller")
    finally:
        node.process.send_signal(signal.SIGCONT)
    new_holder, new_epoch, _ = controller(zk)
    assert new_epoch > old_epoch
    # Resumed, it learns its session expired, resigns, and rejoins as a plain broker.
    wait_until(lambda: f"controller {old_holder} (epoch {old_epoch}) resigns" in node.output_since_start(), 30,
               "the stale controller resigns")
    cluster.wait_ready(60)
    assert controller(zk)[:2] == (new_holder, new_epoch)
    # Every partition state was last decided by the new controller's epoch.
    assert {s.controller_epoch for s in zk_states(zk, "pause", 3).values()} == {new_epoch}
    produce(cluster, "pause", ["after-the-pause"])


def test_killed_broker_loses_its_leaderships_within_the_session_timeout(cluster, zk):
    create_topic(cluster, "crash", 6, 3)
    holder = controller(zk)[0]
    leaders = settled_leaders(cluster, "crash", 6)
    victim = next(b for b in sorted(set(leaders.values())) if b != holder)
    led = sorted(p for p, leader in leaders.items() if leader == victim)
    before = zk_states(zk, "crash", 6)
    survivors = [b for b in cluster.brokers if b.node_id != victim]
    cluster.kill(victim, signal.SIGKILL)
    took = wait_until(
        lambda: all(leaders_seen_by_clients_via(survivors, "crash")[p] not in (victim, -1) for p in led),
        SESSION_TIMEOUT_S + SLACK_S + 5, "leaders moved")
    assert took <= SESSION_TIMEOUT_S + SLACK_S, f"leaders moved {took:.1f}s after the crash"
    after = zk_states(zk, "crash", 6)
    for p in led:
        tp = NamedPartition("crash", p)
        assert after[tp].leader != victim and victim not in after[tp].isr
        assert after[tp].leader_epoch == before[tp].leader_epoch + 1
    produce(cluster, "crash", [f"while-{victim}-is-down-{i}" for i in range(20)])
    restart(cluster, victim)


def leaders_seen_by_clients_via(brokers, topic: str) -> dict[int, int]:
    client = AdminClient({"bootstrap.servers": ",".join(b.address for b in brokers)})
    metadata = client.list_topics(topic, timeout=10)
    return {p: m.leader for p, m in metadata.topics[topic].partitions.items()}


def test_sigterm_moves_leaderships_before_the_broker_exits(cluster, zk):
    create_topic(cluster, "graceful", 6, 3)
    holder = controller(zk)[0]
    leaders = settled_leaders(cluster, "graceful", 6)
    victim = next(b for b in sorted(set(leaders.values())) if b != holder)
    led = [NamedPartition("graceful", p) for p, leader in leaders.items() if leader == victim]
    node = cluster.node(victim)
    node.process.send_signal(signal.SIGTERM)

    def moved() -> bool:
        return all(s.leader not in (victim, -1) for s in store.read_partition_states(zk, led).values())

    took = wait_until(moved, SESSION_TIMEOUT_S + SLACK_S, "leaders moved off the stopping broker")
    # Controlled: no session had to expire (a crash waits for that, see above).
    assert took < SESSION_TIMEOUT_S, f"the leaders moved {took:.1f}s after SIGTERM"
    assert node.process.wait(30) == 0
    log = node.output_since_start()
    # ... and they moved while the broker still served: it waited for them before closing its logs.
    assert log.index("controlled shutdown: leaders moved") < log.index("shut down cleanly")
    assert (node.log_dir / ".kafka_cleanshutdown").exists()
    produce(cluster, "graceful", ["after-shutdown"])
    restart(cluster, victim)


def _zookeeper_servers_running(data_dir: Path) -> list[int]:
    """Pids of ZooKeeper servers started from a zoo.cfg under `data_dir`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "QuorumPeerMain" in cmdline and str(data_dir) in cmdline:
            pids.append(int(proc.name))
    return pids


def test_cluster_up_mode_zk_prints_ready_and_stops_on_sigterm(tmp_path):
    """A 3-server ensemble from generated zoo.cfg files, then the broker; all of it stops on SIGTERM."""
    if zookeeper_missing_reason() is not None:
        pytest.skip(zookeeper_missing_reason())
    process = subprocess.Popen(
        [sys.executable, "-m", "raftka.cli", "cluster", "up", "--mode", "zk", "--controllers", "3", "--brokers", "1",
         "--base-port", "0", "--data-dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = process.stdout.readline().strip()
        assert line.startswith("READY bootstrap=127.0.0.1:"), line
        bootstrap = line.split("=", 1)[1]
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
        assert list(metadata.brokers) == [4]
        state = json.loads((tmp_path / "c" / "cluster.json").read_text())
        assert state["mode"] == "zk" and len(state["zookeeper_connect"].split(",")) == 3
        assert len(_zookeeper_servers_running(tmp_path / "c")) == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert _zookeeper_servers_running(tmp_path / "c") == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_zookeeper_mode_config_errors_say_what_to_fix():
    base = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": "/nonexistent"}
    config = NodeConfig.from_properties({**base, "broker.id": "7", "zookeeper.connect": "127.0.0.1:2181/kafka"})
    assert config.zk_mode and config.node_id == 7 and config.zookeeper_session_timeout_ms == 18000
    with pytest.raises(ConfigError, match="remove process.roles"):
        NodeConfig.from_properties({**base, "node.id": "1", "process.roles": "broker",
                                    "controller.quorum.voters": "1@127.0.0.1:9093", "zookeeper.connect": "h:1"})
    with pytest.raises(ConfigError, match="broker.id is required"):
        NodeConfig.from_properties({**base, "zookeeper.connect": "127.0.0.1:2181"})
    with pytest.raises(ConfigError, match="host:port"):
        NodeConfig.from_properties({**base, "broker.id": "1", "zookeeper.connect": "localhost"})
    with pytest.raises(ConfigError, match=r"zookeeper.connect: port 70000 in 'zk2:70000' is out of range: use 1-65535"):
        NodeConfig.from_properties({**base, "broker.id": "1", "zookeeper.connect": "zk1:2181,zk2:70000/kafka"})


def test_broker_without_zookeeper_fails_fast_naming_the_address(tmp_path):
    from common.wire.ports import free_ports

    (port,) = free_ports(1)
    config = tmp_path / "broker.properties"
    config.write_text(f"broker.id=1\nzookeeper.connect=127.0.0.1:{port}\nzookeeper.connection.timeout.ms=1000\n"
                      f"listeners=PLAINTEXT://127.0.0.1:0\nlog.dirs={tmp_path / 'data'}\n")
    result = subprocess.run([sys.executable, "-m", "raftka.cli", "broker", "--config", str(config)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr and "zookeeper.connection.timeout.ms" in result.stderr


def test_kraft_only_admin_requests_get_a_clear_non_retriable_error(cluster):
    """ElectLeaders and partition reassignment are decided by the KRaft
    controller; a ZooKeeper-mode broker refuses them at once, saying what to do."""
    from confluent_kafka import ElectionType
    from confluent_kafka import KafkaError
    from kafka import KafkaAdminClient
    from kafka.errors import InvalidRequestError

    create_topic(cluster, "kraft-only", 1, 3)
    started = time.monotonic()
    client = admin_client(cluster)  # its handle must outlive the future
    future = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition("kraft-only", 0)])
    with pytest.raises(KafkaException) as refused:
        outcome = future.result(30)
        # librdkafka may report a top-level error per partition instead of raising
        raise KafkaException(outcome[TopicPartition("kraft-only", 0)])
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST, refused.value
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10000)
    try:
        with pytest.raises(InvalidRequestError) as listed:
            admin.list_partition_reassignments()
    finally:
        admin.close()
    assert isinstance(listed.value, InvalidRequestError), listed.value
    assert "raftka migrate" in str(listed.value), listed.value
    assert time.monotonic() - started < 25, "a refusal must not wait for a timeout"


def test_transaction_markers_and_read_committed_use_the_same_code(cluster):
    """The partition side of transactions in ZooKeeper mode: a
    transactional produce, WriteTxnMarkers (abort, then commit), the LSO
    and a read_committed consumer (the test plays the coordinator)."""
    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    from txn_partition_testing import READ_COMMITTED, consume, init_producer_id, latest_offset, produce, write_markers

    from kio.schema.errors import ErrorCode

    create_topic(cluster, "zk-txn", 1, 3)
    leader = cluster.node(settled_leaders(cluster, "zk-txn", 1)[0]).address
    pid, epoch = init_producer_id(leader)
    assert produce(leader, "zk-txn", 0, [b"x"], producer_id=pid, producer_epoch=epoch, sequence=0,
                   transactional=True) == (ErrorCode.none, 0)
    assert latest_offset(leader, "zk-txn", 0, READ_COMMITTED) == 0
    assert write_markers(leader, pid, epoch, False, {"zk-txn": [0]}) == {("zk-txn", 0): ErrorCode.none}
    assert produce(leader, "zk-txn", 0, [b"y"], producer_id=pid, producer_epoch=epoch, sequence=1,
                   transactional=True) == (ErrorCode.none, 2)
    assert write_markers(leader, pid, epoch, True, {"zk-txn": [0]}) == {("zk-txn", 0): ErrorCode.none}
    assert latest_offset(leader, "zk-txn", 0, READ_COMMITTED) == 4
    assert consume("confluent-kafka", leader, "zk-txn", 0, "read_committed", 1) == [(2, b"y")]
