"""ZooKeeper mode serves the partition side of transactions with the same
code: a transactional produce, WriteTxnMarkers (abort, then commit) and a
read_committed consumer, against a real ZooKeeper and broker process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from cluster import LocalCluster
from quorum.zookeeper.ensemble import zookeeper_missing_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from txn_partition_testing import (  # noqa: E402
    READ_COMMITTED,
    consume,
    init_producer_id,
    latest_offset,
    produce,
    write_markers,
)

TOPIC = "zk-txn"


def test_markers_and_read_committed_in_zookeeper_mode(tmp_path) -> None:
    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"ZooKeeper mode needs a local ZooKeeper: {reason}")
    with LocalCluster(tmp_path, controllers=1, brokers=1, mode="zk", zookeeper_tick_time_ms=500) as cluster:
        cluster.start_all()
        cluster.wait_ready(120)
        bootstrap = cluster.bootstrap
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 1, 1)], operation_timeout=30)[TOPIC].result(60)
        pid, epoch = init_producer_id(bootstrap)
        assert produce(bootstrap, TOPIC, 0, [b"x"], producer_id=pid, producer_epoch=epoch, sequence=0,
                       transactional=True) == (ErrorCode.none, 0)
        assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 0
        assert write_markers(bootstrap, pid, epoch, False, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        assert produce(bootstrap, TOPIC, 0, [b"y"], producer_id=pid, producer_epoch=epoch, sequence=1,
                       transactional=True) == (ErrorCode.none, 2)
        assert write_markers(bootstrap, pid, epoch, True, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 4
        assert consume("confluent-kafka", bootstrap, TOPIC, 0, "read_committed", 1) == [(2, b"y")]
