"""The simulated disk loses exactly what POSIX allows it to lose."""

import pytest

from storage.sim_fs import SimCrashedError, SimFileSystem


@pytest.fixture
def fs():
    fs = SimFileSystem(seed=7)
    fs.makedirs("/d")
    return fs


def test_unsynced_bytes_are_lost_synced_bytes_survive(fs):
    f = fs.open("/d/a")
    fs.fsync_dir("/d")
    f.append(b"durable")
    f.fsync()
    f.append(b"-volatile")
    assert fs.read_file("/d/a") == b"durable-volatile"
    fs.crash()
    assert fs.read_file("/d/a") == b"durable"


def test_create_without_dir_fsync_is_lost(fs):
    f = fs.open("/d/new")
    f.append(b"x")
    f.fsync()
    fs.crash()
    assert not fs.exists("/d/new")


def test_rename_and_remove_without_dir_fsync_are_undone(fs):
    for name in ("a", "b"):
        f = fs.open(f"/d/{name}")
        f.append(name.encode())
        f.fsync()
    fs.fsync_dir("/d")
    fs.rename("/d/a", "/d/c")
    fs.remove("/d/b")
    fs.crash()
    assert sorted(fs.listdir("/d")) == ["a", "b"]


def test_dir_ops_survive_when_asked(fs):
    f = fs.open("/d/a")
    f.append(b"x")
    f.fsync()
    fs.crash(lose_dir_ops=False)
    assert fs.read_file("/d/a") == b"x"


def test_truncate_is_not_durable_until_fsync(fs):
    f = fs.open("/d/a")
    fs.fsync_dir("/d")
    f.append(b"0123456789")
    f.fsync()
    f.truncate(3)
    fs.crash()
    assert fs.read_file("/d/a") == b"0123456789"


def test_tear_keeps_a_prefix_of_the_unsynced_writes():
    seen = set()
    for seed in range(40):
        fs = SimFileSystem(seed=seed)
        fs.makedirs("/d")
        f = fs.open("/d/a")
        fs.fsync_dir("/d")
        f.append(b"AAAA")
        f.fsync()
        f.append(b"BBBB")
        f.append(b"CCCC")
        fs.crash(tear=True)
        data = fs.read_file("/d/a")
        assert (b"AAAABBBBCCCC").startswith(data) and data.startswith(b"AAAA")
        seen.add(len(data))
    # Over 40 seeds the cut lands in several places, mid-write included.
    assert len(seen) > 3 and any(n % 4 for n in seen)


def test_same_seed_same_tear():
    def run():
        fs = SimFileSystem(seed=3)
        fs.makedirs("/d")
        f = fs.open("/d/a")
        fs.fsync_dir("/d")
        f.append(bytes(range(200)))
        fs.crash(tear=True)
        return fs.read_file("/d/a")

    assert run() == run()


def test_handles_die_with_the_crash(fs):
    f = fs.open("/d/a")
    fs.crash()
    with pytest.raises(SimCrashedError, match="reopen"):
        f.append(b"x")
