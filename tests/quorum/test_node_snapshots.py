"""Snapshot blobs (CBOR image records with a header and CRC32C), the
quorum-state file, and the applied state built from log bytes."""

from __future__ import annotations

import functools
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller_testing import Cluster
from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.metadata.records import TopicRecord, encode_record
from quorum.node.applier import MetadataState
from quorum.node.quorum_state import QuorumStateFile
from quorum.node.snapshots import (
    CorruptSnapshotError,
    decode_snapshot,
    encode_snapshot,
    image_of_snapshot,
    snapshot_of_image,
)
from quorum.node.workload import alter_config_request, create_topics_request
from quorum.raft.election import ElectionState
from quorum.raft.messages import SnapshotId
from storage.batch import build_batch, build_control_batch


def busy_cluster() -> Cluster:
    c = Cluster()
    for b in (1, 2, 3):
        c.register(b, rack=f"r{b}")
        c.heartbeat(b)
    c.send(create_topics_request([f"t{i}" for i in range(20)], partitions=3))
    c.send(alter_config_request(["t1", "t2"], "retention.ms", "1000"))
    c.heartbeat(2, want_fence=True)
    return c


def test_a_snapshot_rebuilds_the_image_it_was_taken_of():
    image = busy_cluster().image
    snapshot_id = SnapshotId(image.offset + 1, 7)
    rebuilt = image_of_snapshot(snapshot_of_image(image, snapshot_id))
    assert rebuilt.offset == image.offset and rebuilt.epoch == 7
    assert rebuilt.brokers == image.brokers
    assert rebuilt.topics_by_id == image.topics_by_id
    assert rebuilt.topic_ids_by_name == image.topic_ids_by_name
    assert rebuilt.configs == image.configs
    assert rebuilt.broker_replicas == image.broker_replicas


@functools.cache
def busy_snapshot() -> bytes:
    return snapshot_of_image(busy_cluster().image, SnapshotId(100, 2))


@given(st.data())
def test_any_damaged_byte_is_detected(data):
    blob = bytearray(busy_snapshot())
    position = data.draw(st.integers(0, len(blob) - 1))
    blob[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(blob))


@pytest.mark.parametrize("cut", [0, 10, 33, 40])
def test_a_truncated_snapshot_is_refused(cut):
    blob = encode_snapshot([TopicRecord(name="a", topic_id=uuid.uuid4())], SnapshotId(5, 1))
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(blob[:cut] if cut else blob[:-1])


def test_committed_batches_apply_like_the_controller_applied_them_and_skip_control_records():
    c = busy_cluster()
    data = bytearray()
    for chunk in range(0, len(c.log), 7):
        records = [encode_record(r) for r in c.log[chunk:chunk + 7]]
        data += build_batch([(None, r, (), 0) for r in records], base_offset=chunk, partition_leader_epoch=1)
    data += build_control_batch(2, b"leader change", base_offset=len(c.log), partition_leader_epoch=2)
    state, spans = MetadataState().apply(bytes(data))
    assert state.next_offset == len(c.log) + 1 and state.last_epoch == 2
    assert spans[-1].control and not any(s.control for s in spans[:-1])
    assert state.image.topic_ids_by_name == c.image.topic_ids_by_name
    assert state.image.configs == c.image.configs
    assert {b: r.fenced for b, r in state.image.brokers.items()} == {1: False, 2: True, 3: False}
    # Resuming inside a batch (a leader adopted its own image up to there) skips what is applied.
    first_three = MetadataImage().apply([LoggedRecord(i, 1, r) for i, r in enumerate(c.log[:3])])
    resumed, _ = MetadataState(first_three, 3, 1).apply(bytes(data))
    assert resumed.image.topic_ids_by_name == state.image.topic_ids_by_name
    assert resumed.image.brokers == state.image.brokers
    again, _ = state.load_snapshot(snapshot_of_image(state.image, SnapshotId(state.next_offset, 2)))
    assert again.next_offset == state.next_offset and again.image.topics_by_id == state.image.topics_by_id


def test_the_quorum_state_file_is_kafka_json_and_survives_a_rewrite(tmp_path):
    f = QuorumStateFile(str(tmp_path), cluster_id="abc")
    assert f.read() is None
    f.write(ElectionState(3, None, 2, frozenset({1, 2, 3})))
    f.write(ElectionState(4, 1, None, frozenset({1, 2, 3})))
    assert f.read() == ElectionState(4, 1, None, frozenset({1, 2, 3}))
    data = json.loads((tmp_path / "quorum-state").read_text())
    assert data["leaderEpoch"] == 4 and data["leaderId"] == 1 and data["votedId"] == -1
    assert data["clusterId"] == "abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quorum-state"], "no temp file is left behind"
