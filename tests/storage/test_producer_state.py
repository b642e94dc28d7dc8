"""Idempotent producer checks (KIP-98), table-driven, on the pure core."""

import pytest

from storage.batch import CONTROL_MASK, MAGIC, BatchHeader
from storage.producer_state import (
    INT32_MAX,
    MAX_BATCHES_PER_PRODUCER,
    ProduceCheck,
    ProducerState,
    last_sequence,
)

OK = ProduceCheck.OK
DUP = ProduceCheck.DUPLICATE_SEQUENCE_NUMBER
OOO = ProduceCheck.OUT_OF_ORDER_SEQUENCE_NUMBER
EPOCH = ProduceCheck.INVALID_PRODUCER_EPOCH


def header(pid, epoch, seq, count=1, base_offset=0, ts=1_000, control=False):
    return BatchHeader(
        base_offset, 49, 0, MAGIC, 0, CONTROL_MASK if control else 0, count - 1, ts, ts, pid, epoch, seq, count
    )


def state_after(batches):
    """A state fed `(pid, epoch, seq, count)` batches back to back from
    offset 0 through the leader path; returns it and the next offset."""
    state = ProducerState()
    offset = 0
    for pid, epoch, seq, count in batches:
        result = state.check_and_update(header(pid, epoch, seq, count), offset)
        assert result.error is OK, result
        offset += count
    return state, offset


# (what, batches before, (pid, epoch, seq, count), expected, duplicate's first offset)
TABLE = [
    ("first batch of a new producer", [], (1, 0, 0, 3), OK, None),
    ("unknown producer, any sequence (KIP-360)", [], (1, 0, 42, 1), OK, None),
    ("unknown producer, other pids known", [(2, 0, 0, 1)], (1, 3, 7, 1), OK, None),
    ("next in sequence", [(1, 0, 0, 3)], (1, 0, 3, 2), OK, None),
    ("gap in sequence", [(1, 0, 0, 3)], (1, 0, 4, 1), OOO, None),
    ("sequence goes back, not a known batch", [(1, 0, 0, 3), (1, 0, 3, 2)], (1, 0, 1, 1), OOO, None),
    ("retry of the last batch", [(1, 0, 0, 3), (1, 0, 3, 2)], (1, 0, 3, 2), DUP, 3),
    ("retry of an earlier batch", [(1, 0, 0, 3), (1, 0, 3, 2)], (1, 0, 0, 3), DUP, 0),
    ("same first sequence, other length", [(1, 0, 0, 3)], (1, 0, 0, 2), OOO, None),
    (
        "retry of the oldest of the 5 remembered batches",
        [(1, 0, i, 1) for i in range(MAX_BATCHES_PER_PRODUCER)],
        (1, 0, 0, 1),
        DUP,
        0,
    ),
    (
        "retry of a 6th-newest batch is forgotten",
        [(1, 0, i, 1) for i in range(MAX_BATCHES_PER_PRODUCER + 1)],
        (1, 0, 0, 1),
        OOO,
        None,
    ),
    ("older epoch", [(1, 2, 0, 1)], (1, 1, 1, 1), EPOCH, None),
    ("older epoch, even as a retry of its batch", [(1, 1, 0, 1), (1, 2, 0, 1)], (1, 1, 0, 1), EPOCH, None),
    ("epoch bump starts at 0", [(1, 0, 0, 5)], (1, 1, 0, 1), OK, None),
    ("epoch bump must start at 0", [(1, 0, 0, 5)], (1, 1, 5, 1), OOO, None),
    ("a new epoch forgets the old epoch's batches", [(1, 0, 0, 5), (1, 1, 0, 1)], (1, 1, 1, 1), OK, None),
    ("retry across an epoch bump is not a duplicate", [(1, 0, 0, 1), (1, 1, 0, 1)], (1, 0, 0, 1), EPOCH, None),
    ("wrap: after INT32_MAX comes 0", [(1, 0, INT32_MAX - 1, 2)], (1, 0, 0, 1), OK, None),
    ("wrap: not 1 after INT32_MAX", [(1, 0, INT32_MAX - 1, 2)], (1, 0, 1, 1), OOO, None),
    ("wrap inside a batch", [(1, 0, INT32_MAX - 1, 4)], (1, 0, 2, 1), OK, None),
    ("retry of a batch that wrapped", [(1, 0, INT32_MAX - 1, 4)], (1, 0, INT32_MAX - 1, 4), DUP, 0),
    ("not idempotent (pid -1)", [(1, 0, 0, 1)], (-1, -1, -1, 1), OK, None),
    ("producers are independent", [(1, 0, 0, 10), (2, 0, 0, 1)], (2, 0, 1, 1), OK, None),
]


