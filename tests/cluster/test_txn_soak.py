"""Transactions across leader kills (RAFTKA_SOAK=1 only): many
transactions over two partitions of an RF=3 topic, each committed or
aborted at random, while partition leaders are SIGKILLed and restarted.

The test plays the transaction coordinator (`txn_partition_testing`): it
produces each transaction's batches to the partitions' current leaders,
retrying a batch with its own sequence number after a failover (the new
leader answers a duplicate with its first offset), and writes each marker
to every partition until the leader answers NONE, re-resolving leaders on
errors, as a coordinator retries markers. At the end, per partition, a
read_committed consumer must read exactly the committed values, in order,
and a read_uncommitted one every value whose produce was acknowledged.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from kio.schema.errors import ErrorCode

from cluster import LocalCluster
from cluster_replication_testing import SETTINGS, partition_state, wait_for, wait_for_isr
from common.wire.errors import ConnectionFailedError, RequestTimeoutError
from txn_partition_testing import consume, init_producer_id, produce, write_markers

pytestmark = pytest.mark.skipif(os.environ.get("RAFTKA_SOAK") != "1", reason="a soak: RAFTKA_SOAK=1")

TOPIC = "txn-soak"
PARTITIONS = 2
BROKERS = (2, 3, 4)
TRANSACTIONS = int(os.environ.get("RAFTKA_TXN_SOAK_TRANSACTIONS", "300"))
KILLS = int(os.environ.get("RAFTKA_TXN_SOAK_KILLS", "4"))
RETRY = {ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition, ErrorCode.request_timed_out,
         ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append, ErrorCode.kafka_storage_error,
         ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch}


class Coordinator:
    """What a coordinator does for one producer, with retries."""

    def __init__(self, cluster: LocalCluster, bootstrap: str) -> None:
        self.cluster = cluster
        self.bootstrap = bootstrap
        self.leaders: dict[int, int] = {}

    def leader_address(self, partition: int) -> str:
        leader = self.leaders.get(partition)
        if leader is None or leader < 0:
            leader = wait_for(f"a leader of {TOPIC}-{partition}",
                              lambda: max(partition_state(self.bootstrap, TOPIC)[partition][0], 0), 60)
            self.leaders[partition] = leader
        return self.cluster.node(leader).address

    def _retry(self, partition: int, call):
        deadline = time.monotonic() + 120
        while True:
            try:
                error = call(self.leader_address(partition))
            except (ConnectionFailedError, RequestTimeoutError):
                error = ErrorCode.not_leader_or_follower
            if error not in RETRY:
                return error
            assert time.monotonic() < deadline, f"{TOPIC}-{partition}: still {error.name} after 120 s"
            self.leaders.pop(partition, None)
            time.sleep(0.2)

    def produce(self, partition: int, values, pid: int, epoch: int, sequence: int) -> None:
        error = self._retry(partition, lambda address: produce(
            address, TOPIC, partition, values, producer_id=pid, producer_epoch=epoch, sequence=sequence,
            transactional=True)[0])
        assert error == ErrorCode.none, error

    def end(self, partition: int, pid: int, epoch: int, commit: bool) -> None:
        error = self._retry(partition, lambda address: write_markers(
            address, pid, epoch, commit, {TOPIC: [partition]})[(TOPIC, partition)])
        assert error == ErrorCode.none, error


def test_transactions_survive_leader_kills(tmp_path) -> None:
    rng = random.Random(int(os.environ.get("RAFTKA_TXN_SOAK_SEED", "7")))
    settings = {**SETTINGS}
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=settings) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})],
                            operation_timeout=30)[TOPIC].result(60)
        wait_for_isr(bootstrap, TOPIC, PARTITIONS, BROKERS)
        coordinator = Coordinator(cluster, bootstrap)
        pid, epoch = init_producer_id(cluster.node(BROKERS[0]).address)
        sequences = dict.fromkeys(range(PARTITIONS), 0)
        committed: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        produced: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        kill_at = sorted(rng.sample(range(1, TRANSACTIONS), KILLS))
        killed: int | None = None
        for t in range(TRANSACTIONS):
            if kill_at and t == kill_at[0]:
                kill_at.pop(0)
                if killed is not None:
                    cluster.start(killed)
                    wait_for_isr(bootstrap, TOPIC, PARTITIONS, BROKERS, 120)
                killed = partition_state(bootstrap, TOPIC)[rng.randrange(PARTITIONS)][0]
                cluster.kill(killed, signal.SIGKILL)
                coordinator.leaders.clear()
            values = {p: [b"t%d-p%d-%d" % (t, p, i) for i in range(rng.randint(1, 3))] for p in range(PARTITIONS)}
            for p, vs in values.items():
                coordinator.produce(p, vs, pid, epoch, sequences[p])
                sequences[p] += len(vs)
                produced[p] += vs
            commit = rng.random() < 0.6
            for p in range(PARTITIONS):
                coordinator.end(p, pid, epoch, commit)
                if commit:
                    committed[p] += values[p]
        if killed is not None:
            cluster.start(killed)
            wait_for_isr(bootstrap, TOPIC, PARTITIONS, BROKERS, 120)
        for p in range(PARTITIONS):
            got = [v for _, v in consume("confluent-kafka", bootstrap, TOPIC, p, "read_committed", len(committed[p]))]
            assert got == committed[p], f"partition {p}: read_committed differs"
            got = [v for _, v in consume("confluent-kafka", bootstrap, TOPIC, p, "read_uncommitted",
                                         len(produced[p]))]
            assert got == produced[p], f"partition {p}: read_uncommitted differs"
