"""The follower's fetchers: one Fetch per source broker, results into actions,
stale results dropped, backoff, switching leaders within one metadata update."""

from __future__ import annotations

import dataclasses
import uuid

from kio.schema.errors import ErrorCode

from broker.core.replication import (
    EpochEndOffset,
    FetcherManager,
    PartitionFetchResult,
    TopicIdPartition,
)
from broker.core.replication.follower import LEADER_CATCH_UP_RETRY_MS, SESSION_SWEEP_MS, SETTLING_MS, SETTLING_WAIT_MS
from replication_testing import CONFIG, EpochLog

A = TopicIdPartition(uuid.UUID(int=1), 0)
B = TopicIdPartition(uuid.UUID(int=1), 1)
C = TopicIdPartition(uuid.UUID(int=2), 0)


def manager_following(*keys, leader: int = 1, epoch: int = 5) -> FetcherManager:
    manager = FetcherManager(replica_id=3, config=CONFIG)
    for key in keys:
        manager.follow(key, "t", leader, epoch)
    return manager


def test_one_fetch_carries_every_partition_followed_from_a_leader():
    logs = {A: EpochLog.of(0, 0, 2), B: EpochLog(), C: EpochLog.of(1)}
    manager = manager_following(A, B)
    manager.follow(C, "u", 2, 7)
    plan = manager.fetcher(1).build_fetch(logs, broker_epoch=103, now_ms=0)
    assert [(p.key, p.fetch_offset, p.last_fetched_epoch, p.current_leader_epoch) for p in plan.partitions] == [
        (A, 3, 2, 5), (B, 0, -1, 5)]
    assert (plan.source_broker_id, plan.replica_id, plan.broker_epoch) == (1, 3, 103)
    assert manager.fetcher(1).build_fetch(logs, 103, 0) is None, "one Fetch in flight per source broker"
    assert [p.key for p in manager.fetcher(2).build_fetch(logs, 103, 0).partitions] == [C]


def test_records_are_appended_and_the_follower_learns_the_leaders_hw():
    logs = {A: EpochLog.of(0, 0)}
    manager = manager_following(A)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    (action,) = fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.none, 4, 0, None, b"xx")}, logs, 1)
    assert (action.records, action.leader_high_watermark, action.truncate_to) == (b"xx", 4, None)
    assert fetcher.next_wakeup_ms(1) == 1, "ready to fetch again at once"


def test_diverging_epoch_becomes_a_truncation_and_the_next_fetch_starts_there():
    logs = {A: EpochLog.of(0, 0, 0, 3, 3)}
    manager = manager_following(A)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    result = PartitionFetchResult(ErrorCode.none, 2, 0, EpochEndOffset(2, 4))
    (action,) = fetcher.handle_response(plan, {A: result}, logs, 1)
    # We never had epoch 2: cut to where our epoch 0 ends, and ask again.
    assert action.truncate_to == 3 and action.leader_high_watermark is None
    logs[A].truncate_to(3)
    plan = fetcher.build_fetch(logs, 103, 1)
    assert (plan.partitions[0].fetch_offset, plan.partitions[0].last_fetched_epoch) == (3, 0)


def test_a_result_for_an_older_epoch_or_an_older_log_end_is_dropped():
    logs = {A: EpochLog.of(0, 0), B: EpochLog.of(0)}
    manager = manager_following(A, B)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    manager.follow(A, "t", 1, 6)  # a new leader epoch while the Fetch was out
    logs[B].truncate_to(0)          # and B's log changed
    results = {A: PartitionFetchResult(ErrorCode.none, 9, 0, None, b"old"),
               B: PartitionFetchResult(ErrorCode.none, 9, 0, None, b"old")}
    assert fetcher.handle_response(plan, results, logs, 1) == []


def test_a_fenced_epoch_parks_the_partition_until_newer_metadata():
    logs = {A: EpochLog.of(0)}
    manager = manager_following(A)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    (action,) = fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.fenced_leader_epoch)}, logs, 1)
    assert action.error == ErrorCode.fenced_leader_epoch
    assert fetcher.build_fetch(logs, 103, 10_000) is None and fetcher.next_wakeup_ms(10_000) is None
    manager.follow(A, "t", 1, 6)
    assert manager.fetcher(1).build_fetch(logs, 103, 2).partitions[0].current_leader_epoch == 6


def test_errors_and_lost_responses_back_off():
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    manager = manager_following(A, B)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.not_leader_or_follower),
                                   B: PartitionFetchResult(ErrorCode.none, 1, 0)}, logs, 100)
    plan = fetcher.build_fetch(logs, 103, 100)
    assert [p.key for p in plan.partitions] == [B]
    assert fetcher.handle_response(plan, None, logs, 120) == []  # no answer at all
    assert fetcher.build_fetch(logs, 103, 149) is None
    assert fetcher.next_wakeup_ms(121) == 150 == 100 + CONFIG.replica_fetch_backoff_ms
    assert [p.key for p in fetcher.build_fetch(logs, 103, 170).partitions] == [A, B]


