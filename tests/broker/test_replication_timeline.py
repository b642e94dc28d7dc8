"""The per-delta failover timeline (`broker.core.failover_timeline`): the one INFO line an operator reads to see
which link of a leader failover was slow."""

from __future__ import annotations

from broker.core.failover_timeline import GIVE_UP_MS, LeadershipTimeline


def test_a_delta_is_reported_once_every_new_leader_committed_and_every_follower_was_answered():
    timeline = LeadershipTimeline()
    assert timeline.begin_delta(offset=2009, started_ms=1000) == []
    timeline.on_leader("a", epoch_start_offset=5)
    timeline.on_leader("b", epoch_start_offset=7)
    timeline.on_follower("c")
    # A follower's fetch served while the delta is still being applied counts.
    assert timeline.on_replica_fetch("a", high_watermark=5, now_ms=1010) == []
    assert timeline.end_delta(applied_ms=1040) == []
    # A fetch that leaves the HW below the epoch start is a first fetch, not a commit.
    assert timeline.on_replica_fetch("b", high_watermark=6, now_ms=1100) == []
    assert timeline.on_fetch_answered("c", now_ms=1150) == []
    assert timeline.on_replica_fetch("x", high_watermark=0, now_ms=1160) == []  # not part of any delta
    [line] = timeline.on_replica_fetch("b", high_watermark=7, now_ms=1300)
    assert line == ("metadata offset 2009 (applied in 40 ms): 2 new leaderships: first follower fetch "
                    "+10..+100 ms (median +100), HW past the epoch start +10..+300 ms (median +300); "
                    "1 partitions follow a new leader: first answer +150..+150 ms (median +150)")
    assert not timeline.watching


def test_a_partition_changed_again_by_a_newer_delta_belongs_to_the_newer_one():
    timeline = LeadershipTimeline()
    timeline.begin_delta(offset=10, started_ms=0)
    timeline.on_leader("a", epoch_start_offset=3)
    timeline.on_follower("b")
    timeline.end_delta(applied_ms=5)
    timeline.begin_delta(offset=20, started_ms=100)
    timeline.on_follower("a")
    # The older delta now waits only for "b"; "a" is the newer delta's follower.
    [older] = timeline.on_fetch_answered("b", now_ms=110)
    assert older.startswith("metadata offset 10 (applied in 5 ms): 1 partitions follow a new leader")
    assert timeline.end_delta(applied_ms=120) == []
    [newer] = timeline.on_fetch_answered("a", now_ms=130)
    assert newer.startswith("metadata offset 20 (applied in 20 ms): 1 partitions follow a new leader: "
                            "first answer +30..+30 ms")


def test_partitions_that_never_get_there_are_counted_missing_after_the_give_up_time():
    timeline = LeadershipTimeline()
    timeline.begin_delta(offset=7, started_ms=0)
    timeline.on_leader("a", epoch_start_offset=1)
    timeline.on_leader("b", epoch_start_offset=1)
    timeline.end_delta(applied_ms=10)
    timeline.on_replica_fetch("a", high_watermark=1, now_ms=20)
    assert timeline.watching
    [line] = timeline.begin_delta(offset=8, started_ms=10 + GIVE_UP_MS)
    assert line.endswith("HW past the epoch start +20..+20 ms (median +20) (1 not within 60 s)")
    # The partition given up on is forgotten: its late commit reports nothing.
    assert timeline.on_replica_fetch("b", high_watermark=1, now_ms=30 + GIVE_UP_MS) == []
    # A delta that changed no leadership writes no line.
    assert timeline.end_delta(applied_ms=20 + GIVE_UP_MS) == []
    assert not timeline.watching
