"""The leader's replication rules: HW, ISR shrink on lag, expansion on catch-up,
pending ISR changes (KIP-497), min.insync.replicas, KIP-841/903 eligibility."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from broker.core.replication import AlterPartitionResult, BrokerState, PendingProduce
from replication_testing import LAG_MS, EpochLog, fetch, leader_partition, registration


def leader_with_data(n: int = 10, **kw):
    log = EpochLog.of(*[3] * n)
    p = leader_partition(log, **kw)
    return p, log


def replicas_registration(isr, partition_epoch, leader_epoch=5):
    """The registration of the leader's partition after a controller change."""
    return registration(isr=isr, partition_epoch=partition_epoch, leader_epoch=leader_epoch)


def committed(p, proposal, isr=None) -> AlterPartitionResult:
    """The controller's success answer to `proposal`."""
    return AlterPartitionResult(ErrorCode.none, 1, proposal.leader_epoch,
                                proposal.isr if isr is None else isr, proposal.partition_epoch + 1)


# --- high watermark ---------------------------------------------------------------


def test_hw_is_the_minimum_log_end_offset_over_the_isr_and_never_goes_back():
    p, log = leader_with_data(10)
    assert p.high_watermark == 0
    d = p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=1)
    assert d.error == ErrorCode.none and not d.update.high_watermark_moved  # 3 has not fetched in this term
    d = p.handle_replica_fetch(fetch(3, 6, log), log, now_ms=2)
    assert d.update.high_watermark_moved and p.high_watermark == 6 and d.high_watermark == 6
    # A follower "going back" (it cannot, but a stale fetch might say so) never lowers the HW.
    p.handle_replica_fetch(fetch(3, 4, log), log, now_ms=3)
    assert p.high_watermark == 6
    p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=4)
    assert p.high_watermark == 10


def test_follower_reads_are_bounded_by_the_log_end_and_consumers_by_the_hw():
    p, log = leader_with_data(10)
    d = p.handle_replica_fetch(fetch(2, 4, log), log, now_ms=1)
    assert (d.read_offset, d.read_max_offset) == (4, 10)
    assert p.fetch_upper_bound(read_committed=False) == p.high_watermark == 0


def test_hw_holds_while_the_isr_is_smaller_than_min_insync_replicas():
    p, log = leader_with_data(10, isr=(1,), min_isr=2)
    assert p.produce_error(acks=-1) == ErrorCode.not_enough_replicas
    assert p.produce_error(acks=1) == ErrorCode.none
    assert not p.on_leader_append(log.append(2, 5)).high_watermark_moved
    assert p.high_watermark == 0
    # The same single-member ISR with min.insync.replicas=1 commits at once.
    p2, log2 = leader_with_data(10, isr=(1,), min_isr=1)
    assert p2.high_watermark == 10


def test_a_new_leader_starts_from_its_checkpointed_hw_bounded_by_its_log_end():
    p, _ = leader_with_data(10, hw=25)
    assert p.high_watermark == 10 - 0 and p.leader.epoch_start_offset == 10
    p, _ = leader_with_data(10, hw=4)
    assert p.high_watermark == 4


# --- ISR shrink -------------------------------------------------------------------


def test_a_follower_that_has_not_caught_up_for_the_lag_time_is_shrunk_out():
    p, log = leader_with_data(10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=100)
    p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=100)
    p.on_leader_append(log.append(5, 5))
    p.handle_replica_fetch(fetch(2, 15, log), log, now_ms=200)  # 2 keeps up, 3 stops fetching
    assert p.tick(100 + LAG_MS).alter_partition is None  # exactly the lag: still in sync
    update = p.tick(101 + LAG_MS)
    proposal = update.alter_partition
    assert proposal is not None and proposal.kind == "shrink"
    assert proposal.isr == (1, 2) and (proposal.leader_epoch, proposal.partition_epoch) == (5, 10)
    assert proposal.new_isr == (BrokerState(1), BrokerState(2))
    assert update.isr_changed


