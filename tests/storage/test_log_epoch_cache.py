"""Leader epoch cache semantics (KIP-101/279), table-driven."""

import pytest

from storage.checkpoint import LeaderEpochCheckpointFile
from storage.epoch_cache import LeaderEpochCache
from storage.sim_fs import SimFileSystem

UNDEFINED = (-1, -1)
LEO = 500

# Cache: epoch 1 from 0, epoch 3 from 100, epoch 4 from 250; LEO 500.
CACHE = [(1, 0), (3, 100), (4, 250)]


@pytest.mark.parametrize(
    "requested, expected",
    [
        (-1, UNDEFINED),  # a bootstrapping follower
        (4, (4, LEO)),  # the latest epoch ends at the log end offset
        (3, (3, 250)),  # a known epoch ends where the next one starts
        (1, (1, 100)),
        (2, (1, 100)),  # unknown epoch: the largest epoch below it, and its end
        (0, (0, 0)),  # below the first entry: its start offset (KIP-279)
        (5, UNDEFINED),  # above anything known
    ],
)
def test_end_offset_for_epoch(requested, expected):
    assert LeaderEpochCache(CACHE).end_offset_for_epoch(requested, LEO) == expected


def test_empty_cache_knows_nothing():
    cache = LeaderEpochCache()
    assert cache.latest_epoch == -1
    assert cache.end_offset_for_epoch(0, LEO) == UNDEFINED
    assert cache.end_offset_for_epoch(-1, LEO) == UNDEFINED


@pytest.mark.parametrize(
    "assign, expected",
    [
        ((5, 300), CACHE + [(5, 300)]),  # a new epoch
        ((4, 260), CACHE),  # same epoch, later offset: nothing new
        ((4, 200), [(1, 0), (3, 100), (4, 200)]),  # same epoch, earlier start: replaced
        ((5, 250), [(1, 0), (3, 100), (5, 250)]),  # epoch 4 never wrote anything
        ((2, 300), [(1, 0), (2, 300)]),  # lower epoch: the later ones are dropped
    ],
)
def test_assign(assign, expected):
    cache = LeaderEpochCache(CACHE)
    cache.assign(*assign)
    assert cache.entries == expected
    assert cache.latest_epoch == expected[-1][0]


@pytest.mark.parametrize(
    "end_offset, expected",
    [(600, CACHE), (251, CACHE), (250, [(1, 0), (3, 100)]), (100, [(1, 0)]), (0, [])],
)
def test_truncate_from_end(end_offset, expected):
    cache = LeaderEpochCache(CACHE)
    cache.truncate_from_end(end_offset)
    assert cache.entries == expected


@pytest.mark.parametrize(
    "start_offset, expected",
    [
        (0, CACHE),
        (50, [(1, 50), (3, 100), (4, 250)]),
        (100, [(3, 100), (4, 250)]),
        (120, [(3, 120), (4, 250)]),
        (400, [(4, 400)]),
    ],
)
def test_truncate_from_start(start_offset, expected):
    cache = LeaderEpochCache(CACHE)
    cache.truncate_from_start(start_offset)
    assert cache.entries == expected


def test_epoch_for_offset():
    cache = LeaderEpochCache(CACHE)
    assert [cache.epoch_for_offset(o) for o in (0, 99, 100, 249, 250, 10**9)] == [1, 1, 3, 3, 4, 4]


def test_new_epochs_reach_the_checkpoint_file_at_flush_and_truncations_at_once_durably():
    fs = SimFileSystem(seed=0)
    fs.makedirs("/t-0")
    cp = LeaderEpochCheckpointFile(fs, "/t-0/leader-epoch-checkpoint")
    cache = LeaderEpochCache(checkpoint=cp)
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(2, 20)  # no change
    # A new epoch costs no file write (a leader change of thousands of
    # partitions): a crash loses it, and recovery re-assigns it from the batches.
    assert cp.read() == []
    assert cache.entries == [(1, 0), (2, 10)]
    fs.crash()
    assert cp.read() == []
    cache = LeaderEpochCache(checkpoint=cp)
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.flush()  # what Log.flush does before the recovery point moves
    fs.crash()
    assert cp.read() == [(1, 0), (2, 10)]
    cache.truncate_from_end(10)
    fs.crash()  # truncation is durable at once
    assert cp.read() == [(1, 0)]
    cache.assign(3, 30)
    cache.truncate_from_start(35)
    fs.crash()
    assert cp.read() == [(3, 35)]
    cache.clear()
    assert cp.read() == []