@pytest.mark.parametrize("what,before,batch,expected,dup_offset", TABLE, ids=[row[0] for row in TABLE])
def test_sequence_checks(what, before, batch, expected, dup_offset):
    state, next_offset = state_after(before)
    pid, epoch, seq, count = batch
    snapshot = state.snapshot_entries()
    result = state.check_and_update(header(pid, epoch, seq, count), next_offset)
    assert result.error is expected, result.message
    if expected is DUP:
        assert result.first_offset == dup_offset
        assert result.last_offset == dup_offset + count - 1
    if expected is not OK:
        assert result.message
        # A refused or duplicate batch changes nothing.
        assert state.snapshot_entries() == snapshot


def test_accepted_batch_is_remembered_with_its_offsets():
    state, _ = state_after([(5, 3, 0, 4)])
    entry = state.entry(5)
    assert entry.producer_epoch == 3
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in entry.batches] == [(0, 3, 0, 3)]
    assert state.last_batch_offsets() == {5: 3}


def test_only_the_last_five_batches_are_kept():
    state, _ = state_after([(1, 0, i, 1) for i in range(8)])
    assert [b.first_seq for b in state.entry(1).batches] == [3, 4, 5, 6, 7]


def test_last_sequence_wraps_like_kafka():
    assert last_sequence(0, 0) == 0
    assert last_sequence(10, 4) == 14
    assert last_sequence(INT32_MAX, 0) == INT32_MAX
    assert last_sequence(INT32_MAX, 1) == 0
    assert last_sequence(INT32_MAX - 2, 5) == 2


def test_follower_update_takes_what_the_leader_wrote():
    state, _ = state_after([(1, 5, 0, 1)])
    # An older epoch arriving by replication is history, not a request.
    state.update(header(1, 4, 9, 2, base_offset=10))
    entry = state.entry(1)
    assert entry.producer_epoch == 4
    assert [(b.first_seq, b.last_seq, b.first_offset) for b in entry.batches] == [(9, 10, 10)]


def test_control_batch_moves_the_epoch_forward_only():
    state, _ = state_after([(1, 2, 0, 3)])
    state.update(header(1, 1, -1, control=True, base_offset=3))
    assert state.entry(1).producer_epoch == 2 and len(state.entry(1).batches) == 1
    state.update(header(1, 3, -1, control=True, base_offset=4))
    assert state.entry(1).producer_epoch == 3 and state.entry(1).batches == []
    # The new epoch starts at sequence 0.
    assert state.check(header(1, 3, 0)).error is OK
    assert state.check(header(1, 3, 3)).error is OOO


def test_expired_producers_are_forgotten_and_then_accepted_at_any_sequence():
    state = ProducerState(producer_id_expiration_ms=1_000)
    state.check_and_update(header(1, 0, 0, ts=5_000), 0)
    state.check_and_update(header(2, 0, 0, ts=5_500), 1)
    assert state.remove_expired_producers(5_999) == []
    assert state.remove_expired_producers(6_000) == [1]
    assert state.entry(1) is None and state.entry(2) is not None
    assert state.check(header(1, 0, 17)).error is OK
    assert state.check(header(2, 0, 17)).error is OOO
