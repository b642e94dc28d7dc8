"""Transaction markers replicate: after the leader dies, the follower that
takes over has the same LSO, the same open transaction and the same
`.txnindex` (one controller, two brokers, RF=2).

The partition holds an aborted transaction (0..1, ABORT marker at 2), a
plain record (3) and an open transaction (4); the test plays the
coordinator (`txn_partition_testing`).
"""

from __future__ import annotations

import struct

from kio.schema.errors import ErrorCode

from cluster import LocalCluster
from cluster_replication_testing import SETTINGS, partition_state, wait_for, wait_for_isr
from txn_partition_testing import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    consume,
    init_producer_id,
    latest_offset,
    produce,
    write_markers,
)

TOPIC = "txn-rf2"
BROKERS = (2, 3)


def test_the_new_leader_has_the_same_lso_and_aborted_index(tmp_path) -> None:
    settings = {**SETTINGS, "offsets.topic.replication.factor": "2"}
    with LocalCluster(tmp_path, controllers=1, brokers=2, overrides=settings) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 2)], operation_timeout=30)[TOPIC].result(60)
        wait_for_isr(bootstrap, TOPIC, 1, BROKERS)
        leader = partition_state(bootstrap, TOPIC)[0][0]
        (follower,) = [b for b in BROKERS if b != leader]
        client_bootstrap = bootstrap
        bootstrap = cluster.node(leader).address  # the raw requests go to the partition's leader
        pid, epoch = init_producer_id(bootstrap)
        assert produce(bootstrap, TOPIC, 0, [b"x0", b"x1"], producer_id=pid, producer_epoch=epoch, sequence=0,
                       transactional=True) == (ErrorCode.none, 0)
        assert write_markers(bootstrap, pid, epoch, False, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        assert produce(bootstrap, TOPIC, 0, [b"plain"]) == (ErrorCode.none, 3)
        assert produce(bootstrap, TOPIC, 0, [b"y0"], producer_id=pid, producer_epoch=epoch, sequence=2,
                       transactional=True) == (ErrorCode.none, 4)
        assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 4
        cluster.kill(leader)
        wait_for("the follower leads", lambda: partition_state(client_bootstrap, TOPIC)[0][0] == follower)
        bootstrap = cluster.node(follower).address
        wait_for("the new leader's HW reaches its log end",
                 lambda: latest_offset(bootstrap, TOPIC, 0, READ_UNCOMMITTED) == 5)
        assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 4
        pdir = cluster.node(follower).log_dir / f"{TOPIC}-0"
        (index,) = [f for f in pdir.iterdir() if f.suffix == ".txnindex"]
        assert struct.unpack(">hqqqq", index.read_bytes()) == (0, pid, 0, 2, 3)
        assert consume("aiokafka", bootstrap, TOPIC, 0, "read_committed", 1) == [(3, b"plain")]
        # The open transaction moved with the partition: its commit lands on the new leader.
        assert write_markers(bootstrap, pid, epoch, True, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 6
        assert consume("confluent-kafka", bootstrap, TOPIC, 0, "read_committed", 2) == [(3, b"plain"), (4, b"y0")]