def test_a_follower_at_the_leaders_log_end_is_never_shrunk_however_old_its_fetch():
    p, log = leader_with_data(10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=1)
    p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=1)
    assert p.tick(10 * LAG_MS).alter_partition is None


def test_an_append_to_an_idle_partition_does_not_shrink_a_follower_that_was_at_its_log_end():
    """A follower in a fetch session (KIP-227) does not name a partition
    whose position did not change: its last fetch of an idle partition may
    be older than the lag time. It was caught up until the append."""
    p, log = leader_with_data(10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=100)
    p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=100)
    idle_until = 100 + 5 * LAG_MS
    p.on_leader_append(log.append(5, 5), now_ms=idle_until)
    assert p.tick(idle_until + 1).alter_partition is None
    # Not caught up again within the lag time after the append: out.
    p.handle_replica_fetch(fetch(2, 15, log), log, now_ms=idle_until + 10)
    assert p.tick(idle_until + LAG_MS + 1).alter_partition.isr == (1, 2)


def test_caught_up_time_counts_the_previous_fetch_when_the_follower_reached_its_leader_end():
    """Kafka's Replica.updateFetchState: reaching the leader LEO of the previous
    fetch means the follower was caught up at that previous fetch."""
    p, log = leader_with_data(10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=100)  # caught up at 100
    p.on_leader_append(log.append(5, 5))                          # LEO 15
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=400)  # behind; leader LEO was 15
    p.on_leader_append(log.append(5, 5))                          # LEO 20
    p.handle_replica_fetch(fetch(2, 15, log), log, now_ms=900)  # reached 15, the LEO at the 400 fetch
    follower = p.leader.followers[2]
    assert follower.last_caught_up_ms == 400


def test_a_follower_unknown_in_this_term_gets_the_lag_time_from_the_term_start():
    p, log = leader_with_data(10, now_ms=1000, min_isr=1)
    assert p.tick(1000 + LAG_MS).alter_partition is None
    assert p.tick(1001 + LAG_MS).alter_partition.isr == (1,)


def test_the_leader_never_shrinks_the_isr_below_min_insync_replicas():
    """Unlike Kafka before KIP-966: with the leader alone in the ISR, its
    unclean shutdown would lose records acknowledged by two replicas."""
    p, log = leader_with_data(10, min_isr=2)
    p.handle_replica_fetch(fetch(2, 6, log), log, now_ms=0)
    p.handle_replica_fetch(fetch(3, 4, log), log, now_ms=0)
    proposal = p.tick(LAG_MS + 1).alter_partition
    assert proposal.isr == (1, 2), "the least-lagging follower stays"
    p.on_alter_partition_result(proposal, committed(p, proposal), LAG_MS + 2)
    assert p.tick(10 * LAG_MS).alter_partition is None
    assert p.high_watermark == 6 and p.leader.isr == (1, 2)


# --- ISR expansion ----------------------------------------------------------------


def test_a_follower_joins_once_it_reaches_the_hw_and_this_epochs_start():
    p, log = leader_with_data(10, isr=(1, 2), hw=8)
    # epoch 5 starts at 10; 3 at 9 is past the HW (8) but not at the epoch start
    d = p.handle_replica_fetch(fetch(3, 9, log), log, now_ms=1)
    assert d.update.alter_partition is None
    d = p.handle_replica_fetch(fetch(3, 10, log, broker_epoch=103), log, now_ms=2)
    proposal = d.update.alter_partition
    assert proposal.kind == "expand" and proposal.isr == (1, 2, 3)
    assert proposal.new_isr[-1] == BrokerState(3, 103)  # KIP-903: the newcomer's broker epoch


