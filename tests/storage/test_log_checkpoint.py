"""Checkpoint files: Kafka's text format, atomic replacement."""

import pytest

from storage.checkpoint import (
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    format_checkpoint,
    parse_checkpoint,
    write_atomically,
)
from storage.errors import CorruptCheckpointError
from storage.fs import OsFileSystem
from storage.sim_fs import SimFileSystem


def test_offset_checkpoint_round_trip_in_kafka_format(tmp_path):
    path = str(tmp_path / "recovery-point-offset-checkpoint")
    cp = OffsetCheckpointFile(OsFileSystem(), path)
    assert cp.read() == {}
    cp.write({("orders", 1): 99, ("orders", 0): 1234, ("__cluster_metadata", 0): 7})
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == (
        "0\n3\n__cluster_metadata 0 7\norders 0 1234\norders 1 99\n"
    )
    assert cp.read() == {("orders", 1): 99, ("orders", 0): 1234, ("__cluster_metadata", 0): 7}
    cp.update({("orders", 1): 100, ("logs", 3): 5})
    assert cp.read() == {("orders", 1): 100, ("orders", 0): 1234, ("__cluster_metadata", 0): 7, ("logs", 3): 5}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_leader_epoch_checkpoint_round_trip(tmp_path):
    cp = LeaderEpochCheckpointFile(OsFileSystem(), str(tmp_path / "leader-epoch-checkpoint"))
    cp.write([(0, 0), (3, 150), (4, 900)])
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n3\n0 0\n3 150\n4 900\n"
    assert cp.read() == [(0, 0), (3, 150), (4, 900)]


@pytest.mark.parametrize(
    "text",
    ["", "1\n0\n", "0\n2\nt 0 1\n", "0\nx\n", "0\n1\nt 0\n", "0\n1\nt zero 1\n", "\xff\xfe"],
)
def test_malformed_checkpoints_are_refused(tmp_path, text):
    path = tmp_path / "cp"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(CorruptCheckpointError):
        OffsetCheckpointFile(OsFileSystem(), str(path)).read()


def test_format_and_parse_are_inverse():
    entries = [("a", 1, 2), ("b", 0, 1 << 40)]
    assert parse_checkpoint(format_checkpoint(entries), 3, "x") == [["a", "1", "2"], ["b", "0", str(1 << 40)]]


class _DiesBeforeRename(SimFileSystem):
    """A process that can be killed after it wrote and fsynced the temp
    file, before the rename."""

    die_on_rename = False

    def rename(self, src, dst):
        if self.die_on_rename:
            raise KeyboardInterrupt("killed before rename")
        super().rename(src, dst)


def test_crash_between_write_and_rename_leaves_the_old_file():
    fs = _DiesBeforeRename(seed=1)
    fs.makedirs("/logs")
    cp = OffsetCheckpointFile(fs, "/logs/recovery-point-offset-checkpoint")
    cp.write({("t", 0): 10})
    fs.die_on_rename = True
    with pytest.raises(KeyboardInterrupt):
        cp.write({("t", 0): 20})
    fs.crash(tear=True)
    assert cp.read() == {("t", 0): 10}
    # The next write replaces the stray temp file.
    fs.die_on_rename = False
    cp.write({("t", 0): 30})
    fs.crash()
    assert cp.read() == {("t", 0): 30}


def test_crash_after_rename_gives_old_or_new_never_a_mix():
    for lose_dir_ops in (True, False):
        for tear in (True, False):
            fs = SimFileSystem(seed=5)
            fs.makedirs("/logs")
            path = "/logs/log-start-offset-checkpoint"
            write_atomically(fs, path, b"0\n1\nt 0 10\n")
            # Rename done but the directory fsync never happens.
            fs.fsync_dir = lambda d: None
            write_atomically(fs, path, b"0\n1\nt 0 20\n")
            fs.crash(tear=tear, lose_dir_ops=lose_dir_ops)
            got = OffsetCheckpointFile(fs, path).read()
            assert got == ({("t", 0): 10} if lose_dir_ops else {("t", 0): 20})


def test_a_checkpoint_cut_short_by_a_crash_is_refused_not_misread():
    # "0 10" cut after "0 1" would otherwise read as epoch 0 starting at offset 1.
    whole = format_checkpoint([(0, 10)])
    for cut in range(len(whole) - 1, 0, -1):
        with pytest.raises(CorruptCheckpointError):
            parse_checkpoint(whole[:cut], 2, "leader-epoch-checkpoint")
    assert parse_checkpoint(whole, 2, "leader-epoch-checkpoint") == [["0", "10"]]
