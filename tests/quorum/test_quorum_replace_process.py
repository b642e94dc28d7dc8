"""A dynamic controller quorum (KIP-853) repaired under load, as an operator
runs it: real `raftka controller` and `raftka broker` processes, a
confluent-kafka producer (acks=all) and consumer running throughout.

- A controller whose data dir was wiped is formatted again (a new
  directory id), started as an observer, and swapped in with `raftka
  quorum remove-controller` (its old id and directory id) and
  `add-controller`. Until then its old identity is not counted.
- The leader is SIGKILLed right after an AddRaftVoter reaches it: the
  controllers converge on one voter set, with or without the new voter, and
  the next change works.
- A controller's ApiVersions carries the supported and finalized features.

The default suite runs all three on one cluster (three controllers, a spare
one, a broker); RAFTKA_SOAK=1 adds the leader kill at several timings, each
on a fresh cluster, the wiped controller being the leader, and one
controller grown to three and shrunk back to one under three brokers."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from common.meta_properties import random_cluster_id
from common.wire.ports import free_ports
from test_dynamic_quorum_process import FAST, Processes, controller_configs, run, until

CLUSTER_ID = "replaceQuorumCluster01"
TOPIC = "replace"
BROKER_ID = 10
SOAK = pytest.mark.skipif(not os.environ.get("RAFTKA_SOAK"), reason="a fresh cluster per case: RAFTKA_SOAK=1 runs it")


def ask(port: int, request, timeout: float = 5):  # noqa: ANN001, ANN201
    """One request to 127.0.0.1:`port`; the decoded answer."""
    import trio

    from common.wire import open_connection

    async def go():  # noqa: ANN202
        async with open_connection("127.0.0.1", port, connect_timeout_ms=int(timeout * 1000)) as conn:
            return await conn.request(request, timeout_ms=int(timeout * 1000))

    return trio.run(go)


@dataclasses.dataclass(frozen=True)
class View:
    """One controller's own DescribeQuorum answer: the leader it knows and
    the voters of its own log, with their directory ids (base64)."""

    leader_id: int
    voters: dict[int, str | None]


def view(port: int) -> View:
    from quorum.node.describe_quorum import describe_quorum_request
    from quorum.node.voter_config import format_directory_id

    answer = ask(port, describe_quorum_request(2))
    partition = answer.topics[0].partitions[0]
    return View(int(partition.leader_id), {int(v.replica_id): format_directory_id(v.replica_directory_id) or None
                                           for v in partition.current_voters})


@dataclasses.dataclass
class Cluster:
    tmp: Path
    procs: Processes
    cport: dict[int, int]  # controller id -> port (ids 1-3 start as voters, 4 is a spare)
    bport: int
    configs: dict[int, str]
    live: set[int] = dataclasses.field(default_factory=set)

    def start(self, n: int) -> None:
        self.procs.start(f"c{n}", "controller", self.configs[n])
        self.live.add(n)

    def kill(self, n: int, sig: int = signal.SIGKILL) -> None:
        self.procs.kill(f"c{n}", sig)
        self.live.discard(n)

    def views(self) -> dict[int, View]:
        return {n: view(self.cport[n]) for n in sorted(self.live)}

    def converged(self) -> View:
        """The one view every live controller holds: the same leader (a live
        one) and the same voters with the same directory ids."""
        views = self.views()
        first = next(iter(views.values()))
        assert first.leader_id in self.live, views
        assert all(v == first for v in views.values()), views
        return first

    def directory_id(self, n: int) -> str:
        return (self.tmp / f"c{n}" / "meta.properties").read_text().split("directory.id=")[1].split()[0]


def start_cluster(tmp: Path) -> Cluster:
    ports = free_ports(5)
    cport = dict(zip((1, 2, 3, 4), ports[:4], strict=True))
    bootstrap = "controller.quorum.bootstrap.servers=" + ",".join(f"127.0.0.1:{cport[n]}" for n in (1, 2, 3)) + "\n"
    paths = controller_configs(tmp, cport, bootstrap)
    configs = {n: paths[f"c{n}"] for n in cport}
    dirs = {n: random_cluster_id() for n in (1, 2, 3)}
    initial = ",".join(f"{n}@127.0.0.1:{cport[n]}:{dirs[n]}" for n in (1, 2, 3))
    for n in (1, 2, 3):
        out = run("storage", "format", "-c", configs[n], "-t", CLUSTER_ID, "--initial-controllers", initial)
        assert out.returncode == 0, out.stderr
    out = run("storage", "format", "-c", configs[4], "-t", CLUSTER_ID, "--no-initial-controllers")
    assert out.returncode == 0, out.stderr
    broker = tmp / "b.properties"
    broker.write_text(f"node.id={BROKER_ID}\nprocess.roles=broker\nlog.dirs={tmp}/b\n"
                      f"listeners=PLAINTEXT://127.0.0.1:{ports[4]}\ncontroller.listener.names=CONTROLLER\n"
                      + bootstrap + FAST + "num.partitions=2\n")
    assert run("storage", "format", "-c", str(broker), "-t", CLUSTER_ID).returncode == 0
    cluster = Cluster(tmp, Processes(tmp), cport, ports[4], configs)
    for n in (1, 2, 3):
        cluster.start(n)
    for n in (1, 2, 3):
        cluster.procs.wait_ready(f"c{n}")
    cluster.procs.start("b", "broker", str(broker))
    cluster.procs.wait_ready("b", timeout=60)
    until(lambda: run("topics", "create", "--bootstrap-server", f"127.0.0.1:{ports[4]}", "--topic", TOPIC,
                      "--partitions", "2", "--if-not-exists").returncode == 0, 30, "the topic created")
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):  # noqa: ANN001, ANN201
    c = start_cluster(tmp_path_factory.mktemp("quorum"))
    try:
        yield c
    finally:
        c.procs.stop_all()


class Traffic:
    """A producer (acks=all, idempotent) and a consumer of the topic, each on
    its own thread, for the length of a `with` block; `check()` then says
    whether every acknowledged record was consumed."""

    def __init__(self, bport: int) -> None:
        self.bport = bport
        self.acked: dict[tuple[int, int], bytes] = {}
        self.consumed: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        until(lambda: len(self.consumed) >= 20, 30, "the consumer to read the producer's records")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": f"127.0.0.1:{self.bport}", "acks": "all", "linger.ms": 5,
                             "enable.idempotence": True})

        def delivered(err, msg) -> None:  # noqa: ANN001
            if err is None:
                self.acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                self.errors.append(str(err))

        i = 0
        while not self.stop.is_set():
            producer.produce(TOPIC, value=b"v%07d" % i, on_delivery=delivered)
            producer.poll(0.02)
            i += 1
        producer.flush(30)

    def _consume(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{self.bport}", "group.id": f"check-{id(self)}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in (0, 1)])
        drain_until = None
        while drain_until is None or time.monotonic() < drain_until:
            if self.stop.is_set() and drain_until is None:
                drain_until = time.monotonic() + 5  # the producer's last acks
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                self.consumed[(msg.partition(), msg.offset())] = msg.value()
            if drain_until is not None and self.acked.keys() <= self.consumed.keys():
                break
        consumer.close()

    def check(self) -> None:
        assert len(self.acked) > 20, f"the producer got few acks ({len(self.acked)}; {self.errors[:3]})"
        missing = [k for k, v in self.acked.items() if self.consumed.get(k) != v]
        assert not missing, f"{len(missing)} of {len(self.acked)} acked records not consumed, e.g. {missing[:3]}"


def metadata_log_text(cluster: Cluster, n: int) -> str:
    """Controller `n`'s metadata log as `raftka dump-log --print-data-log` prints it."""
    log_dir = cluster.tmp / f"c{n}" / "__cluster_metadata-0"
    return "".join(run("dump-log", "--print-data-log", str(segment)).stdout
                   for segment in sorted(log_dir.glob("*.log")))


