"""LocalQuorum: N `raftka controller` processes on loopback, for tests and benchmarks.

Each voter gets a free port, its own log dir under `base_dir` (formatted
with one cluster id, as `raftka storage format` does) and a properties
file with Kafka's keys plus `overrides`. Processes run `python -m
raftka.cli controller --config F`, with stdout and stderr appended to
`base_dir/node-<id>.log`. `kill` sends SIGKILL (or any signal), `start`
restarts a voter on its data dir. Leaving the `with` block kills every
process, whatever happened.

`metadata_records_on_disk(log_dir)` reads a stopped voter's metadata log
from its files (snapshot, then batches), for checks after a run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.node.applier import committed_records
from quorum.node.metadata_log import open_metadata_log
from quorum.node.snapshots import image_of_snapshot
from common.errors import RaftkaError
from common.meta_properties import format_log_dir, random_cluster_id
from common.wire.ports import free_ports


class LocalQuorum:
    def __init__(self, base_dir: str | Path, voters: int = 3, overrides: dict[str, str] | None = None) -> None:
        self.base_dir = Path(base_dir)
        self.cluster_id = random_cluster_id()
        self.overrides = dict(overrides or {})
        # quorum.engine=pysyncobj listens on a second port per controller: pick those free too.
        pysyncobj_ports = self.overrides.get("quorum.engine") == "pysyncobj" \
            and "quorum.pysyncobj.port" not in self.overrides
        ports = free_ports(voters * (2 if pysyncobj_ports else 1))
        self.voters = {i + 1: ("127.0.0.1", ports[i]) for i in range(voters)}
        if pysyncobj_ports:
            self.overrides["quorum.pysyncobj.port"] = ",".join(f"{i + 1}@{ports[voters + i]}" for i in range(voters))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        voters_value = ",".join(f"{n}@{h}:{p}" for n, (h, p) in self.voters.items())
        for node_id in self.voters:
            log_dir = self.log_dir(node_id)
            format_log_dir(log_dir, self.cluster_id, node_id)
            props = {"node.id": str(node_id), "process.roles": "controller",
                     "controller.quorum.voters": voters_value, "log.dirs": str(log_dir), **self.overrides}
            self.config_path(node_id).write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def log_dir(self, node_id: int) -> Path:
        return self.base_dir / f"node-{node_id}"

    def config_path(self, node_id: int) -> Path:
        return self.base_dir / f"controller-{node_id}.properties"

    def output_path(self, node_id: int) -> Path:
        return self.base_dir / f"node-{node_id}.log"

    def bootstrap(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.voters.values())

    # --- processes ---------------------------------------------------------------

    def start(self, node_id: int) -> None:
        assert not self.is_running(node_id), f"node {node_id} is already running"
        out = open(self.output_path(node_id), "ab")
        try:
            self.processes[node_id] = subprocess.Popen(
                [sys.executable, "-m", "raftka.cli", "controller", "--config", str(self.config_path(node_id))],
                stdout=out, stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[2]),
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            out.close()

    def start_all(self) -> None:
        for node_id in self.voters:
            self.start(node_id)

    def is_running(self, node_id: int) -> bool:
        p = self.processes.get(node_id)
        return p is not None and p.poll() is None

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        p = self.processes[node_id]
        if p.poll() is None:
            p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop(self, node_id: int) -> None:
        """Graceful stop (SIGTERM); a SIGKILL if it does not exit in 10 s."""
        self.kill(node_id, signal.SIGTERM)

    def stop_all(self) -> None:
        for node_id in self.voters:
            if node_id in self.processes:
                self.stop(node_id)

    def wait_listening(self, node_id: int, timeout_s: float = 20.0) -> None:
        host, port = self.voters[node_id]
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.is_running(node_id):
                raise RaftkaError(f"controller {node_id} exited; see {self.output_path(node_id)}:\n"
                                  + self.output_path(node_id).read_text()[-3000:])
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RaftkaError(f"controller {node_id} not listening after {timeout_s} s") from None
                time.sleep(0.02)

    def __enter__(self) -> LocalQuorum:
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.processes.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def metadata_records_on_disk(log_dir: str | Path) -> tuple[MetadataImage | None, list[LoggedRecord]]:
    """(the snapshot's image or None, the committed-or-not records after it) of a stopped node."""
    log = open_metadata_log(str(log_dir), clock_ms=lambda: time.time_ns() // 1_000_000)
    try:
        image = None
        if log.latest_snapshot_id is not None:
            image = image_of_snapshot(log.snapshot_data(log.latest_snapshot_id))
        records: list[LoggedRecord] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read(offset, 4 * 1024 * 1024)
            batch_records, spans = committed_records(data)
            records += batch_records
            offset = spans[-1].last_offset + 1
        return image, records
    finally:
        log.storage_log.close()