def test_fenced_or_shutting_down_brokers_never_join_the_isr():
    p, log = leader_with_data(10, isr=(1, 2), eligible={1: 101, 2: 102})  # 3 is fenced
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=1).update.alter_partition is None
    p.update_eligibility({1: 101, 2: 102, 3: 103})  # unfenced
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=2).update.alter_partition.isr == (1, 2, 3)


def test_fetches_from_another_incarnation_than_the_image_knows_do_not_expand():
    p, log = leader_with_data(10, isr=(1, 2))
    d = p.handle_replica_fetch(fetch(3, 10, log, broker_epoch=555), log, now_ms=1)  # a restart we have not seen
    assert d.update.alter_partition is None


# --- pending ISR changes (KIP-497) ------------------------------------------------------


def test_a_pending_shrink_keeps_the_hw_waiting_for_the_replica_being_removed():
    p, log = leader_with_data(10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=0)
    p.handle_replica_fetch(fetch(3, 4, log), log, now_ms=0)
    assert p.high_watermark == 4
    shrink = p.tick(LAG_MS + 1).alter_partition
    assert shrink.isr == (1, 2) and p.leader.maximal_isr == (1, 2, 3)
    p.on_leader_append(log.append(2, 5))
    p.handle_replica_fetch(fetch(2, 12, log), log, now_ms=LAG_MS + 2)
    assert p.high_watermark == 4, "the shrink is not confirmed: 3 may still be in the ISR"
    update = p.on_alter_partition_result(shrink, committed(p, shrink), LAG_MS + 3)
    assert update.high_watermark_moved and p.high_watermark == 12
    assert p.leader.isr == (1, 2) and p.leader.partition_epoch == 11


def test_a_pending_expansion_makes_the_hw_wait_for_the_newcomer():
    p, log = leader_with_data(10, isr=(1, 2), hw=10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=0)
    expand = p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=0).update.alter_partition
    assert p.leader.maximal_isr == (1, 2, 3) and p.leader.guaranteed_isr == (1, 2)
    p.on_leader_append(log.append(4, 5))
    p.handle_replica_fetch(fetch(2, 14, log), log, now_ms=1)
    assert p.high_watermark == 10, "the controller may already count 3 in the ISR"
    p.handle_replica_fetch(fetch(3, 14, log), log, now_ms=2)
    assert p.high_watermark == 14
    p.on_alter_partition_result(expand, committed(p, expand), 3)
    assert p.leader.isr == (1, 2, 3) and not p.leader.isr_state.in_flight


def test_one_isr_change_at_a_time():
    p, log = leader_with_data(10, isr=(1,), min_isr=1)
    first = p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=0).update.alter_partition
    assert first.isr == (1, 2)
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=0).update.alter_partition is None
    p.on_alter_partition_result(first, committed(p, first), 1)
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=2).update.alter_partition.isr == (1, 2, 3)


def test_an_ambiguous_failure_keeps_the_change_pending_and_resends_it():
    p, log = leader_with_data(10, isr=(1, 2))
    expand = p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=0).update.alter_partition
    p.on_alter_partition_result(expand, AlterPartitionResult(ErrorCode.request_timed_out), 100)
    assert p.leader.maximal_isr == (1, 2, 3)
    assert p.next_deadline_ms() == 120
    assert p.tick(119).alter_partition is None
    assert p.tick(120).alter_partition == expand


def test_invalid_update_version_waits_for_the_metadata_instead_of_reverting():
    """The first attempt may have been applied and only its answer lost; the
    retry then fails INVALID_UPDATE_VERSION. Forgetting the newcomer would let
    the HW pass it while the controller counts it in the ISR."""
    p, log = leader_with_data(10, isr=(1, 2), hw=10)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=0)
    expand = p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=0).update.alter_partition
    p.on_alter_partition_result(expand, AlterPartitionResult(ErrorCode.invalid_update_version), 1)
    assert p.leader.maximal_isr == (1, 2, 3)
    assert p.tick(10_000).alter_partition is None, "no resend: the metadata log will tell"
    p.on_leader_append(log.append(3, 5))
    p.handle_replica_fetch(fetch(2, 13, log), log, now_ms=2)
    assert p.high_watermark == 10
    # The metadata update shows the expansion was applied (partition epoch 11).
    update = p.apply_registration(replicas_registration(isr=(1, 2, 3), partition_epoch=11), log, 3,
                                  eligible={1: 101, 2: 102, 3: 103}).update
    assert p.leader.isr == (1, 2, 3) and not p.leader.isr_state.in_flight and not update.high_watermark_moved


