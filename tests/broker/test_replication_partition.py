"""Partition role transitions, the follower HW, client checks, and what an
unclean leader election costs."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from broker.core.replication import EpochEndOffset, Partition, Role, eligible_brokers, truncation_offset
from quorum.metadata import BrokerRegistration, MetadataImage, PMap
from replication_testing import ALL_ELIGIBLE, CONFIG, TOPIC_ID, EpochLog, fetch, leader_partition, registration


def follower_partition(log: EpochLog, leader: int = 1, leader_epoch: int = 5, broker_id: int = 2, **kw) -> Partition:
    p = Partition("t", 0, TOPIC_ID, broker_id, CONFIG, min_insync_replicas=2)
    change = p.apply_registration(registration(leader=leader, leader_epoch=leader_epoch), log, 0,
                                  eligible=ALL_ELIGIBLE, **kw)
    assert change.role is Role.FOLLOWER and change.follow == (leader, leader_epoch)
    return p


def test_a_new_leader_starts_its_epoch_at_its_log_end():
    log = EpochLog.of(3, 3, 3)
    p = Partition("t", 0, TOPIC_ID, 1, CONFIG)
    change = p.apply_registration(registration(leader_epoch=5), log, 0, eligible=ALL_ELIGIBLE)
    assert change.role is Role.LEADER and change.epoch_start == (5, 3)
    assert change.follow == (-1, 5), "a leader fetches from nobody"


def test_leadership_moving_away_makes_a_follower_of_the_new_leader_at_once():
    log = EpochLog.of(5, 5)
    p = leader_partition(log)
    change = p.apply_registration(registration(leader=2, leader_epoch=6, partition_epoch=11), log, 1,
                                  eligible=ALL_ELIGIBLE)
    assert (change.role, change.follow, p.leader) == (Role.FOLLOWER, (2, 6), None)
    assert p.fetch_error(-1) == ErrorCode.not_leader_or_follower, "followers serve no client reads"
    assert p.produce_error(1) == ErrorCode.not_leader_or_follower
    change = p.apply_registration(registration(leader=-1, leader_epoch=7, partition_epoch=12), log, 2,
                                  eligible=ALL_ELIGIBLE)
    assert change.follow == (-1, 7), "no leader: stop fetching"


def test_stale_metadata_is_ignored():
    log = EpochLog.of(5)
    p = follower_partition(log, leader=3, leader_epoch=6)
    change = p.apply_registration(registration(leader=1, leader_epoch=5), log, 1, eligible=ALL_ELIGIBLE)
    assert (change.role, change.follow, p.leader_id, p.leader_epoch) == (Role.FOLLOWER, None, 3, 6)


def test_an_isr_only_change_does_not_move_a_follower():
    log = EpochLog.of(5)
    p = follower_partition(log)
    change = p.apply_registration(registration(isr=(1, 2), partition_epoch=11), log, 1, eligible=ALL_ELIGIBLE)
    assert change.follow is None and p.isr == (1, 2)


def test_the_follower_hw_is_the_leaders_bounded_by_its_own_log_end():
    log = EpochLog.of(5, 5, 5)
    p = follower_partition(log, checkpointed_high_watermark=1)
    assert p.high_watermark == 1
    assert p.on_follower_log_changed(log.append(2, 5), leader_high_watermark=9) and p.high_watermark == 5
    log.truncate_to(4)
    assert p.on_follower_log_changed(4, None) and p.high_watermark == 4


def test_a_follower_promoted_keeps_its_hw_and_then_moves_it_with_the_isr():
    log = EpochLog.of(5, 5, 5, 5)
    p = follower_partition(log)
    p.on_follower_log_changed(4, leader_high_watermark=3)
    change = p.apply_registration(registration(leader=2, leader_epoch=6, isr=(2, 3), partition_epoch=11), log, 10,
                                  eligible=ALL_ELIGIBLE)
    log.epoch_cache.assign(*change.epoch_start)
    assert p.high_watermark == 3
    p.handle_replica_fetch(fetch(3, 4, log, leader_epoch=6), log, 11)
    assert p.high_watermark == 4


def test_eligible_brokers_come_from_the_image():
    def broker(i, fenced=False, shutting=False):
        return BrokerRegistration(i, 100 + i, uuid.UUID(int=i), (), None, fenced, shutting)

    image = MetadataImage(brokers=PMap().set(1, broker(1)).set(2, broker(2, fenced=True)).set(3, broker(3, shutting=True)))
    assert eligible_brokers(image) == {1: 101}


def test_offsets_for_leader_epoch_is_answered_by_the_leader_only():
    log = EpochLog.of(0, 0, 2, 2)
    p = leader_partition(log)
    assert p.offset_for_leader_epoch(5, 0, log) == (ErrorCode.none, EpochEndOffset(0, 2))
    assert p.offset_for_leader_epoch(5, 3, log) == (ErrorCode.none, EpochEndOffset(2, 4))
    assert p.offset_for_leader_epoch(4, 3, log)[0] == ErrorCode.fenced_leader_epoch


def test_an_unclean_leader_election_truncates_acknowledged_records_on_the_others():
    """unclean.leader.election.enable: the controller may name a replica that
    was out of the ISR. It starts its epoch at its own (shorter) log end, and
    the old ISR members cut what they have past it when they fetch: records
    0..9 were committed (HW 10) with ISR {1, 2}, and 6..9 are gone for good."""
    old_leader_log = EpochLog.of(*[5] * 10)
    old = leader_partition(old_leader_log, isr=(1, 2))
    old.handle_replica_fetch(fetch(2, 10, old_leader_log), old_leader_log, 1)
    assert old.high_watermark == 10

    lagging_log = EpochLog.of(*[5] * 6)  # replica 3, out of the ISR, had 0..5
    unclean = Partition("t", 0, TOPIC_ID, 3, CONFIG, min_insync_replicas=1)
    change = unclean.apply_registration(registration(leader=3, leader_epoch=6, isr=(3,), partition_epoch=12),
                                        lagging_log, 2, eligible=ALL_ELIGIBLE)
    lagging_log.epoch_cache.assign(*change.epoch_start)
    assert change.epoch_start == (6, 6) and unclean.high_watermark == 6

    # The old leader, now a follower, fetches with its last epoch (5) at 10.
    decision = unclean.handle_replica_fetch(fetch(1, 10, old_leader_log, leader_epoch=6), lagging_log, 3)
    assert decision.diverging_epoch == (5, 6)
    offset, complete = truncation_offset(old_leader_log, decision.diverging_epoch)
    assert (offset, complete) == (6, True)
    old_leader_log.truncate_to(offset)
    assert old_leader_log.epochs() == [5] * 6, "the records acknowledged at offsets 6..9 are lost"


def test_a_leader_elected_again_at_a_newer_epoch_keeps_its_hw_and_starts_the_new_epoch():
    log = EpochLog.of(5, 5, 5, 5)
    p = leader_partition(log, isr=(1,), min_isr=1)
    assert p.high_watermark == 4
    change = p.apply_registration(registration(leader_epoch=7, isr=(1,), partition_epoch=12), log, 1,
                                  eligible=ALL_ELIGIBLE)
    assert change.epoch_start == (7, 4) and p.high_watermark == 4 and p.leader.leader_epoch == 7
    assert p.acks_all_status(4, 5) == ErrorCode.not_leader_or_follower, "appended in the older epoch"
