"""Start and stop a local ZooKeeper ensemble (1 or 3 servers on loopback).

The ZooKeeper is the Debian `zookeeper` package (3.8), run as
`java -cp zookeeper.jar:slf4j-simple.jar QuorumPeerMain zoo.cfg`. The jar's
manifest `Class-Path` already names its dependencies (jute, netty, metrics,
slf4j-api, ...), so that short classpath is all it takes; slf4j-simple only
gives it a logger (without it, slf4j falls back to no logging with a warning).

Each server gets a directory under `base_dir` holding its generated
`zoo.cfg`, its `myid` and data, and `server.log` (its stdout and stderr).
Every port binds 127.0.0.1; the admin HTTP server is off. `start()` returns
once every server answers the `srvr` four-letter command with a `Mode:` line
(standalone, leader or follower), i.e. once the ensemble serves requests.
`tick_time_ms` bounds session timeouts to [2, 20] ticks, so tests use 500 ms
for fast session expiry.

This is an I/O shell used by `raftka cluster up --mode zk`, tests and
benches; it blocks, so trio code calls it through `trio.to_thread`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from quorum.zookeeper.errors import EnsembleError
from common.wire.ports import free_ports

JAVA_DIR = Path("/usr/share/java")
ZOOKEEPER_JAR = JAVA_DIR / "zookeeper.jar"
SLF4J_SIMPLE_JAR = JAVA_DIR / "slf4j-simple.jar"
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: Small heap and the serial collector: the machine is shared and ZooKeeper's
#: working set here is a few MB.
DEFAULT_JVM_OPTS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def zookeeper_missing_reason() -> str | None:
    """Why a ZooKeeper server cannot run here, or None if it can."""
    if shutil.which("java") is None:
        return "java is not installed (run `make sysdeps`: apt-get install zookeeper pulls in a JRE)"
    for jar in (ZOOKEEPER_JAR, SLF4J_SIMPLE_JAR):
        if not jar.exists():
            return f"{jar} is missing (run `make sysdeps` to install the Debian zookeeper package)"
    return None


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (`ruok`, `srvr`, `mntr`...) and return the answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word.encode())
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def server_mode(host: str, port: int) -> str | None:
    """'standalone', 'leader' or 'follower' if the server serves requests, else None."""
    try:
        answer = four_letter_word(host, port, "srvr")
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class ZooKeeperServer:
    server_id: int
    client_port: int
    peer_port: int
    election_port: int
    directory: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _die_with_parent() -> None:
    # Linux: SIGKILL the server if the process that started it dies, so a
    # crashed test run leaves no JVM behind. (PR_SET_PDEATHSIG = 1.)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class ZooKeeperEnsemble:
    """A 1- or 3-server ZooKeeper ensemble on 127.0.0.1, for one cluster's lifetime."""

    def __init__(self, base_dir: str | os.PathLike, size: int = 1, *, tick_time_ms: int = 2000,
                 base_port: int | None = None, host: str = "127.0.0.1", force_sync: bool = True,
                 log_level: str = "info", jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS) -> None:
        if size not in (1, 3, 5):
            raise EnsembleError(f"a ZooKeeper ensemble has 1, 3 or 5 servers, not {size}")
        self.base_dir = Path(base_dir)
        self.size = size
        self.tick_time_ms = tick_time_ms
        self.host = host
        self.force_sync = force_sync
        self.log_level = log_level
        self.jvm_opts = jvm_opts
        self.servers: list[ZooKeeperServer] = []
        for i in range(size):
            if base_port is None:
                ports = tuple(free_ports(3, host))
            else:
                ports = (base_port + i, base_port + 100 + i, base_port + 200 + i)
            self.servers.append(ZooKeeperServer(i + 1, *ports, self.base_dir / f"zk{i + 1}"))

    @property
    def connect_string(self) -> str:
        """The `zookeeper.connect` string: `127.0.0.1:p1,127.0.0.1:p2,...`."""
        return ",".join(f"{self.host}:{s.client_port}" for s in self.servers)

    @property
    def min_session_timeout_ms(self) -> int:
        return 2 * self.tick_time_ms

    @property
    def max_session_timeout_ms(self) -> int:
        return 20 * self.tick_time_ms

    def zoo_cfg(self, server: ZooKeeperServer) -> str:
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={server.directory / 'data'}",
            f"clientPort={server.client_port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,mntr,stat,conf",
            "initLimit=10",
            "syncLimit=5",
            "maxClientCnxns=0",
            # Unknown keys become `zookeeper.<key>` system properties: 4 MB
            # transaction-log preallocation instead of 64 MB per log file.
            "preAllocSize=4096",
            f"forceSync={'yes' if self.force_sync else 'no'}",
        ]
        if self.size > 1:
            lines += [f"server.{s.server_id}={self.host}:{s.peer_port}:{s.election_port}" for s in self.servers]
        return "\n".join(lines) + "\n"

    # --- lifecycle ------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> ZooKeeperEnsemble:
        """Start every server and wait until the ensemble serves; EnsembleError if it does not in time."""
        reason = zookeeper_missing_reason()
        if reason is not None:
            raise EnsembleError(f"cannot start ZooKeeper: {reason}")
        for server in self.servers:
            self.start_server(server.server_id, wait=False)
        self.wait_serving(timeout_s)
        return self

    def start_server(self, server_id: int, *, wait: bool = True, timeout_s: float = 30.0) -> None:
        """(Re)start one server, keeping its data (for fault injection)."""
        server = self.server(server_id)
        if server.running:
            return
        data = server.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{server.server_id}\n")
        cfg = server.directory / "zoo.cfg"
        cfg.write_text(self.zoo_cfg(server))
        command = ["java", *self.jvm_opts, f"-Dorg.slf4j.simpleLogger.defaultLogLevel={self.log_level}",
                   "-Dzookeeper.admin.enableServer=false", "-cp", f"{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}",
                   MAIN_CLASS, str(cfg)]
        on_main_thread = threading.current_thread() is threading.main_thread()
        with open(server.log_path, "ab") as log:
            server.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=server.directory,
                start_new_session=True,
                # The death signal follows the *thread* that forked; only the
                # main thread lives as long as the process.
                preexec_fn=_die_with_parent if on_main_thread else None,
            )
        if wait:
            self._wait(lambda: server_mode(self.host, server.client_port) is not None, timeout_s,
                       f"ZooKeeper server {server_id} did not start serving")

    def wait_serving(self, timeout_s: float = 30.0) -> None:
        """Wait until every running server answers with a mode (the ensemble has a quorum)."""
        def serving() -> bool:
            return all(server_mode(self.host, s.client_port) is not None for s in self.servers if s.running)
        self._wait(serving, timeout_s, "the ZooKeeper ensemble did not start serving")

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [s for s in self.servers if s.process is not None and s.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                s = dead[0] if dead else self.servers[0]
                status = f"server {s.server_id} exited with {s.process.returncode}" if dead else f"after {timeout_s}s"
                self.stop()
                raise EnsembleError(f"{what} ({status}); log tail of server {s.server_id} ({s.log_path}):\n"
                                    f"{s.log_tail()}")
            time.sleep(0.05)

    def stop_server(self, server_id: int, sig: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
        """Stop one server (SIGTERM, then SIGKILL after `grace_s`); SIGKILL for a crash."""
        server = self.server(server_id)
        process = server.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
                process.send_signal(sig)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        server.process = None

    def pause_server(self, server_id: int) -> None:
        """SIGSTOP one server (a long GC pause or a hung disk, to its peers and clients)."""
        server = self.server(server_id)
        assert server.running, f"server {server_id} is not running"
        server.process.send_signal(signal.SIGSTOP)

    def resume_server(self, server_id: int) -> None:
        server = self.server(server_id)
        assert server.running, f"server {server_id} is not running"
        server.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop every server. Idempotent."""
        for server in self.servers:
            self.stop_server(server.server_id)

    def server(self, server_id: int) -> ZooKeeperServer:
        return self.servers[server_id - 1]

    def leader_id(self) -> int | None:
        """The server id of the current leader (the only server, when standalone)."""
        for s in self.servers:
            if s.running and server_mode(self.host, s.client_port) in ("leader", "standalone"):
                return s.server_id
        return None

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
