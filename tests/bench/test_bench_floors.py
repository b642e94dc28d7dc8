"""The references the produce and consume benches read a broker's CPU per GB
against (bench/floors.py): they move exactly the bytes they claim, over a
real loopback socket and into a real file, and leave nothing behind."""

import os

import pytest

from bench.floors import CHUNK_BYTES, page_cache_write_cost, sendfile_floor
from bench.proc_stats import log_bytes, segment_files


def test_sendfile_floor_sends_every_byte_of_every_file(tmp_path):
    sizes = [3 * CHUNK_BYTES + 12345, 777, 0]
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i:020d}.log"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    floor = sendfile_floor(paths)
    # The reader counted what arrived; a short or long count raises instead.
    assert floor["bytes"] == sum(sizes)
    assert floor["cpu_s"] > 0
    assert floor["cpu_s_per_gb"] == pytest.approx(floor["cpu_s"] / (sum(sizes) / 1e9))


def test_page_cache_write_cost_writes_the_bytes_asked_and_removes_its_file(tmp_path):
    nbytes = 2 * CHUNK_BYTES + 4097
    cost = page_cache_write_cost(str(tmp_path), nbytes)
    assert cost["bytes"] == nbytes
    assert cost["cpu_s"] > 0
    assert cost["cpu_s_per_gb"] == pytest.approx(cost["cpu_s"] / (nbytes / 1e9))
    assert os.listdir(tmp_path) == []


def test_segment_files_are_the_topics_log_segments_only(tmp_path):
    for partition_dir, names in {
        "bench-consume-0": ["00000000000000000000.log", "00000000000000000000.index", "00000000000000005000.log"],
        "bench-consume-1": ["00000000000000000000.log", "00000000000000000000.timeindex"],
        "bench-consume-rf1-0": ["00000000000000000000.log"],  # another topic with our name as a prefix
        "__consumer_offsets-0": ["00000000000000000000.log"],
    }.items():
        (tmp_path / partition_dir).mkdir()
        for name in names:
            (tmp_path / partition_dir / name).write_bytes(b"x")
    found = [os.path.relpath(p, tmp_path) for p in segment_files(str(tmp_path), "bench-consume")]
    assert found == ["bench-consume-0/00000000000000000000.log", "bench-consume-0/00000000000000005000.log",
                     "bench-consume-1/00000000000000000000.log"]
    assert log_bytes(str(tmp_path), "bench-consume") == 3  # what the CPU per GB divides by: the same files
