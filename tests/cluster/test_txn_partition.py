"""The partition side of transactions against a real `raftka dev` process.

The test plays the transaction coordinator (`txn_partition_testing`): a
producer id from InitProducerId, transactional batches, WriteTxnMarkers.
The partition then holds, offset by offset:

    0..2  transaction A (committed)      3  COMMIT marker
    4..5  transaction B (aborted)        6  ABORT marker
    7..8  plain records (no producer id)
    9     transaction C (still open)

so a read_committed consumer of each client reads A and the plain records
and stops at the LSO (9); a read_uncommitted one reads every data record,
and neither sees an offset for the markers. Then the broker is killed
with SIGKILL, its snapshots and `.txnindex` files deleted, and restarted:
recovery rebuilds both from the log, and the LSO and aborted list are
those of before.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from kio.schema.errors import ErrorCode

from cluster_group_testing import DevNode
from cluster_testing import confluent_create
from txn_partition_testing import (
    CONSUMERS,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    consume,
    describe_producers,
    init_producer_id,
    latest_offset,
    offset_fetch,
    offsets_partition,
    produce,
    txn_offset_commit,
    write_markers,
)

TOPIC = "txn"
A = [b"a0", b"a1", b"a2"]
B = [b"b0", b"b1"]
PLAIN = [b"p0", b"p1"]
C = [b"c0"]
COMMITTED = list(zip([0, 1, 2, 7, 8], A + PLAIN))
#: A restarted node registers again once its old session expired: keep it short.
SETTINGS = ("broker.session.timeout.ms=2000", "broker.heartbeat.interval.ms=300")
EVERYTHING = list(zip([0, 1, 2, 4, 5, 7, 8, 9], A + B + PLAIN + C))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    root = tmp_path_factory.mktemp("txn-partition")
    node = DevNode(root / "data", *SETTINGS)
    state = {"node": node, "root": root}
    try:
        bootstrap = node.bootstrap
        confluent_create(bootstrap, TOPIC, 1)
        pid, epoch = init_producer_id(bootstrap)
        state["pid"] = pid
        assert produce(bootstrap, TOPIC, 0, A, producer_id=pid, producer_epoch=epoch, sequence=0,
                       transactional=True) == (ErrorCode.none, 0)
        state["lso_open_a"] = latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED)
        state["hw_open_a"] = latest_offset(bootstrap, TOPIC, 0, READ_UNCOMMITTED)
        assert write_markers(bootstrap, pid, epoch, True, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        state["lso_after_a"] = latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED)
        assert produce(bootstrap, TOPIC, 0, B, producer_id=pid, producer_epoch=epoch, sequence=3,
                       transactional=True) == (ErrorCode.none, 4)
        assert write_markers(bootstrap, pid, epoch, False, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
        assert produce(bootstrap, TOPIC, 0, PLAIN) == (ErrorCode.none, 7)
        assert produce(bootstrap, TOPIC, 0, C, producer_id=pid, producer_epoch=epoch, sequence=5,
                       transactional=True) == (ErrorCode.none, 9)
        yield state
    finally:
        state["node"].kill()
        if not any(getattr(state["node"], "failed", ())):
            shutil.rmtree(root, ignore_errors=True)


def test_lso_stays_at_the_open_transactions_first_offset_until_its_marker(scenario):
    assert scenario["hw_open_a"] == 3
    assert scenario["lso_open_a"] == 0
    assert scenario["lso_after_a"] == 4
    bootstrap = scenario["node"].bootstrap
    assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 9
    assert latest_offset(bootstrap, TOPIC, 0, READ_UNCOMMITTED) == 10


@pytest.mark.parametrize("client", CONSUMERS)
def test_read_committed_sees_exactly_the_committed_records(scenario, client):
    got = consume(client, scenario["node"].bootstrap, TOPIC, 0, "read_committed", len(COMMITTED))
    assert got == COMMITTED


@pytest.mark.parametrize("client", CONSUMERS)
def test_read_uncommitted_sees_every_record_and_markers_take_offsets(scenario, client):
    got = consume(client, scenario["node"].bootstrap, TOPIC, 0, "read_uncommitted", len(EVERYTHING))
    assert got == EVERYTHING


def test_describe_producers_shows_the_open_transaction(scenario):
    producers = describe_producers(scenario["node"].bootstrap, TOPIC, 0)
    p = producers[scenario["pid"]]
    assert (p.producer_epoch, p.last_sequence, p.current_txn_start_offset) == (0, 5, 9)


def test_stale_epochs_are_refused_and_change_nothing(scenario):
    bootstrap = scenario["node"].bootstrap
    confluent_create(bootstrap, "fence", 1)
    pid, epoch = init_producer_id(bootstrap)
    assert produce(bootstrap, "fence", 0, [b"x"], producer_id=pid, producer_epoch=epoch, sequence=0,
                   transactional=True) == (ErrorCode.none, 0)
    # The coordinator aborts with a bumped producer epoch (as on a timeout) at coordinator epoch 5.
    assert write_markers(bootstrap, pid, epoch + 1, False, {"fence": [0]}, coordinator_epoch=5) == {
        ("fence", 0): ErrorCode.none}
    # The old producer instance is fenced on produce and on markers...
    error, _ = produce(bootstrap, "fence", 0, [b"y"], producer_id=pid, producer_epoch=epoch, sequence=1,
                       transactional=True)
    assert error == ErrorCode.invalid_producer_epoch
    assert write_markers(bootstrap, pid, epoch, True, {"fence": [0]}, coordinator_epoch=5) == {
        ("fence", 0): ErrorCode.invalid_producer_epoch}
    # ...and an older coordinator too.
    assert write_markers(bootstrap, pid, epoch + 1, True, {"fence": [0]}, coordinator_epoch=4) == {
        ("fence", 0): ErrorCode.transaction_coordinator_fenced}
    # A write outside a transaction while one is open.
    assert produce(bootstrap, "fence", 0, [b"z"], producer_id=pid, producer_epoch=epoch + 1, sequence=0,
                   transactional=True) == (ErrorCode.none, 2)
    error, _ = produce(bootstrap, "fence", 0, [b"w"], producer_id=pid, producer_epoch=epoch + 1, sequence=1)
    assert error == ErrorCode.invalid_txn_state
    assert latest_offset(bootstrap, "fence", 0, READ_UNCOMMITTED) == 3
    assert latest_offset(bootstrap, "fence", 0, READ_COMMITTED) == 2
    assert write_markers(bootstrap, pid, epoch, True, {"nope": [0]}) == {
        ("nope", 0): ErrorCode.unknown_topic_or_partition}


GROUP = "txn-group"
OFFSETS = "__consumer_offsets"


def confluent_committed(bootstrap: str, isolation: str, timeout_s: float = 10) -> int:
    """The group's committed offset of TOPIC-0 as a confluent-kafka consumer sees it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "isolation.level": isolation,
                         "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(TOPIC, 0)], timeout=timeout_s)
        return tp.offset
    finally:
        consumer.close()