def test_a_leader_behind_on_metadata_is_fetched_again_soon_not_after_the_full_backoff():
    # Right after an election the follower may know the new epoch before its
    # new leader does: UNKNOWN_LEADER_EPOCH is retried within a few ms.
    config = dataclasses.replace(CONFIG, replica_fetch_backoff_ms=1000)
    manager = FetcherManager(replica_id=3, config=config)
    manager.follow(A, "t", 1, 6)
    manager.follow(B, "t", 1, 6)
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.unknown_leader_epoch),
                                   B: PartitionFetchResult(ErrorCode.not_leader_or_follower)}, logs, 100)
    assert fetcher.next_wakeup_ms(100) == 100 + LEADER_CATCH_UP_RETRY_MS
    plan = fetcher.build_fetch(logs, 103, 100 + LEADER_CATCH_UP_RETRY_MS)
    assert [p.key for p in plan.partitions] == [A]  # B waits the whole replica.fetch.backoff.ms


def test_a_follower_behind_the_leaders_log_start_starts_over_there():
    logs = {A: EpochLog.of(0, 0)}
    manager = manager_following(A)
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    (action,) = fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.offset_out_of_range, 90, 50)},
                                        logs, 1)
    assert action.start_at == 50


def test_a_new_leader_takes_over_the_partition_within_one_metadata_update():
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    manager = manager_following(A, B, leader=1)
    old = manager.fetcher(1)
    plan = old.build_fetch(logs, 103, 0)
    assert manager.follow(A, "t", 2, 6) == (1, 2)
    new_plan = manager.fetcher(2).build_fetch(logs, 103, 0)
    assert [(p.key, p.current_leader_epoch) for p in new_plan.partitions] == [(A, 6)]
    # The old leader's late answer for A is ignored; B still follows broker 1.
    results = {A: PartitionFetchResult(ErrorCode.none, 5, 0, None, b"stale"),
               B: PartitionFetchResult(ErrorCode.none, 1, 0)}
    assert [a.key for a in old.handle_response(plan, results, logs, 1)] == [B]
    # Leading (or no leader) stops fetching; an emptied fetcher goes away.
    assert manager.follow(B, "t", 3, 7) == (1, None)
    assert manager.fetcher(1) is None and manager.source_of(B) is None


def test_a_partition_retried_soon_is_not_held_behind_a_long_poll_of_the_others():
    # After an election the new leader answers UNKNOWN_LEADER_EPOCH for the
    # partitions it has not applied yet; the Fetch for the rest must come back
    # by the time those may be retried, not after replica.fetch.wait.max.ms.
    config = dataclasses.replace(CONFIG, replica_fetch_backoff_ms=1000, replica_fetch_wait_max_ms=500)
    manager = FetcherManager(replica_id=3, config=config)
    for key in (A, B, C):
        manager.follow(key, "t", 1, 6)
    logs = {A: EpochLog.of(0), B: EpochLog.of(0), C: EpochLog.of(0)}
    fetcher = manager.fetcher(1)
    t = SETTLING_MS  # past the short polls that follow new partitions (the next test)
    fetcher.handle_response(fetcher.build_fetch(logs, 103, 0), {}, logs, 0)
    plan = fetcher.build_fetch(logs, 103, t)
    assert plan.max_wait_ms == 500
    fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.unknown_leader_epoch),
                                   B: PartitionFetchResult(ErrorCode.none, 1, 0),
                                   C: PartitionFetchResult(ErrorCode.none, 1, 0)}, logs, t + 100)
    plan = fetcher.build_fetch(logs, 103, t + 110)
    assert [p.key for p in plan.partitions] == [B, C]
    assert plan.max_wait_ms == 100 + LEADER_CATCH_UP_RETRY_MS - 110
    fetcher.handle_response(plan, {B: PartitionFetchResult(ErrorCode.none, 1, 0),
                                   C: PartitionFetchResult(ErrorCode.not_leader_or_follower)}, logs, t + 125)
    # A is ready again; C's full backoff does not cut the long poll short below it.
    plan = fetcher.build_fetch(logs, 103, t + 125)
    assert [p.key for p in plan.partitions] == [A, B]
    assert plan.max_wait_ms == 500


def test_while_partitions_are_being_added_the_leader_may_hold_a_fetch_only_briefly():
    # A fenced broker's partitions come in metadata batches; one added while
    # a Fetch is parked at the leader waits for its answer.
    manager = FetcherManager(replica_id=3, config=dataclasses.replace(CONFIG, replica_fetch_wait_max_ms=500))
    manager.follow(A, "t", 1, 6)
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    fetcher = manager.fetcher(1)
    plan = fetcher.build_fetch(logs, 103, 0)
    assert plan.max_wait_ms == SETTLING_WAIT_MS
    fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.none, 0, 0)}, logs, 10, session_id=7)
    manager.follow(B, "t", 1, 6)  # the next batch, 300 ms later
    plan = fetcher.build_fetch(logs, 103, 300)
    assert [p.key for p in plan.partitions] == [B] and plan.max_wait_ms == SETTLING_WAIT_MS
    fetcher.handle_response(plan, {}, logs, 320)
    # Settled: nothing new for SETTLING_MS since B came: long polls again.
    assert fetcher.build_fetch(logs, 103, 300 + SETTLING_MS - 1).max_wait_ms == SETTLING_WAIT_MS
    fetcher.handle_response(fetcher.in_flight, {}, logs, 300 + SETTLING_MS)
    assert fetcher.build_fetch(logs, 103, 300 + SETTLING_MS).max_wait_ms == 500