def test_a_refused_expansion_is_forgotten_and_may_be_proposed_again_later():
    p, log = leader_with_data(10, isr=(1, 2))
    expand = p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=0).update.alter_partition
    p.on_alter_partition_result(expand, AlterPartitionResult(ErrorCode.ineligible_replica), 50)
    assert p.leader.maximal_isr == (1, 2)
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=60).update.alter_partition is None  # backoff
    assert p.handle_replica_fetch(fetch(3, 10, log), log, now_ms=70).update.alter_partition == expand


def test_a_late_answer_to_a_change_the_metadata_already_settled_is_ignored():
    p, log = leader_with_data(10)
    shrink = p.tick(LAG_MS + 1).alter_partition
    p.apply_registration(replicas_registration(isr=(1,), partition_epoch=11), log, LAG_MS + 2,
                         eligible={1: 101, 2: 102, 3: 103})
    assert p.leader.isr == (1,) and p.leader.partition_epoch == 11
    p.on_alter_partition_result(shrink, committed(p, shrink), LAG_MS + 3)  # says epoch 11, ISR (1,)
    assert p.leader.isr == (1,) and p.leader.partition_epoch == 11


def test_a_controller_shrink_without_our_proposal_is_adopted_from_metadata():
    p, log = leader_with_data(10)
    update = p.apply_registration(replicas_registration(isr=(1, 2), partition_epoch=11), log, 1,
                                  eligible={1: 101, 2: 102})
    assert p.leader.isr == (1, 2) and update.update.isr_changed


def test_a_follower_the_controller_puts_back_in_the_isr_gets_the_lag_time_from_then():
    # Broker 3 never fetched in this term; the controller shrank it out and
    # later put it back (a preferred election, a reassignment): it is not
    # shrunk again before replica.lag.time.max.ms from that change.
    p, log = leader_with_data(10, isr=(1, 2))
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=100)
    p.apply_registration(replicas_registration(isr=(1, 2, 3), partition_epoch=11), log, 5000,
                         eligible={1: 101, 2: 102, 3: 103})
    assert p.leader.isr == (1, 2, 3)
    p.handle_replica_fetch(fetch(2, 10, log), log, now_ms=5000)
    assert p.tick(5000 + LAG_MS).alter_partition is None
    proposal = p.tick(5001 + LAG_MS).alter_partition
    assert proposal is not None and proposal.kind == "shrink" and proposal.isr == (1, 2)


# --- acks=all -------------------------------------------------------------------------


def test_acks_all_waits_for_the_hw_then_succeeds():
    p, log = leader_with_data(0)
    required = log.append(3, 5)
    p.on_leader_append(required)
    assert p.acks_all_status(required, 5) is None
    p.handle_replica_fetch(fetch(2, 3, log), log, now_ms=1)
    assert p.acks_all_status(required, 5) is None
    p.handle_replica_fetch(fetch(3, 3, log), log, now_ms=1)
    assert p.acks_all_status(required, 5) == ErrorCode.none


def test_acks_all_fails_after_append_when_the_isr_shrinks_below_min_isr_while_it_waits():
    p, log = leader_with_data(0, isr=(1, 2), min_isr=2)
    p.handle_replica_fetch(fetch(2, 0, log), log, now_ms=0)
    required = log.append(1, 5)
    p.on_leader_append(required)
    assert p.acks_all_status(required, 5) is None
    # The controller fenced broker 2 and took it out of the ISR.
    update = p.apply_registration(replicas_registration(isr=(1,), partition_epoch=11), log, 1,
                                  eligible={1: 101, 3: 103}).update
    assert update.isr_changed
    assert p.acks_all_status(required, 5) == ErrorCode.not_enough_replicas_after_append
    assert p.produce_error(-1) == ErrorCode.not_enough_replicas