def test_txn_offset_commit_is_pending_until_its_marker(scenario):
    bootstrap = scenario["node"].bootstrap
    offsets_p = offsets_partition(GROUP)
    pid, epoch = init_producer_id(bootstrap)
    scenario["group_pid"] = pid
    assert txn_offset_commit(bootstrap, GROUP, pid, epoch, {(TOPIC, 0): 3}) == {ErrorCode.none}
    # Pending: not committed yet, and unstable for a require_stable fetch (KIP-447).
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=False) == (-1, ErrorCode.none)
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True)[1] == ErrorCode.unstable_offset_commit
    # librdkafka asks for stable offsets when read_committed, and retries while they are not.
    assert confluent_committed(bootstrap, "read_uncommitted") == -1001  # no offset yet
    with pytest.raises(KafkaException, match="Timed out"):
        confluent_committed(bootstrap, "read_committed", timeout_s=2)
    assert write_markers(bootstrap, pid, epoch, True, {OFFSETS: [offsets_p]}) == {
        (OFFSETS, offsets_p): ErrorCode.none}
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True) == (3, ErrorCode.none)
    assert confluent_committed(bootstrap, "read_committed") == 3
    # An aborted transaction's offsets are dropped.
    assert txn_offset_commit(bootstrap, GROUP, pid, epoch, {(TOPIC, 0): 7}) == {ErrorCode.none}
    assert write_markers(bootstrap, pid, epoch, False, {OFFSETS: [offsets_p]}) == {
        (OFFSETS, offsets_p): ErrorCode.none}
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True) == (3, ErrorCode.none)
    # The coordinator bumped the epoch: the old one is fenced.
    assert txn_offset_commit(bootstrap, GROUP, pid, epoch + 1, {(TOPIC, 0): 8}) == {ErrorCode.none}
    assert txn_offset_commit(bootstrap, GROUP, pid, epoch, {(TOPIC, 0): 9}) == {ErrorCode.invalid_producer_epoch}
    # Left open for the restart below: it must still be pending after it.
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True)[1] == ErrorCode.unstable_offset_commit
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=False) == (3, ErrorCode.none)


def _partition_dir(root: Path) -> Path:
    (found,) = [p for p in root.rglob(f"{TOPIC}-0") if p.is_dir()]
    return found


def test_sigkill_and_restart_rebuilds_the_lso_and_the_aborted_index(scenario):
    node = scenario["node"]
    root = scenario["root"]
    node.kill()
    pdir = _partition_dir(root)
    for f in list(pdir.iterdir()):
        if f.suffix in (".txnindex", ".snapshot"):
            f.unlink()
    node = scenario["node"] = DevNode(root / "data", *SETTINGS)
    bootstrap = node.bootstrap
    assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 9
    assert latest_offset(bootstrap, TOPIC, 0, READ_UNCOMMITTED) == 10
    (index,) = [f for f in pdir.iterdir() if f.suffix == ".txnindex"]
    # Kafka's entry: version, producer id, first offset, last offset (the marker), last stable offset.
    assert struct.unpack(">hqqqq", index.read_bytes()) == (0, scenario["pid"], 4, 6, 7)
    got = consume("confluent-kafka", bootstrap, TOPIC, 0, "read_committed", len(COMMITTED))
    assert got == COMMITTED
    # The open transaction survived too: its commit makes C visible.
    assert write_markers(bootstrap, scenario["pid"], 0, True, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.none}
    assert latest_offset(bootstrap, TOPIC, 0, READ_COMMITTED) == 11
    got = consume("kafka-python", bootstrap, TOPIC, 0, "read_committed", len(COMMITTED) + 1)
    assert got == COMMITTED + [(9, b"c0")]
    # The group coordinator replayed its partition: committed offset 3, the open commit (8) pending.
    group_pid = scenario["group_pid"]
    offsets_p = offsets_partition(GROUP)
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=False) == (3, ErrorCode.none)
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True)[1] == ErrorCode.unstable_offset_commit
    assert write_markers(bootstrap, group_pid, 1, True, {OFFSETS: [offsets_p]}) == {
        (OFFSETS, offsets_p): ErrorCode.none}
    assert offset_fetch(bootstrap, GROUP, TOPIC, 0, require_stable=True) == (8, ErrorCode.none)