def fenced_after_unfencing(cluster: Cluster, n: int, broker_id: int = BROKER_ID) -> list[str]:
    """The records of controller `n`'s metadata log that fence the broker
    after it was first unfenced (a broker is registered fenced)."""
    lines = metadata_log_text(cluster, n).splitlines()
    changes = [line for line in lines if f"broker_id={broker_id}," in line and "fenced=" in line]
    unfenced = next((i for i, line in enumerate(changes) if re.search(r"\bfenced=(False|0)\b", line)), None)
    assert unfenced is not None, f"the broker was never unfenced in controller {n}'s log"
    return [line for line in changes[unfenced + 1:] if re.search(r"\bfenced=(True|1)\b", line)]


# --- the controllers' ApiVersions --------------------------------------------------------------


def test_a_controller_reports_its_supported_and_finalized_features_in_api_versions(cluster):
    """As Kafka's controllers do on their listener (KIP-584): clients and
    tools asking a controller learn metadata.version, kraft.version (1: the
    quorum is dynamic), group.version and transaction.version."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    for n in sorted(cluster.live):
        answer = ask(cluster.cport[n], ApiVersionsRequest(client_software_name="test", client_software_version="1"))
        supported = {f.name: (int(f.min_version), int(f.max_version)) for f in answer.supported_features}
        finalized = {f.name: int(f.max_version_level) for f in answer.finalized_features}
        assert supported == {"metadata.version": (25, 25), "kraft.version": (0, 1), "group.version": (0, 1),
                             "transaction.version": (0, 2)}, n
        assert finalized == {"metadata.version": 25, "kraft.version": 1, "group.version": 1,
                             "transaction.version": 2}, n
        assert int(answer.finalized_features_epoch) >= 0


# --- replacing a wiped controller -----------------------------------------------------------------


def replace_wiped_controller(cluster: Cluster, victim: int) -> None:
    before = until(cluster.converged, 30, "one view of the quorum")
    voters = sorted(before.voters)
    assert victim in voters and len(voters) == 3
    old_dir = before.voters[victim]
    assert old_dir == cluster.directory_id(victim)
    cluster.kill(victim, signal.SIGTERM)
    shutil.rmtree(cluster.tmp / f"c{victim}")
    # As `kafka-storage format --no-initial-controllers`: the same node id, a new directory id.
    out = run("storage", "format", "-c", cluster.configs[victim], "-t", CLUSTER_ID, "--no-initial-controllers")
    assert out.returncode == 0, out.stderr
    new_dir = cluster.directory_id(victim)
    assert new_dir != old_dir
    cluster.start(victim)
    cluster.procs.wait_ready(f"c{victim}")
    leader = until(lambda: (v := cluster.converged()).leader_id in cluster.live and v, 30, "a leader").leader_id
    # The wiped controller fetches the metadata log as an observer...
    marker = f"wiped-{victim}-{new_dir}"
    out = run("topics", "create", "--bootstrap-server", f"127.0.0.1:{cluster.bport}", "--topic", marker,
              "--partitions", "1")
    assert out.returncode == 0, out.stderr
    until(lambda: marker in metadata_log_text(cluster, victim), 30, "the wiped controller to fetch the topic")
    # ...but it is not the voter of its id: the leader does not count its
    # fetches as voter `victim`'s, so that voter shows no progress; it lists
    # the wiped controller as an observer by its id and new directory id.
    status = until(lambda: (s := describe_leader(cluster))["leader_id"] == leader and victim in s["current_observers"]
                   and s, 10, "the leader's status listing the wiped controller as an observer")
    rows = {(r["node_id"], r["status"]): r for r in status["replicas"]}
    row = rows[(victim, "Follower")]
    assert row["directory_id"] == old_dir
    assert row["log_end_offset"] < status["high_watermark"] or row["log_end_offset"] == -1, row
    assert rows[(victim, "Observer")]["directory_id"] == new_dir
    out = run("quorum", "remove-controller", "--bootstrap-controller", f"127.0.0.1:{cluster.cport[leader]}",
              "--controller-id", str(victim), "--controller-directory-id", old_dir)
    assert out.returncode == 0, out.stderr
    out = run("quorum", "add-controller", "--config", cluster.configs[victim],
              "--bootstrap-controller", f"127.0.0.1:{cluster.cport[leader]}")
    assert out.returncode == 0, out.stderr
    after = until(lambda: (v := cluster.converged()).voters.get(victim) == new_dir and v, 30,
                  "every controller to see the new directory id")
    assert sorted(after.voters) == voters
    assert {n: d for n, d in after.voters.items() if n != victim} == \
        {n: d for n, d in before.voters.items() if n != victim}


def describe_leader(cluster: Cluster) -> dict:
    import json

    n = min(cluster.live)
    out = run("quorum", "describe", "--bootstrap-controller", f"127.0.0.1:{cluster.cport[n]}", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_controller_whose_data_dir_was_wiped_is_replaced_under_load_losing_nothing(cluster):
    view_now = until(cluster.converged, 30, "one view of the quorum")
    victim = max(n for n in view_now.voters if n != view_now.leader_id and n in cluster.live)
    with Traffic(cluster.bport) as traffic:
        replace_wiped_controller(cluster, victim)
        # The repaired quorum still takes metadata changes.
        assert run("topics", "create", "--bootstrap-server", f"127.0.0.1:{cluster.bport}", "--topic",
                   "after-replace", "--partitions", "1").returncode == 0
    traffic.check()
    assert fenced_after_unfencing(cluster, min(cluster.live)) == []


# --- SIGKILL of the leader during an AddRaftVoter ----------------------------------------------


def send_add_voter(cluster: Cluster, leader: int, new: int) -> socket.socket:
    """An AddRaftVoter for controller `new` written to the leader's socket
    (not waited for): the caller kills the leader right after."""
    import datetime

    from kio.schema.add_raft_voter.v1.request import AddRaftVoterRequest, Listener
    from kio.static.primitive import i32, i32Timedelta, u16

    from common.wire.codec import encode_request
    from quorum.node.voter_config import parse_directory_id

    request = AddRaftVoterRequest(
        cluster_id=None, timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), voter_id=i32(new),
        voter_directory_id=parse_directory_id(cluster.directory_id(new)),
        listeners=(Listener(name="CONTROLLER", host="127.0.0.1", port=u16(cluster.cport[new])),),
        ack_when_committed=True)
    sock = socket.create_connection(("127.0.0.1", cluster.cport[leader]), timeout=5)
    sock.sendall(encode_request(7, "test", request))
    return sock


def kill_leader_during_add(cluster: Cluster, new: int, delay_s: float) -> None:
    before = until(cluster.converged, 30, "one view of the quorum")
    assert new not in before.voters
    leader = before.leader_id
    # Committed before the change: must survive whatever happens to it.
    out = run("topics", "create", "--bootstrap-server", f"127.0.0.1:{cluster.bport}", "--topic",
              f"before-kill-{new}-{leader}", "--partitions", "1")
    assert out.returncode == 0, out.stderr
    if new not in cluster.live:
        cluster.start(new)
        cluster.procs.wait_ready(f"c{new}")
    until(lambda: new in describe_leader(cluster)["current_observers"], 30, f"controller {new} observing")
    sock = send_add_voter(cluster, leader, new)
    time.sleep(delay_s)
    cluster.kill(leader)
    sock.close()
    after = until(cluster.converged, 30, "the live controllers to agree on one voter set")
    print(f"leader {leader} killed {delay_s * 1000:.0f} ms after the AddRaftVoter of {new}: voters "
          f"{sorted(after.voters)}, leader {after.leader_id}")
    assert set(after.voters) in (set(before.voters), set(before.voters) | {new}), after
    assert after.voters[leader] == before.voters[leader]
    # The next change works: the new controller becomes (or stays) a voter,
    # and the dead leader leaves.
    bootstrap = f"127.0.0.1:{cluster.cport[after.leader_id]}"
    if new not in after.voters:
        out = run("quorum", "add-controller", "--config", cluster.configs[new], "--bootstrap-controller", bootstrap)
        assert out.returncode == 0, out.stderr
    out = run("quorum", "remove-controller", "--bootstrap-controller", bootstrap, "--controller-id", str(leader))
    assert out.returncode == 0, out.stderr
    final = until(lambda: (v := cluster.converged()) and set(v.voters) == cluster.live and v, 30,
                  "every live controller to see the new voter set")
    assert final.voters[new] == cluster.directory_id(new)
    topics = run("topics", "describe", "--bootstrap-server", f"127.0.0.1:{cluster.bport}").stdout
    assert f"before-kill-{new}-{leader}" in topics


def test_the_leader_killed_during_an_add_raft_voter_leaves_one_voter_set_and_the_next_change_works(cluster):
    with Traffic(cluster.bport) as traffic:
        kill_leader_during_add(cluster, new=4, delay_s=0)
    traffic.check()
    assert fenced_after_unfencing(cluster, min(cluster.live)) == []


@SOAK
@pytest.mark.parametrize("delay_s", [0.0, 0.005, 0.02, 0.1])
def test_soak_the_leader_killed_at_several_moments_of_an_add_raft_voter(tmp_path, delay_s):
    c = start_cluster(tmp_path)
    try:
        with Traffic(c.bport) as traffic:
            kill_leader_during_add(c, new=4, delay_s=delay_s)
        traffic.check()
        assert fenced_after_unfencing(c, min(c.live)) == []
    finally:
        c.procs.stop_all()


@SOAK
def test_soak_the_leader_is_the_controller_whose_data_dir_was_wiped(tmp_path):
    c = start_cluster(tmp_path)
    try:
        leader = until(c.converged, 30, "one view of the quorum").leader_id
        with Traffic(c.bport) as traffic:
            replace_wiped_controller(c, leader)
        traffic.check()
        assert fenced_after_unfencing(c, min(c.live)) == []
    finally:
        c.procs.stop_all()


# --- grow one controller to three and shrink back, under three brokers ---------------------------


@SOAK
def test_soak_one_controller_grows_to_three_and_shrinks_back_under_three_brokers_losing_nothing(tmp_path):
    """`raftka quorum status` is right at each step; every acknowledged
    record is consumed; no broker is fenced. The shrink removes the leader
    first (it resigns once its removal is committed)."""
    import json

    ports = free_ports(6)
    cport = dict(zip((1, 2, 3), ports[:3], strict=True))
    bports = dict(zip((10, 11, 12), ports[3:], strict=True))
    bootstrap = "controller.quorum.bootstrap.servers=" + ",".join(f"127.0.0.1:{p}" for p in cport.values()) + "\n"
    paths = controller_configs(tmp_path, cport, bootstrap)
    configs = {n: paths[f"c{n}"] for n in cport}
    assert run("storage", "format", "-c", configs[1], "-t", CLUSTER_ID, "--standalone").returncode == 0
    for n in (2, 3):
        assert run("storage", "format", "-c", configs[n], "-t", CLUSTER_ID, "--no-initial-controllers").returncode == 0
    for b, port in bports.items():
        path = tmp_path / f"b{b}.properties"
        path.write_text(f"node.id={b}\nprocess.roles=broker\nlog.dirs={tmp_path}/b{b}\n"
                        f"listeners=PLAINTEXT://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n"
                        + bootstrap + FAST)
        configs[b] = str(path)
        assert run("storage", "format", "-c", configs[b], "-t", CLUSTER_ID).returncode == 0
    c = Cluster(tmp_path, Processes(tmp_path), cport, bports[10], configs)

    def status(voters: set[int], observers: set[int]) -> dict:
        """`raftka quorum status`, asked of every running controller, once it shows these voters."""
        def check() -> dict:
            out = {}
            for n in sorted(c.live):
                result = run("quorum", "status", "--bootstrap-controller", f"127.0.0.1:{cport[n]}", "--json")
                assert result.returncode == 0, result.stderr
                out[n] = json.loads(result.stdout)
            first = out[min(out)]
            assert all(o["leader_id"] == first["leader_id"] and o["current_voters"] == first["current_voters"]
                       for o in out.values()), out
            assert set(first["current_voters"]) == voters and first["leader_id"] in voters, first
            assert observers <= set(first["current_observers"]), first
            assert all(r["directory_id"] == c.directory_id(r["node_id"])
                       for r in first["replicas"] if r["node_id"] in voters), first
            return first
        return until(check, 30, f"quorum status showing voters {sorted(voters)}")

    try:
        c.start(1)
        c.procs.wait_ready("c1")
        for b in bports:
            c.procs.start(f"b{b}", "broker", configs[b])
        for b in bports:
            c.procs.wait_ready(f"b{b}", timeout=60)
        until(lambda: run("topics", "create", "--bootstrap-server", f"127.0.0.1:{bports[10]}", "--topic", TOPIC,
                          "--partitions", "2", "--replication-factor", "3").returncode == 0, 30, "the topic")
        brokers = set(bports)
        with Traffic(bports[10]) as traffic:
            status({1}, brokers)
            for n in (2, 3):
                c.start(n)
            for n in (2, 3):
                c.procs.wait_ready(f"c{n}")
            status({1}, brokers | {2, 3})
            for n, voters in ((2, {1, 2}), (3, {1, 2, 3})):
                out = run("quorum", "add-controller", "--config", configs[n], timeout=60)
                assert out.returncode == 0, out.stderr
                status(voters, brokers)
            text = run("quorum", "status", "--bootstrap-controller", f"127.0.0.1:{cport[1]}").stdout
            assert "CurrentVoters:          [1, 2, 3]" in text, text
            voters = {1, 2, 3}
            for _ in range(2):
                leader = status(voters, brokers)["leader_id"]
                out = run("quorum", "remove-controller", "--bootstrap-controller", f"127.0.0.1:{cport[leader]}",
                          "--controller-id", str(leader), timeout=60)
                assert out.returncode == 0, out.stderr
                voters = voters - {leader}
                # The removed controller keeps running, as an observer.
                status(voters, brokers | {leader})
            (last,) = voters
            assert run("topics", "create", "--bootstrap-server", f"127.0.0.1:{bports[11]}", "--topic",
                       "after-shrink", "--partitions", "1").returncode == 0
        traffic.check()
        for b in bports:
            assert fenced_after_unfencing(c, last, b) == [], b
    finally:
        c.procs.stop_all()
