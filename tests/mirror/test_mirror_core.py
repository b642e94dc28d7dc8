"""The mirror's pure core: topic selection, naming and cycle refusal, the
MM2 record formats, when offset syncs are written, offset translation,
checkpoints and the properties parser."""

import pytest

from common.errors import ConfigError
from mirror import config
from mirror.offsets import (Checkpoint, CheckpointTracker, OffsetSync, OffsetSyncEmitter, OffsetSyncStore,
                            offsets_to_sync)
from mirror.policy import (DEFAULT_TOPICS_EXCLUDE, DefaultReplicationPolicy, IdentityReplicationPolicy, NameFilter,
                           configs_to_copy, mirrored_topics, refusal)

ALL = NameFilter(".*", DEFAULT_TOPICS_EXCLUDE)


def test_prefix_policy_names_and_selection() -> None:
    policy = DefaultReplicationPolicy()
    topics = ["orders", "clicks", "__consumer_offsets", "mm2-offset-syncs.eu.internal", "us.checkpoints.internal",
              "eu.orders", "tmp.scratch"]
    got = mirrored_topics(topics, "us", "eu", policy, NameFilter("orders|clicks|eu\\..*|tmp\\..*", "tmp\\..*"))
    # internal topics never, the excluded one not, and eu.orders came from eu: not sent back
    assert got == {"clicks": "us.clicks", "orders": "us.orders"}


def test_cycles_are_refused_through_several_hops() -> None:
    policy = DefaultReplicationPolicy()
    assert refusal("eu.orders", "us", "eu", policy, ALL) is not None
    assert refusal("ap.eu.orders", "us", "eu", policy, ALL) is not None  # eu -> ap -> us, and back to eu: no
    assert refusal("ap.orders", "us", "eu", policy, ALL) is None
    assert DefaultReplicationPolicy("_").remote_topic("us", "orders") == "us_orders"


def test_identity_policy_keeps_names_and_refuses_two_way_flows() -> None:
    assert mirrored_topics(["orders"], "a", "b", IdentityReplicationPolicy(), ALL) == {"orders": "orders"}
    props = {"clusters": "a, b", "a.bootstrap.servers": "h:1", "b.bootstrap.servers": "h:2",
             "a->b.enabled": "true", "b->a.enabled": "true", "replication.policy.class":
             "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"}
    with pytest.raises(ConfigError, match="loop"):
        config.parse(props)
    assert len(config.parse({**props, "b->a.enabled": "false"})) == 1


def test_only_configs_set_on_the_topic_and_that_matter_are_copied() -> None:
    got = configs_to_copy({"cleanup.policy": ("compact", False), "retention.ms": ("604800000", True),
                           "segment.bytes": ("1000", False), "max.message.bytes": ("2000000", False)})
    assert got == {"cleanup.policy": "compact", "max.message.bytes": "2000000"}


def test_record_formats_round_trip() -> None:
    sync = OffsetSync("orders", 3, 1234, 99)
    assert OffsetSync.decode(sync.key(), sync.value()) == sync
    assert sync.key() == b"\x00\x06orders\x00\x00\x00\x03"
    cp = Checkpoint("g1", "us.orders", 2, 50, 48, "meta")
    assert Checkpoint.decode(cp.key(), cp.value()) == cp
    assert cp.value()[:2] == b"\x00\x00"  # version 0, as MM2 writes it


def test_emitter_syncs_first_record_on_delta_change_after_max_lag_and_at_commit() -> None:
    e = OffsetSyncEmitter(max_offset_lag=10)
    tp = ("t", 0)
    assert e.acked(tp, 0, 0) == OffsetSync("t", 0, 0, 0)
    assert [e.acked(tp, i, i) for i in range(1, 10)] == [None] * 9
    assert e.acked(tp, 10, 10) is not None  # 10 records since the last
    assert e.acked(tp, 11, 11) is None
    assert e.acked(tp, 15, 12) == OffsetSync("t", 0, 15, 12)  # a gap in the source (compaction)
    assert e.acked(tp, 16, 13) is None
    assert e.pending() == [OffsetSync("t", 0, 16, 13)]
    assert e.pending() == []