def test_a_pending_shrink_below_min_isr_fails_parked_produces_at_once():
    p, log = leader_with_data(0, min_isr=3)
    required = log.append(1, 5)
    p.on_leader_append(required)
    p.set_min_insync_replicas(2)
    shrink = p.tick(LAG_MS + 1).alter_partition
    assert shrink.isr == (1, 2)
    assert p.acks_all_status(required, 5) is None, "two members are guaranteed: it may still commit"
    p.set_min_insync_replicas(3)
    assert p.acks_all_status(required, 5) == ErrorCode.not_enough_replicas_after_append


def test_acks_all_fails_when_the_leader_epoch_changed_since_the_append():
    p, log = leader_with_data(0, isr=(1,), min_isr=1)
    required = log.append(1, 5)
    p.on_leader_append(required)
    assert p.acks_all_status(required, 5) == ErrorCode.none
    assert p.acks_all_status(required, 4) == ErrorCode.not_leader_or_follower


def test_a_parked_produce_times_out():
    p, log = leader_with_data(0)
    required = log.append(1, 5)
    p.on_leader_append(required)
    pending = PendingProduce(required, 5, deadline_ms=500)
    assert p.produce_outcome(pending, 499) is None
    assert p.produce_outcome(pending, 500) == ErrorCode.request_timed_out


# --- fetch validation -----------------------------------------------------------------


def test_follower_fetch_epoch_checks():
    p, log = leader_with_data(10)
    assert p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=4), log, 0).error == ErrorCode.fenced_leader_epoch
    assert p.handle_replica_fetch(fetch(2, 10, log, leader_epoch=6), log, 0).error == ErrorCode.unknown_leader_epoch
    assert p.handle_replica_fetch(fetch(9, 10, log), log, 0).error == ErrorCode.not_leader_or_follower


def test_a_diverged_follower_gets_diverging_epoch_and_is_not_counted():
    p, log = leader_with_data(10)  # epochs: 3 x10, then 5 from 10
    d = p.handle_replica_fetch(fetch(2, 12, last_epoch=4), log, now_ms=1)
    assert d.diverging_epoch == (3, 10) and d.read_offset == -1
    assert p.leader.followers[2].log_end_offset == -1


def test_a_fetch_past_the_log_end_without_an_epoch_is_out_of_range():
    p, log = leader_with_data(10)
    assert p.handle_replica_fetch(fetch(2, 11, last_epoch=-1), log, 1).error == ErrorCode.offset_out_of_range


# --- low watermark (DeleteRecords) ------------------------------------------------


def test_the_low_watermark_is_the_smallest_log_start_of_the_isr_and_unknown_until_each_follower_said():
    p, log = leader_with_data(10)
    assert p.leader.low_watermark(4) == -1  # no follower has fetched in this leadership yet
    p.handle_replica_fetch(fetch(2, 10, log)._replace(log_start_offset=4), log, now_ms=100)
    p.handle_replica_fetch(fetch(3, 10, log)._replace(log_start_offset=0), log, now_ms=100)
    assert p.leader.low_watermark(4) == 0
    p.handle_replica_fetch(fetch(3, 10, log)._replace(log_start_offset=4), log, now_ms=200)
    assert p.leader.low_watermark(4) == 4
    # Out of the ISR, a follower no longer holds the low watermark back.
    p, log = leader_with_data(10, isr=(1, 2))
    p.handle_replica_fetch(fetch(2, 10, log)._replace(log_start_offset=6), log, now_ms=100)
    assert p.leader.low_watermark(6) == 6
