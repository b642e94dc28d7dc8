"""A test fixture: one combined node (`process.roles=broker,controller`) run
with the `raftka` CLI from a properties map, formatted first, stopped with
SIGTERM (SIGKILL if it hangs)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from cluster_testing import READY_TIMEOUT_S, ReadyLine, raftka_command, run_cli

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"


def write_properties(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
    return path


class SecureNode:
    def __init__(self, data_dir: Path, props: dict[str, str], *format_args: str) -> None:
        self.data_dir = data_dir
        self.props = {"process.roles": "broker,controller", "node.id": "1", "log.dirs": str(data_dir / "logs"),
                      "offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
                      "transaction.state.log.min.isr": "1", "group.initial.rebalance.delay.ms": "0", **props}
        self.config = write_properties(data_dir / "server.properties", self.props)
        self.format_args = format_args
        self.process: subprocess.Popen[str] | None = None
        self.stderr_path = data_dir / "node.err"

    def format(self) -> subprocess.CompletedProcess[str]:
        return run_cli("storage", "format", "--config", str(self.config), "--cluster-id", CLUSTER_ID,
                       *self.format_args)

    def start(self) -> str:
        formatted = self.format()
        assert formatted.returncode == 0, formatted.stderr
        return self.start_formatted()

    def start_formatted(self) -> str:
        with open(self.stderr_path, "w") as err:
            self.process = subprocess.Popen(raftka_command("broker", "--config", str(self.config)),
                                            stdout=subprocess.PIPE, stderr=err, text=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = ReadyLine(self.process)
        try:
            return self.reader.wait("READY ", READY_TIMEOUT_S, self.process)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nnode stderr:\n{self.log()[-3000:]}") from None

    def log(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