def test_translation_exact_interpolated_and_conservative() -> None:
    s = OffsetSyncStore()
    for up, down in [(0, 0), (100, 100), (150, 120), (160, 130)]:
        s.add(OffsetSync("t", 0, up, down))
    tp = ("t", 0)
    assert s.translate(tp, 100) == 100
    assert s.translate(tp, 42) == 42  # same delta at both ends: exact
    assert s.translate(tp, 130) == 101  # a gap between 100 and 150: the safe side (re-read, never skip)
    assert s.translate(tp, 155) == 125  # 150..160 kept one delta
    assert s.translate(tp, 500) == 131  # beyond the last sync
    assert s.translate(("t", 1), 5) is None
    fresh = OffsetSyncStore()
    fresh.add(OffsetSync("t", 0, 10, 0))
    assert fresh.translate(tp, 5) is None  # before anything mirrored: no checkpoint


def test_a_restarted_mirror_replaces_the_history_it_rewrote() -> None:
    s = OffsetSyncStore()
    for up, down in [(0, 0), (100, 100), (200, 200)]:
        s.add(OffsetSync("t", 0, up, down))
    s.add(OffsetSync("t", 0, 150, 230))  # resent from 150 after a crash: duplicates on the target
    assert s.translate(("t", 0), 150) == 230
    assert s.translate(("t", 0), 199) == 231


def test_checkpoints_are_written_when_they_move_and_never_rewind_a_group() -> None:
    s = OffsetSyncStore()
    s.add(OffsetSync("t", 0, 0, 0))
    s.add(OffsetSync("t", 0, 50, 50))
    tracker = CheckpointTracker()
    committed = {("t", 0): (50, ""), ("other", 0): (7, "")}
    cps = tracker.checkpoints("g", committed, {"t": "us.t"}, s)
    assert cps == [Checkpoint("g", "us.t", 0, 50, 50)]
    assert tracker.checkpoints("g", committed, {"t": "us.t"}, s) == []
    assert offsets_to_sync(cps, {("us.t", 0): 60}) == {}
    assert offsets_to_sync(cps, {("us.t", 0): 10}) == {("us.t", 0): 50}


def test_config_parser_flows_and_errors() -> None:
    flows = config.parse({"clusters": "us, eu", "us.bootstrap.servers": "h:1", "eu.bootstrap.servers": "h:2",
                          "us->eu.enabled": "true", "topics": "a.*", "us->eu.topics": "b.*",
                          "replication.policy.separator": "_", "emit.checkpoints.interval.seconds": "5",
                          "exactly.once.support": "enabled"})
    (f,) = flows
    assert (f.name, f.source_bootstrap, f.target_bootstrap) == ("us->eu", "h:1", "h:2")
    assert f.topics.matches("b1") and not f.topics.matches("a1")
    assert f.policy.remote_topic("us", "b1") == "us_b1"
    assert f.checkpoint_interval_s == 5 and f.exactly_once and f.mirror_group == "mirror-us-eu"
    with pytest.raises(ConfigError, match="eu.bootstrap.servers"):
        config.parse({"clusters": "us, eu", "us.bootstrap.servers": "h:1"})
    with pytest.raises(ConfigError, match="no flow"):
        config.parse({"clusters": "us, eu", "us.bootstrap.servers": "h:1", "eu.bootstrap.servers": "h:2"})
    with pytest.raises(ConfigError, match="ap"):
        config.parse({"clusters": "us, eu", "us.bootstrap.servers": "h:1", "eu.bootstrap.servers": "h:2",
                      "us->ap.enabled": "true"})
    with pytest.raises(ConfigError, match="offset.lag.max"):
        config.simple("h:1", "h:2", ".*", **{"offset.lag.max": "x"})
