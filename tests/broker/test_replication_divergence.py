"""Finding the common prefix of a follower's and a leader's log by leader epoch.

Table-driven checks of both halves (the leader's DivergingEpoch answer, the
follower's truncation point), then an oracle check: logs grown by a random
history of elections, appends and partial replications, where the
Fetch/DivergingEpoch/truncate loop must stop exactly at the longest common
prefix -- never below it (losing shared records), never above it (keeping
records the leader does not have)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.core.replication import EpochEndOffset, truncation_offset, validate_fetch_position
from replication_testing import EpochLog, fetch, leader_partition

LEADER = (0, 0, 0, 2, 2, 4, 4, 4)  # epoch of each offset: 0 at 0..2, 2 at 3..4, 4 at 5..7


@pytest.mark.parametrize("fetch_offset, last_epoch, expected", [
    (8, 4, None),                        # caught up
    (5, 2, None),                        # at the end of epoch 2: a prefix
    (3, 0, None),                        # at the end of epoch 0
    (0, -1, None),                       # an empty follower log
    (6, 2, EpochEndOffset(2, 5)),        # more of epoch 2 than the leader has
    (4, 3, EpochEndOffset(2, 5)),        # an epoch the leader never saw: its nearest older one
    (2, 1, EpochEndOffset(0, 3)),        # likewise, below
    (9, 4, EpochEndOffset(4, 8)),        # past the leader's end in its own latest epoch
])
def test_leader_answer(fetch_offset, last_epoch, expected):
    assert validate_fetch_position(EpochLog.of(*LEADER), fetch_offset, last_epoch) == expected


def test_a_follower_with_an_epoch_newer_than_the_leaders_is_told_the_leader_is_behind():
    """It followed a newer leader: our metadata is stale, the follower retries."""
    log = EpochLog.of(0, 0, 2)
    p = leader_partition(log, leader_epoch=5)
    decision = p.handle_replica_fetch(fetch(2, 3, last_epoch=6, leader_epoch=5), log, 0)
    assert decision.error == ErrorCode.unknown_leader_epoch and decision.diverging_epoch is None


@pytest.mark.parametrize("follower, diverging, expected", [
    ((0, 0, 0, 2, 2, 2, 2), (2, 5), (5, True)),    # same epoch, the leader's is shorter
    ((0, 0, 0, 2, 2), (2, 7), (5, True)),          # same epoch, ours is shorter: keep all
    ((0, 0, 0, 3, 3), (2, 5), (3, False)),         # we never had epoch 2: cut to our end of 0, ask again
    ((1, 1, 1), (0, 2), (0, True)),                # our first epoch is after the leader's: nothing shared
    ((0, 0, 0, 0, 0), (0, 3), (3, True)),          # our latest epoch is longer
    ((), (0, 3), (0, True)),                       # an empty log
])
def test_follower_truncation(follower, diverging, expected):
    assert truncation_offset(EpochLog.of(*follower), EpochEndOffset(*diverging)) == expected


def test_truncation_never_goes_past_the_follower_log_end():
    log = EpochLog.of(0, 0)
    assert truncation_offset(log, EpochEndOffset(0, 10)) == (2, True)


# --- oracle: random histories ------------------------------------------------------------

REPLICAS = 3


@st.composite
def histories(draw):
    """A leader-epoch history over 3 replicas: ("elect", r), ("append", n), ("copy", r, n)."""
    steps = [("elect", draw(st.integers(0, REPLICAS - 1)))]
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["elect", "append", "append", "copy", "copy"]))
        if kind == "elect":
            steps.append(("elect", draw(st.integers(0, REPLICAS - 1))))
        elif kind == "append":
            steps.append(("append", draw(st.integers(1, 4))))
        else:
            steps.append(("copy", draw(st.integers(0, REPLICAS - 1)), draw(st.integers(0, 6))))
    return steps


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def converge(follower: EpochLog, leader: EpochLog) -> int:
    """Run Fetch -> DivergingEpoch -> truncate until the leader accepts the
    follower's position; return the number of round trips."""
    for rounds in range(1, 50):
        # As the fetcher sends it: the newest epoch of the log's epoch cache.
        diverging = validate_fetch_position(leader, follower.log_end_offset, follower.latest_epoch)
        if diverging is None:
            return rounds
        before = (follower.log_end_offset, follower.latest_epoch)
        offset, _complete = truncation_offset(follower, diverging)
        follower.truncate_to(offset)
        assert (follower.log_end_offset, follower.latest_epoch) < before, "no progress: it would loop forever"
    raise AssertionError("no convergence in 50 round trips")


def copy_from(follower: EpochLog, leader: EpochLog, count: int) -> None:
    epochs = leader.epochs()
    for offset in range(follower.log_end_offset, min(follower.log_end_offset + count, leader.log_end_offset)):
        follower.append(1, epochs[offset])


def run_history(steps) -> tuple[list[EpochLog], int]:
    logs = [EpochLog() for _ in range(REPLICAS)]
    leader, epoch = 0, -1
    for step in steps:
        if step[0] == "elect":
            leader, epoch = step[1], epoch + 1
            # KIP-101: the new leader's epoch starts at its log end offset.
            logs[leader].epoch_cache.assign(epoch, logs[leader].log_end_offset)
        elif step[0] == "append":
            logs[leader].append(step[1], epoch)
        elif step[1] != leader:
            converge(logs[step[1]], logs[leader])
            copy_from(logs[step[1]], logs[leader], step[2])
    return logs, leader


@given(histories())
def test_the_fetch_loop_truncates_exactly_to_the_longest_common_prefix(steps):
    logs, leader = run_history(steps)
    for r in range(REPLICAS):
        if r == leader:
            continue
        follower = logs[r]
        expected = common_prefix(follower.epochs(), logs[leader].epochs())
        entries = len(follower.epoch_cache.entries)
        rounds = converge(follower, logs[leader])
        assert follower.log_end_offset == expected, (follower.epochs(), logs[leader].epochs())
        # Each round trip drops at least one epoch of the follower's.
        assert rounds <= entries + 1
        copy_from(follower, logs[leader], 10**6)
        assert follower.epochs() == logs[leader].epochs()