# --- fetch sessions (KIP-227) ------------------------------------------------

def test_once_the_leader_grants_a_session_a_fetch_names_only_what_changed():
    logs = {A: EpochLog.of(0, 0), B: EpochLog.of(0)}
    fetcher = manager_following(A, B).fetcher(1)
    full = fetcher.build_fetch(logs, 103, 0)
    assert (full.session_id, full.session_epoch, [p.key for p in full.partitions]) == (0, 0, [A, B])
    fetcher.handle_response(full, {}, logs, 1, session_id=77)

    idle = fetcher.build_fetch(logs, 103, 2)
    assert (idle.session_id, idle.session_epoch, idle.partitions, idle.forgotten) == (77, 1, (), ())
    assert set(idle.view) == {A, B}, "the leader still holds both"
    # The leader answers a partition the fetch did not name: its records are appended.
    (action,) = fetcher.handle_response(idle, {B: PartitionFetchResult(ErrorCode.none, 1, 0, None, b"b")}, logs, 3)
    assert (action.key, action.records) == (B, b"b")
    logs[B].append(1, 0)
    fetcher.log_changed(B)  # as the shell does after the append

    moved = fetcher.build_fetch(logs, 103, 4)
    assert (moved.session_epoch, [(p.key, p.fetch_offset) for p in moved.partitions]) == (2, [(B, 2)])


def test_a_position_change_nobody_marked_is_sent_by_the_next_sweep():
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    fetcher = manager_following(A, B).fetcher(1)
    fetcher.handle_response(fetcher.build_fetch(logs, 103, 0), {}, logs, 1, session_id=9)
    logs[A].append(2, 0)  # not marked
    plan = fetcher.build_fetch(logs, 103, 2)
    assert plan.partitions == ()
    fetcher.handle_response(plan, {}, logs, 3)
    swept = fetcher.build_fetch(logs, 103, SESSION_SWEEP_MS)
    assert [(p.key, p.fetch_offset) for p in swept.partitions] == [(A, 3)]


def test_a_partition_backing_off_is_forgotten_and_named_again_when_ready():
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    fetcher = manager_following(A, B).fetcher(1)
    fetcher.handle_response(fetcher.build_fetch(logs, 103, 0), {}, logs, 1, session_id=9)
    plan = fetcher.build_fetch(logs, 103, 2)
    fetcher.handle_response(plan, {A: PartitionFetchResult(ErrorCode.not_leader_or_follower)}, logs, 3)
    forgets = fetcher.build_fetch(logs, 103, 4)
    assert ([p.key for p in forgets.forgotten], forgets.partitions, set(forgets.view)) == ([A], (), {B})
    fetcher.handle_response(forgets, {}, logs, 5)
    back = fetcher.build_fetch(logs, 103, 3 + CONFIG.replica_fetch_backoff_ms)
    assert ([p.key for p in back.partitions], back.forgotten, back.session_epoch) == ([A], (), 3)


def test_a_failed_fetch_or_a_lost_session_starts_over_with_a_full_fetch():
    logs = {A: EpochLog.of(0), B: EpochLog.of(0)}
    fetcher = manager_following(A, B).fetcher(1)
    fetcher.handle_response(fetcher.build_fetch(logs, 103, 0), {}, logs, 1, session_id=9)
    plan = fetcher.build_fetch(logs, 103, 2)
    fetcher.on_session_error(plan)  # FETCH_SESSION_ID_NOT_FOUND: at once, no backoff
    full = fetcher.build_fetch(logs, 103, 2)
    assert (full.session_id, full.session_epoch, [p.key for p in full.partitions]) == (0, 0, [A, B])
    fetcher.handle_response(full, {}, logs, 3, session_id=10)
    plan = fetcher.build_fetch(logs, 103, 4)
    assert plan.session_id == 10
    fetcher.handle_response(plan, None, logs, 5)  # no answer: backoff, then a full fetch
    assert fetcher.build_fetch(logs, 103, 6) is None
    again = fetcher.build_fetch(logs, 103, 5 + CONFIG.replica_fetch_backoff_ms)
    assert (again.session_id, [p.key for p in again.partitions]) == (0, [A, B])


def test_a_leader_that_grants_no_session_gets_full_fetches():
    logs = {A: EpochLog.of(0)}
    fetcher = manager_following(A).fetcher(1)
    fetcher.handle_response(fetcher.build_fetch(logs, 103, 0), {}, logs, 1, session_id=0)
    plan = fetcher.build_fetch(logs, 103, 2)
    assert (plan.session_id, plan.session_epoch, [p.key for p in plan.partitions]) == (0, 0, [A])
