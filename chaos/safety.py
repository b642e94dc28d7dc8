"""Metadata safety after a run, from what the controllers left behind.

- One leader per Raft epoch: every controller logs the role it takes
  (`node N: <role> in epoch E (leader L), ...`) and when it becomes the
  active leader (`node N is the active leader of epoch E ...`); two nodes
  claiming one epoch is a violation. `leaders_per_epoch` is pure (it reads
  text); `controller_logs` gathers the text.
- Committed metadata logs agree: every controller's metadata log, read
  from its files once it stopped (`metadata_records_on_disk`), is a prefix
  of the longest (on the offsets both hold: a snapshot may start one later).

In ZooKeeper mode there is no Raft quorum: what is checked is that each
controller epoch had one controller (each broker logs `broker N is the
controller at epoch E` when ZooKeeper elects it).

Partition leader epochs never going back are checked on the data, not here:
the metadata log cannot show it (a PartitionChangeRecord carries no leader
epoch; replaying it bumps the epoch), each replica's batches can
(chaos.on_disk.epoch_regressions).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

_ROLE = re.compile(r"node (\d+): (\w+) in epoch (\d+) \(leader")
_ACTIVE = re.compile(r"node (\d+) is the active leader of epoch (\d+)")
_ZK_CONTROLLER = re.compile(r"broker (\d+) is the controller at epoch (\d+)")


def leaders_per_epoch(logs: dict[int, str]) -> dict[int, set[int]]:
    """Epoch -> the nodes that claimed its leadership, from each node's log text."""
    leaders: dict[int, set[int]] = defaultdict(set)
    for text in logs.values():
        for m in _ROLE.finditer(text):
            if m.group(2).lower().startswith("leader"):
                leaders[int(m.group(3))].add(int(m.group(1)))
        for m in _ACTIVE.finditer(text):
            leaders[int(m.group(2))].add(int(m.group(1)))
    return dict(leaders)


def zk_controllers_per_epoch(logs: dict[int, str]) -> dict[int, set[int]]:
    """Controller epoch -> the brokers that said they were its controller."""
    found: dict[int, set[int]] = defaultdict(set)
    for text in logs.values():
        for m in _ZK_CONTROLLER.finditer(text):
            found[int(m.group(2))].add(int(m.group(1)))
    return dict(found)


def check_zk_controllers(brokers: dict[int, Path]) -> dict[str, Any]:
    """brokers: node id -> its output file."""
    texts = {n: _read(p) for n, p in brokers.items()}
    epochs = zk_controllers_per_epoch(texts)
    violations = [f"controller epoch {e} had controllers {sorted(n)}" for e, n in sorted(epochs.items()) if len(n) > 1]
    return {"epochs": len(epochs), "leaders_per_epoch": {str(e): sorted(n) for e, n in sorted(epochs.items())},
            "multiple_leaders": violations, "valid": not violations,
            "note": "zk mode: one controller per controller epoch; no Raft metadata log to compare"}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def prefix_violations(logs: dict[int, list[tuple[int, int, Any]]]) -> list[str]:
    """Where a node's (offset, epoch, record) disagrees with the longest log at one offset."""
    if not logs:
        return []
    longest_id = max(logs, key=lambda n: (logs[n][-1][0] if logs[n] else -1, n))
    reference = {offset: (epoch, record) for offset, epoch, record in logs[longest_id]}
    found = []
    for node, records in sorted(logs.items()):
        for offset, epoch, record in records:
            ref = reference.get(offset)
            if ref is not None and ref != (epoch, record):
                found.append(f"controller {node} has {record!r} (epoch {epoch}) at metadata offset {offset}; "
                             f"controller {longest_id} has {ref[1]!r} (epoch {ref[0]})")
                break
    return found


def check_metadata(controllers: dict[int, tuple[Path, Path]]) -> dict[str, Any]:
    """controllers: node id -> (its log dir, its output file). The nodes must have stopped."""
    from cluster.local_quorum import metadata_records_on_disk

    texts = {node: _read(output) for node, (_, output) in controllers.items()}
    leaders = leaders_per_epoch(texts)
    violations = [f"epoch {epoch} had leaders {sorted(nodes)}" for epoch, nodes in sorted(leaders.items())
                  if len(nodes) > 1]
    logs: dict[int, list[tuple[int, int, Any]]] = {}
    unreadable = {}
    for node, (log_dir, _) in controllers.items():
        try:
            _, records = metadata_records_on_disk(log_dir)
            logs[node] = [(r.offset, r.epoch, r.record) for r in records]
        except Exception as exc:  # a log the reader cannot open is reported, not fatal
            unreadable[node] = f"{type(exc).__name__}: {exc}"
    prefix = prefix_violations(logs)
    return {
        "epochs": len(leaders),
        "leaders_per_epoch": {str(e): sorted(n) for e, n in sorted(leaders.items())},
        "multiple_leaders": violations,
        "metadata_log_lengths": {str(n): len(r) for n, r in sorted(logs.items())},
        "prefix_violations": prefix,
        "unreadable": unreadable,
        "valid": not violations and not prefix,
    }
