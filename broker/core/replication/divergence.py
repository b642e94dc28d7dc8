"""Finding where two replicas' logs diverge, by leader epoch (KIP-101, KIP-279, KIP-320, KIP-595).

Theory of operation
-------------------
Every batch carries the epoch of the leader that wrote it, and each log's
leader epoch cache says where each epoch starts. Two logs that hold a
batch with the same epoch at the same offset agree on everything before it
(a leader only appends to its own log, and a follower copies the leader's
log after validating the position it copies from). So a follower can find
the longest prefix it shares with the leader from one question: "where does
my last epoch end in your log?"

**Leader** (`validate_fetch_position`). A follower fetches at `fetch_offset`
with `last_fetched_epoch`, the epoch of its last batch. The leader looks up
`end_offset_for_epoch(last_fetched_epoch)` in its own cache, getting
`(epoch, end_offset)`: the largest epoch it knows that is <= the asked one,
and where that epoch ends in the leader's log. If `epoch` is smaller than
asked (the leader never saw the follower's last epoch) or `end_offset` is
below `fetch_offset` (the follower has more of that epoch than the leader),
the follower's log diverged: the leader answers `DivergingEpoch(epoch,
end_offset)` instead of records (KIP-595's Fetch-based truncation, used for
data partitions since Kafka 2.7 / KIP-320).

**Follower** (`truncation_offset`). On `DivergingEpoch(e, end)` it looks up
its own `end_offset_for_epoch(e)` = `(fe, fend)`:

| follower's answer       | truncate to                | done?                      |
|-------------------------|----------------------------|----------------------------|
| fe == e                 | min(end, fend, LEO)        | yes: common prefix found   |
| fe < e                  | min(fend, LEO)             | no: the next Fetch asks    |
|                         |                            | about the older epoch fe   |
| follower knows no epoch | min(end, LEO)              | yes                        |

"Not done" needs no state of its own: the next Fetch carries the new last
epoch and the leader validates again. The follower never truncates to its
high watermark blindly (the KIP-101 bug: a follower restarting after a crash
cut committed records that the new leader then no longer had).
"""

from __future__ import annotations

from broker.core.replication.messages import NO_EPOCH, EpochEndOffset, LogView


def validate_fetch_position(log: LogView, fetch_offset: int, last_fetched_epoch: int) -> EpochEndOffset | None:
    """The DivergingEpoch the leader answers a follower's Fetch with, or None
    when the follower's log is a prefix of the leader's up to `fetch_offset`.

    The caller refuses a `last_fetched_epoch` newer than the log's latest
    epoch first (the follower then knows of a newer leader than we do), so
    the answer always names an epoch: on the wire an epoch of -1 means "no
    divergence"."""
    if last_fetched_epoch == NO_EPOCH:
        # An empty follower log (or an old request): nothing to validate;
        # the offset range check applies instead.
        return None
    assert last_fetched_epoch <= log.latest_epoch, (last_fetched_epoch, log.latest_epoch)
    epoch, end_offset = log.end_offset_for_epoch(last_fetched_epoch)
    assert epoch != NO_EPOCH, "a non-empty epoch cache knows an epoch at or below its latest"
    if epoch < last_fetched_epoch or end_offset < fetch_offset:
        return EpochEndOffset(epoch, end_offset)
    return None


def truncation_offset(log: LogView, diverging: EpochEndOffset) -> tuple[int, bool]:
    """Where a follower truncates on `diverging`, and whether that finds the
    common prefix (True) or the next Fetch must ask again (False). See the
    table in the module docstring."""
    assert diverging.epoch >= 0 and diverging.end_offset >= 0, diverging
    log_end = log.log_end_offset
    own_epoch, own_end = log.end_offset_for_epoch(diverging.epoch)
    if own_epoch == NO_EPOCH:
        return min(diverging.end_offset, log_end), True
    if own_epoch == diverging.epoch:
        return min(diverging.end_offset, own_end, log_end), True
    assert own_epoch < diverging.epoch, (own_epoch, diverging)
    return min(own_end, log_end), False


def offset_for_leader_epoch(log: LogView, requested_epoch: int) -> EpochEndOffset:
    """The leader's answer to OffsetsForLeaderEpoch (KIP-101/279): the
    largest epoch <= `requested_epoch` it knows and where it ends."""
    epoch, end_offset = log.end_offset_for_epoch(requested_epoch)
    return EpochEndOffset(epoch, end_offset)
