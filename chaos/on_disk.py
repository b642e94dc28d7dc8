"""The workload topic's replicas as the brokers left them on disk, read after they stopped.

Two uses:

- every record's producer identity (producer id, epoch, sequence), which no
  Kafka consumer API shows: with it the checker can tell a duplicate the
  broker let through (one producer epoch and sequence, twice: a broker bug)
  from one the client wrote twice (librdkafka's idempotent producer, after a
  message times out, bumps its epoch and sends again under the new epoch
  records an earlier request may already have written);
- replica agreement: every broker's copy of a partition must hold the same
  record at every offset below the final high watermark;
- leader epochs never going back: each batch carries the epoch of the leader
  that wrote it, and along a replica's log the epochs never decrease.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from storage.batch import iter_batch_headers, iter_records


class StoredRecord(NamedTuple):
    offset: int
    value: str | None
    producer_id: int
    producer_epoch: int
    sequence: int  # -1 for a non-idempotent producer's record
    leader_epoch: int = -1  # of the batch: the epoch of the leader that appended it


def read_replica(partition_dir: Path) -> dict[int, StoredRecord]:
    """offset -> record of one replica (a `<topic>-<partition>` dir); control batches left out."""
    out: dict[int, StoredRecord] = {}
    for segment in sorted(partition_dir.glob("*.log")):
        buf = segment.read_bytes()
        for pos, header in iter_batch_headers(buf):
            if header.is_control:
                continue
            for i, record in enumerate(iter_records(buf, pos)):
                seq = header.base_sequence + i if header.base_sequence >= 0 else -1
                value = None if record.value is None else bytes(record.value).decode(errors="replace")
                out[record.offset] = StoredRecord(record.offset, value, header.producer_id, header.producer_epoch,
                                                  seq, header.partition_leader_epoch)
    return out


def read_partition(broker_dirs: dict[int, Path], topic: str, partition: int) -> dict[int, dict[int, StoredRecord]]:
    """broker id -> its replica of `topic`-`partition` (brokers without one are left out)."""
    replicas = {}
    for broker, log_dir in sorted(broker_dirs.items()):
        d = log_dir / f"{topic}-{partition}"
        if d.is_dir():
            replicas[broker] = read_replica(d)
    return replicas


def divergences(replicas: dict[int, dict[int, StoredRecord]], below: int) -> list[str]:
    """Offsets under `below` where two replicas hold different records (first one per pair of brokers)."""
    found = []
    brokers = sorted(replicas)
    for i, a in enumerate(brokers):
        for b in brokers[i + 1:]:
            for offset in sorted(set(replicas[a]) & set(replicas[b])):
                if offset >= below:
                    break
                ra, rb = replicas[a][offset], replicas[b][offset]
                if ra != rb:
                    found.append(f"offset {offset}: broker {a} has {ra}, broker {b} has {rb}")
                    break
    return found


def epoch_regressions(replicas: dict[int, dict[int, StoredRecord]]) -> list[str]:
    """Where a replica's leader epoch goes down from one batch to a later one (first per replica)."""
    found = []
    for broker, records in sorted(replicas.items()):
        before: StoredRecord | None = None
        for offset in sorted(records):
            r = records[offset]
            if before is not None and r.leader_epoch < before.leader_epoch:
                found.append(f"broker {broker}: offset {before.offset} has leader epoch {before.leader_epoch}, "
                             f"the later offset {offset} has {r.leader_epoch}")
                break
            before = r
    return found
