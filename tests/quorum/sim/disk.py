"""A node's disk in the simulation: the Raft log, in one of two kinds.

- `MemoryDisk`: `quorum.raft.MemoryLog`; a crash keeps the flushed batches
  and maybe a few unflushed ones.
- `StorageDisk`: the production `StorageReplicatedLog` over `storage.Log` on
  the storage engine's `SimFileSystem`; a crash loses every unsynced write
  (or tears it), and the log is reopened and recovered like after a real
  power cut.

Both put a tripwire on truncation: no node may cut below a high watermark
it reported, and an observer (fed committed records only) may cut nothing.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING

from quorum.raft import MemoryLog
from quorum.raft.storage_log import StorageReplicatedLog
from quorum.raft.voters import VoterInfo
from storage.batch import iter_batch_headers, iter_records
from storage.config import LogConfig
from storage.sim_fs import SimFileSystem

from sim.invariants import SafetyViolation

if TYPE_CHECKING:
    from sim.node import SimNode

METADATA_DIR = "/data/__cluster_metadata-0"
# Small segments, so that rolls and snapshot-driven segment deletion happen.
LOG_CONFIG = LogConfig(segment_bytes=1024, index_interval_bytes=128, retention_ms=-1, retention_bytes=-1)


def check_truncation(node: SimNode, log_end_offset: int, offset: int) -> None:
    if offset < node.max_high_watermark:
        raise SafetyViolation(
            f"node {node.node_id} truncates to {offset}, below its high watermark {node.max_high_watermark}"
        )
    if not node.is_voter and offset < log_end_offset:
        raise SafetyViolation(f"observer {node.node_id} truncates its log to {offset}")


def know_initial_voters(node: SimNode, log: SimMemoryLog | SimStorageLog) -> None:
    """A disk formatted with the initial controllers knows their directory
    ids (`raftka storage format --initial-controllers` writes them), so the
    first voter change records them; a disk formatted again knows none."""
    if node.generation:
        return
    for node_id, directory_id in node.cluster.initial_directory_ids.items():
        if log.known_voter(node_id) is None:
            log.remember_voter(VoterInfo(node_id, directory_id))


@dataclasses.dataclass(frozen=True)
class SimBatch:
    base_offset: int
    epoch: int
    control: bool
    records: tuple[bytes, ...]

    @property
    def end_offset(self) -> int:
        return self.base_offset + len(self.records)


class SimMemoryLog(MemoryLog):
    def __init__(self, node: SimNode) -> None:
        super().__init__()
        self.node = node

    def truncate_to(self, offset: int) -> None:
        check_truncation(self.node, self.log_end_offset, offset)
        super().truncate_to(offset)


class SimStorageLog(StorageReplicatedLog):
    node: SimNode

    def truncate_to(self, offset: int) -> None:
        check_truncation(self.node, self.log_end_offset, offset)
        super().truncate_to(offset)


class MemoryDisk:
    kind = "memory"

    def __init__(self, node: SimNode, seed: int) -> None:
        self.log = SimMemoryLog(node)
        know_initial_voters(node, self.log)

    def crash(self, rng: random.Random) -> None:
        self.log.crash(keep_unflushed_batches=rng.choice([0, 0, 1, 2]))

    def batches(self, start: int, end: int | None = None) -> list:
        return self.log.batches(start, end)


class StorageDisk:
    kind = "storage"

    def __init__(self, node: SimNode, seed: int) -> None:
        self.node = node
        self.fs = SimFileSystem(seed=seed)
        self.log = self._open()

    def _open(self) -> SimStorageLog:
        log = SimStorageLog.open(METADATA_DIR, now_ms=0, fs=self.fs, config=LOG_CONFIG)
        log.node = self.node
        know_initial_voters(self.node, log)
        return log

    def crash(self, rng: random.Random) -> None:
        self.fs.crash(tear=rng.random() < 0.5)
        self.log = self._open()

    def batches(self, start: int, end: int | None = None) -> list[SimBatch]:
        log = self.log
        start = max(start, log.log_start_offset)
        if start >= log.log_end_offset:
            return []
        data = log.read(start, 1 << 30, end)
        out = []
        for pos, header in iter_batch_headers(data):
            records = tuple(r.value or b"" for r in iter_records(data, pos))
            out.append(SimBatch(header.base_offset, header.partition_leader_epoch, header.is_control, records))
        return out
