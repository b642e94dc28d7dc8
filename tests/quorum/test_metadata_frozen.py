"""The per-partition metadata classes built by `common.frozen.descriptor_init`
behave as the frozen dataclasses they are: the image shares them between
readers, so they must stay immutable, and equality decides what a delta holds."""

from __future__ import annotations

import dataclasses
import pickle
import uuid

import pytest

from quorum.metadata import PartitionRegistration
from quorum.metadata.delta import LocalPartition
from quorum.metadata.records import PartitionChangeRecord, PartitionRecord
from common.frozen import descriptor_init

TOPIC = uuid.UUID(int=42)


def test_positional_keyword_and_default_arguments_build_the_same_registration():
    by_position = PartitionRegistration((1, 2, 3), (1, 2), 1, 4, 9)
    by_keyword = PartitionRegistration(replicas=(1, 2, 3), isr=(1, 2), leader=1, leader_epoch=4, partition_epoch=9)
    assert by_position == by_keyword
    assert hash(by_position) == hash(by_keyword)
    assert by_position.removing_replicas == () and by_position.adding_replicas == ()
    assert by_position != dataclasses.replace(by_position, leader=2)


def test_a_built_record_cannot_be_changed():
    record = PartitionChangeRecord(TOPIC, 3, isr=(1, 2), leader=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.leader = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.isr  # type: ignore[misc]
    assert record.leader == 1 and record.isr == (1, 2) and record.replicas is None


def test_missing_or_unknown_arguments_are_refused_as_by_the_dataclass():
    with pytest.raises(TypeError):
        PartitionRegistration((1, 2, 3), (1, 2), 1, 4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        PartitionRecord(TOPIC, 0, (1,), (1,), 1, 0, 0, colour="red")  # type: ignore[call-arg]


def test_replace_repr_and_pickle_keep_every_field():
    registration = PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 7, 11, removing_replicas=(3,))
    local = LocalPartition("orders", TOPIC, 5, registration)
    assert pickle.loads(pickle.dumps(local)) == local
    assert "removing_replicas=(3,)" in repr(registration)
    moved = dataclasses.replace(registration, leader=3, leader_epoch=8)
    assert (moved.leader, moved.leader_epoch, moved.partition_epoch, moved.removing_replicas) == (3, 8, 11, (3,))


def test_only_frozen_slots_dataclasses_with_plain_fields_are_taken():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithFactory:
        a: list = dataclasses.field(default_factory=list)

    for cls, says in ((NoSlots, "frozen slots dataclasses"), (WithFactory, "plain positional fields")):
        with pytest.raises(TypeError, match=says):
            descriptor_init(cls)
