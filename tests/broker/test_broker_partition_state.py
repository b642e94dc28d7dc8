"""The pure partition core: transitions, the high watermark rule, epoch checks."""

import ast
import pathlib
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.partition import PartitionState, Role
from quorum.metadata import PartitionRegistration

TOPIC_ID = uuid.UUID(int=7)


def registration(leader=1, epoch=0, replicas=(1, 2, 3), isr=None, partition_epoch=0):
    return PartitionRegistration(replicas=replicas, isr=replicas if isr is None else isr, leader=leader,
                                 leader_epoch=epoch, partition_epoch=partition_epoch)


def leader_state(replicas=(1, 2, 3), isr=None, leo=10, min_isr=1, checkpoint=None):
    state = PartitionState("t", 0, TOPIC_ID, broker_id=1, min_insync_replicas=min_isr)
    state.apply_registration(registration(replicas=replicas, isr=isr), leo, checkpoint)
    return state


def test_single_replica_leader_high_watermark_follows_appends():
    state = leader_state(replicas=(1,), leo=0)
    assert state.high_watermark == 0
    assert state.on_leader_append(5) and state.high_watermark == 5


def test_new_leader_starts_from_checkpoint_and_waits_for_followers():
    state = leader_state(leo=10, checkpoint=4)
    assert (state.role, state.high_watermark) == (Role.LEADER, 4)
    assert not state.on_follower_fetch(2, 10, now_ms=1)  # 3 has not fetched yet
    assert state.on_follower_fetch(3, 7, now_ms=1) and state.high_watermark == 7
    assert state.on_follower_fetch(3, 10, now_ms=2) and state.high_watermark == 10
    assert state.followers[3].last_caught_up_ms == 2


def test_high_watermark_held_below_min_insync_replicas():
    state = leader_state(replicas=(1, 2), isr=(1,), leo=0, min_isr=2)
    state.on_leader_append(3)
    assert state.high_watermark == 0
    assert state.produce_error(acks=-1) == ErrorCode.not_enough_replicas
    assert state.produce_error(acks=1) == ErrorCode.none


def test_leader_epoch_checks():
    state = leader_state()
    state.apply_registration(registration(epoch=5), 10, None)
    assert state.check_leader_epoch(-1) == ErrorCode.none
    assert state.check_leader_epoch(5) == ErrorCode.none
    assert state.check_leader_epoch(4) == ErrorCode.fenced_leader_epoch
    assert state.check_leader_epoch(6) == ErrorCode.unknown_leader_epoch
    assert state.fetch_error(4) == ErrorCode.fenced_leader_epoch
    assert state.fetch_error(-1, replica_id=9) == ErrorCode.not_leader_or_follower
    assert state.fetch_error(-1, replica_id=2) == ErrorCode.none


def test_leader_to_follower_and_back():
    state = leader_state()
    state.on_follower_fetch(2, 10, 0)
    state.apply_registration(registration(leader=2, epoch=1), 10, None)
    assert state.role is Role.FOLLOWER and state.followers == {}
    assert state.produce_error(1) == ErrorCode.not_leader_or_follower
    assert state.acks_all_error(3) == ErrorCode.not_leader_or_follower
    state.apply_registration(registration(leader=1, epoch=2), 10, None)
    assert state.role is Role.LEADER and set(state.followers) == {2, 3}
    assert all(f.log_end_offset == -1 for f in state.followers.values())


def test_isr_change_in_the_same_epoch_keeps_follower_progress():
    state = leader_state(leo=10)
    state.on_follower_fetch(2, 8, 0)
    state.apply_registration(registration(isr=(1, 2), partition_epoch=1), 10, None)
    assert state.followers[2].log_end_offset == 8 and state.high_watermark == 8


def test_stopped_replica_refuses_everything():
    state = leader_state()
    state.stop()
    assert state.produce_error(1) == ErrorCode.not_leader_or_follower
    assert state.fetch_error(-1) == ErrorCode.not_leader_or_follower


events = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 5)),
    st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 60)),
    st.tuples(st.just("isr"), st.sampled_from([(1,), (1, 2), (1, 3), (1, 2, 3)])),
), max_size=60)


@given(events, st.integers(1, 3))
def test_high_watermark_is_monotonic_and_below_every_isr_leo(script, min_isr):
    state = leader_state(leo=0, min_isr=min_isr)
    leo = 0
    fetched = {2: -1, 3: -1}
    partition_epoch = 0
    for event in script:
        before = state.high_watermark
        if event[0] == "append":
            leo += event[1]
            state.on_leader_append(leo)
        elif event[0] == "fetch":
            # A follower never fetches past the leader's log end.
            offset = min(event[2], leo)
            fetched[event[1]] = offset
            state.on_follower_fetch(event[1], offset, 0)
        else:
            partition_epoch += 1
            state.apply_registration(registration(isr=event[1], partition_epoch=partition_epoch), leo, None)
        assert state.high_watermark >= before
        if state.high_watermark > before:
            assert len(state.isr) >= min_isr
            for replica in state.isr:
                assert (leo if replica == 1 else fetched[replica]) >= state.high_watermark
        assert state.high_watermark <= leo


@pytest.mark.parametrize("module", ["partition.py", "codec.py", "kio_util.py"])
def test_pure_cores_do_no_io(module):
    tree = ast.parse((pathlib.Path(__file__).parents[2] / "broker" / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"trio", "socket", "time", "os", "random", "asyncio"}

