"""Helpers for the bench scenario tests: `raftka bench ...` as a real process, its rows, its descendants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from bench.results import read_rows, read_samples

REQUIRED_ROW_FIELDS = {"run_id", "scenario", "mode", "params", "metric", "value", "unit", "timestamp_ms", "git_sha"}


def bench_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "raftka.cli", "bench", *args]


def run_bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bench_command(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def json_rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def by_metric(rows: list[dict]) -> dict[str, dict]:
    return {r["metric"]: r for r in rows}


def stored(results: str, scenario: str, mode: str = "kraft") -> tuple[list[dict], list[dict]]:
    """(rows, raw samples) of `scenario` in the results dir, every required field checked."""
    rows = [r for r in read_rows(results) if r["scenario"] == scenario]
    for r in rows:
        missing = {f for f in REQUIRED_ROW_FIELDS if r.get(f) in (None, "")}
        assert not missing, (r, missing)
        assert r["mode"] == mode and isinstance(json.loads(r["params"]), dict)
    return rows, [s for s in read_samples(results) if s["scenario"] == scenario]


# --- processes -------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from the PPid fields in /proc (no psutil)."""
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return "?"


class BenchProcess:
    """`raftka bench ...` in the background; its stderr lines collected as they come."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(bench_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self.seen: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def watch_until(self, predicate, timeout: float) -> None:
        """Record descendants every 50 ms until predicate(self) holds."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            self.seen |= descendants(self.process.pid)
            assert self.process.poll() is None, f"bench exited early ({self.process.returncode}): {self.lines[-20:]}"
            assert time.monotonic() < deadline, f"timed out; stderr so far: {self.lines[-20:]}"
            time.sleep(0.05)
        self.seen |= descendants(self.process.pid)

    def printed(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def kill_everything(self) -> None:
        """Teardown: whatever happened, leave nothing behind."""
        for pid in self.seen | descendants(self.process.pid) | {self.process.pid}:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.process.wait()
