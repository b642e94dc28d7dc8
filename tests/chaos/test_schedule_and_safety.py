"""The pure parts around the checker: the seeded schedule and the metadata safety checks."""

from __future__ import annotations

import itertools
import random

import pytest

from chaos.safety import leaders_per_epoch, prefix_violations, zk_controllers_per_epoch
from chaos.schedule import NEMESES, Shape, make_schedule

KRAFT = Shape("kraft", (1, 2, 3), (4, 5, 6), 3)
ZK = Shape("zk", (), (4, 5, 6), 3)


def test_one_seed_gives_one_schedule_and_another_seed_another() -> None:
    a = make_schedule(random.Random(42), list(NEMESES), 120, KRAFT)
    b = make_schedule(random.Random(42), list(NEMESES), 120, KRAFT)
    c = make_schedule(random.Random(43), list(NEMESES), 120, KRAFT)
    assert a == b and a != c


@pytest.mark.parametrize("shape", [KRAFT, ZK], ids=["kraft", "zk"])
@pytest.mark.parametrize("seed", range(20))
def test_faults_come_one_at_a_time_within_the_run_and_every_nemesis_is_drawn(shape: Shape, seed: int) -> None:
    faults = make_schedule(random.Random(seed), list(NEMESES), 90, shape)
    assert {f.kind for f in faults} == set(NEMESES)
    for before, after in itertools.pairwise(faults):
        assert before.end < after.start
    assert faults[-1].end <= 90 - 2
    for f in faults:
        if f.target.startswith(("broker:", "controller:")):
            node = int(f.target.split(":")[1])
            assert node in shape.brokers + shape.controllers
        if f.kind == "clock":
            assert abs(f.offset_ms) >= 5000 and f.target.startswith(("broker:", "leader:"))
        if f.kind in ("disk", "eio"):  # only brokers have partition logs
            assert f.target.startswith(("broker:", "leader:"))
        if f.shape == "majority-minority":
            minority, majority = f.groups
            assert set(minority) | set(majority) == set(shape.brokers + shape.controllers)
            voters = shape.controllers or shape.brokers
            assert len(set(minority) & set(voters)) < len(voters) / 2 or not shape.controllers


def test_a_short_run_still_gets_its_faults() -> None:
    faults = make_schedule(random.Random(1), ["kill", "partition"], 20, KRAFT, quiet_s=(2, 3), fault_s=(3, 5))
    assert [f.kind for f in faults][:2] == ["kill", "partition"]


def test_zk_mode_draws_no_kraft_controller() -> None:
    for seed in range(30):
        for f in make_schedule(random.Random(seed), ["kill", "pause"], 120, ZK):
            assert not f.target.startswith("controller:")


def test_an_unknown_nemesis_is_refused() -> None:
    with pytest.raises(ValueError, match="membership"):
        make_schedule(random.Random(1), ["membership"], 60, KRAFT)


LOG = """\
2026 [node 1] INFO quorum.node.driver: node 1: Follower in epoch 1 (leader 3), was Voted in epoch 1
2026 [node 3] INFO quorum.node.driver: node 3: Leader in epoch 1 (leader 3), was Candidate in epoch 1
2026 [node 3] INFO quorum.node.driver: node 3 is the active leader of epoch 1 from offset 5
2026 [node 1] INFO quorum.node.driver: node 1: Leader in epoch 2 (leader 1), was Candidate in epoch 2
"""


def test_leaders_per_epoch_from_the_controllers_logs() -> None:
    assert leaders_per_epoch({1: LOG}) == {1: {3}, 2: {1}}
    two = LOG + "node 2: Leader in epoch 2 (leader 2), was Candidate in epoch 2\n"
    assert leaders_per_epoch({1: two})[2] == {1, 2}


def test_zk_controllers_per_epoch() -> None:
    logs = {4: "broker 4 is the controller at epoch 1\n", 6: "broker 6 is the controller at epoch 2\n"}
    assert zk_controllers_per_epoch(logs) == {1: {4}, 2: {6}}
    logs[5] = "broker 5 is the controller at epoch 2\n"
    assert zk_controllers_per_epoch(logs)[2] == {5, 6}


def test_a_shorter_metadata_log_is_a_prefix_and_a_different_record_is_not() -> None:
    longest = [(0, 1, "a"), (1, 1, "b"), (2, 2, "c")]
    assert prefix_violations({1: longest, 2: longest[:2], 3: longest[1:]}) == []
    found = prefix_violations({1: longest, 2: [(0, 1, "a"), (1, 2, "x")]})
    assert len(found) == 1 and "offset 1" in found[0] and "controller 2" in found[0]


def test_replicas_disagreeing_below_the_high_watermark_are_found_and_above_it_not() -> None:
    from chaos.on_disk import StoredRecord, divergences

    def replica(*values: str) -> dict[int, StoredRecord]:
        return {i: StoredRecord(i, v, 7, 0, i) for i, v in enumerate(values)}

    same = {4: replica("a", "b", "c"), 5: replica("a", "b"), 6: replica("a", "b", "x")}
    assert divergences(same, below=2) == []  # offset 2 is above the high watermark: not yet agreed
    found = divergences(same, below=3)
    assert found == ["offset 2: broker 4 has " + repr(StoredRecord(2, "c", 7, 0, 2))
                     + ", broker 6 has " + repr(StoredRecord(2, "x", 7, 0, 2))]


def test_a_replica_whose_leader_epochs_go_back_is_found() -> None:
    from chaos.on_disk import StoredRecord, epoch_regressions

    def replica(*epochs: int) -> dict[int, StoredRecord]:
        return {i: StoredRecord(i, str(i), 7, 0, i, e) for i, e in enumerate(epochs)}

    assert epoch_regressions({4: replica(0, 0, 1, 3, 3)}) == []
    assert epoch_regressions({4: replica(0, 2, 1), 5: replica(0, 2, 2)}) == [
        "broker 4: offset 1 has leader epoch 2, the later offset 2 has 1"]
