"""TxnOffsetCommit in the group coordinator core (KIP-98, KIP-447): offsets
pending until the producer's marker, written as transactional records,
fenced by generation and member id, and OffsetFetch's require_stable."""

from __future__ import annotations

import random

from kio.schema.errors import ErrorCode

from broker.core.group import GroupCoordinatorShard
from group_testing import FAST, Harness, commit_request, fetch_request, fetched_offsets, txn_commit_request


def errors(response) -> set:
    return {p.error_code for t in response.topics for p in t.partitions}


def fetch_errors(response) -> dict:
    groups = response.groups if hasattr(response, "groups") else [response]
    return {(t.name, p.partition_index): p.error_code for t in groups[0].topics for p in t.partitions}


def test_pending_offsets_become_committed_on_commit_and_vanish_on_abort():
    h = Harness()
    assert errors(h.call(txn_commit_request("g", {("t", 0): 5, ("t", 1): 7}, producer_id=1))) == {ErrorCode.none}
    assert errors(h.call(txn_commit_request("g2", {("t", 0): 9}, producer_id=2))) == {ErrorCode.none}
    # Written as one transactional batch per request, nothing plain.
    assert [(pid, epoch, len(records)) for pid, epoch, records in h.txn_log] == [(1, 0, 2), (2, 0, 1)]
    assert h.log == []
    # Not visible before the marker; unstable for a require_stable fetch.
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0, 1]}))) == {("t", 0): -1, ("t", 1): -1}
    for version in (7, 8):
        assert set(fetch_errors(h.call(fetch_request("g", {"t": [0]}, version=version,
                                                     require_stable=True))).values()) == {
            ErrorCode.unstable_offset_commit}
    h.shard.complete_transaction(1, commit=True)
    h.shard.complete_transaction(2, commit=False)
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0, 1]}, require_stable=True))) == {
        ("t", 0): 5, ("t", 1): 7}
    assert fetched_offsets(h.call(fetch_request("g2", {"t": [0]}, require_stable=True))) == {("t", 0): -1}


def test_kip_447_fencing_by_generation_and_member_id():
    h = Harness()
    leader, _ = h.form_group(2)
    gen = leader.generation_id
    ok = txn_commit_request("g", {("t", 0): 1}, member_id=leader.member_id, generation=gen)
    assert errors(h.call(ok)) == {ErrorCode.none}
    stale = txn_commit_request("g", {("t", 0): 1}, member_id=leader.member_id, generation=gen - 1)
    assert errors(h.call(stale)) == {ErrorCode.illegal_generation}
    ghost = txn_commit_request("g", {("t", 0): 1}, member_id="ghost", generation=gen)
    assert errors(h.call(ghost)) == {ErrorCode.unknown_member_id}
    # A producer that sends neither (pre-KIP-447 clients) is not fenced here.
    assert errors(h.call(txn_commit_request("g", {("t", 0): 2}))) == {ErrorCode.none}


def test_replay_keeps_open_transactions_pending_and_applies_markers_in_log_order():
    h = Harness()
    h.call(txn_commit_request("g", {("t", 0): 5}, producer_id=1))
    h.call(txn_commit_request("g", {("t", 1): 6}, producer_id=2))
    shard = GroupCoordinatorShard(0, FAST, random.Random(0))
    (pid1, _, records1), (pid2, _, records2) = h.txn_log
    for r in records1:
        shard.replay(r.key, r.value, producer_id=pid1)
    shard.complete_transaction(pid1, commit=True)  # the marker, replayed
    for r in records2:
        shard.replay(r.key, r.value, producer_id=pid2)
    shard.on_loaded(0)
    assert shard.offsets.get("g", "t", 0).offset == 5
    assert shard.offsets.get("g", "t", 1) is None
    assert shard.has_pending_txn_offset("g", "t", 1)


def test_a_plain_commit_after_the_transactions_offsets_is_not_overridden_by_its_commit():
    """Kafka's rule when plain and transactional commits mix: the COMMIT
    marker makes a pending offset the group's only if its record is newer
    than the committed one's."""
    h = Harness()
    h.call(txn_commit_request("g", {("t", 0): 5, ("t", 1): 6}, producer_id=1))
    # While the transaction is open, a plain OffsetCommit of partition 0.
    assert errors(h.call(commit_request("g", {("t", 0): 9}))) == {ErrorCode.none}
    h.shard.complete_transaction(1, commit=True)
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0, 1]}))) == {("t", 0): 9, ("t", 1): 6}
    # A plain commit before the transaction's offsets is replaced by them.
    h.call(commit_request("g", {("t", 1): 1}))
    h.call(txn_commit_request("g", {("t", 1): 8}, producer_id=2))
    h.shard.complete_transaction(2, commit=True)
    assert fetched_offsets(h.call(fetch_request("g", {"t": [1]}))) == {("t", 1): 8}

    # The same from the log, replayed by a new coordinator, in log order.
    shard = GroupCoordinatorShard(0, FAST, random.Random(0))
    order = [("txn", 1, r) for r in h.txn_log[0][2]] + [("plain", -1, r) for r in h.log[:1]]
    for offset, (_, pid, r) in enumerate(order):
        shard.replay(r.key, r.value, producer_id=pid, record_offset=offset)
    shard.complete_transaction(1, commit=True)
    shard.on_loaded(0)
    assert shard.offsets.get("g", "t", 0).offset == 9
    assert shard.offsets.get("g", "t", 1).offset == 6


def test_an_offset_tombstone_drops_the_open_transactions_offsets_of_that_partition():
    h = Harness()
    h.call(commit_request("g", {("t", 0): 3}))
    h.call(txn_commit_request("g", {("t", 0): 5, ("t", 1): 6}, producer_id=1))
    h.shard.remove_offset("g", "t", 0)  # what OffsetDelete and expiry do
    assert not h.shard.has_pending_txn_offset("g", "t", 0)
    h.shard.complete_transaction(1, commit=True)
    assert fetched_offsets(h.call(fetch_request("g", {"t": [0, 1]}))) == {("t", 0): -1, ("t", 1): 6}
