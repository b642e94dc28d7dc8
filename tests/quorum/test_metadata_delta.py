"""image_delta: what one broker must lead, follow and stop between two images.

The property test against a full scan lives with the history generator in
test_metadata_image.py; these are the scenarios a broker acts on.
"""

import uuid

from quorum.metadata import (
    LoggedRecord,
    MetadataImage,
    PartitionChangeRecord,
    PartitionRecord,
    RemoveTopicRecord,
    TopicRecord,
    image_delta,
)

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def step(image, *records):
    return image.apply([LoggedRecord(image.offset + 1 + i, 1, r) for i, r in enumerate(records)])


def base():
    return step(MetadataImage(),
                TopicRecord("a", A), PartitionRecord(A, 0, (1, 2), (1, 2), 1), PartitionRecord(A, 1, (2, 3), (2, 3), 2),
                TopicRecord("b", B), PartitionRecord(B, 0, (3, 1), (3, 1), 3))


def test_new_topic_makes_leaders_and_followers():
    new = base()
    d1 = image_delta(MetadataImage(), new, 1)
    assert [(x.topic_name, x.partition, x.leader_epoch) for x in d1.leaders] == [("a", 0, 0)]
    assert [(x.topic_name, x.partition, x.leader_id) for x in d1.followers] == [("b", 0, 3)]
    assert d1.stopped == ()
    d2 = image_delta(MetadataImage(), new, 2)
    assert [(x.topic_name, x.partition) for x in d2.leaders] == [("a", 1)]
    assert [(x.topic_name, x.partition) for x in d2.followers] == [("a", 0)]


def test_leader_change_moves_a_partition_between_the_lists():
    old = base()
    new = step(old, PartitionChangeRecord(A, 0, leader=2, isr=(2,)))
    d1, d2, d3 = (image_delta(old, new, b) for b in (1, 2, 3))
    assert d1.leaders == () and [(x.partition, x.leader_id, x.leader_epoch) for x in d1.followers] == [(0, 2, 1)]
    assert [(x.partition, x.leader_epoch, x.registration.isr) for x in d2.leaders] == [(0, 1, (2,))]
    assert d3.empty  # broker 3 hosts nothing that changed


def test_deleted_topic_stops_and_deletes_every_local_replica():
    old = base()
    new = step(old, RemoveTopicRecord(A))
    d2 = image_delta(old, new, 2)
    assert [(s.topic_name, s.partition, s.delete) for s in d2.stopped] == [("a", 0, True), ("a", 1, True)]
    assert d2.leaders == d2.followers == ()


def test_replica_moved_off_the_broker_is_stopped():
    old = base()
    new = step(old, PartitionChangeRecord(B, 0, replicas=(3, 2), isr=(3,)))
    assert [(s.topic_name, s.partition) for s in image_delta(old, new, 1).stopped] == [("b", 0)]
    assert [(f.topic_name, f.leader_id) for f in image_delta(old, new, 2).followers] == [("b", 3)]


def test_unchanged_image_gives_an_empty_delta():
    image = base()
    assert image_delta(image, image, 1).empty
