"""README.md, followed as a new user follows it.

Every ```sh, ```bash and ```python block of the README runs, in the order the
page gives them, unless the line before its fence is a visible
`<!-- not run: reason -->` comment. A shell block whose command is
`raftka dev` or `raftka cluster up` starts that server with the README's own
command line, plus a free port and a data dir under the test's temp dir
(the user's port 9092 may be taken on a shared machine, and their
/tmp/raftka-dev is theirs); the test waits for its READY line, and the blocks
after it talk to it: `localhost:9092` in them becomes the bootstrap that
READY printed. The next server block, or the end, stops the server with
SIGTERM, and it must exit 0 (a clean stop). `raftka` is this checkout's
command line (`python -m raftka.cli`, with this checkout first on
PYTHONPATH).

Blocks of other languages (```properties, ```console, ...) are not run; the
properties files are checked by formatting a data dir with them, as the
README's multi-host steps do first.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

RUN_LANGUAGES = {"sh", "bash", "python"}
SERVER_COMMANDS = {("raftka", "dev"): ["--port", "0"], ("raftka", "cluster", "up"): ["--base-port", "0"]}
README_BOOTSTRAP = re.compile(r"\b(?:localhost|127\.0\.0\.1):9092\b")
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->$")
FENCE = re.compile(r"^```(?P<language>[\w-]*)\s*$")
#: Blocks left out must stay few: each one is a command a reader cannot trust.
MAX_NOT_RUN = 5
READY_TIMEOUT_S = 180.0
SNIPPET_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 90.0
#: The issue's check for development history in the documentation.
HISTORY = re.compile(
    r"(third|fourth|fifth|sixth|[a-z]+teenth|twentieth|twenty-[a-z]+) [a-z]+'s"
    r"|(third|fourth|fifth|sixth|[a-z]+teenth|twentieth|twenty-[a-z]+) round",
    re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"README.md:{self.line}"


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        assert end < len(lines), f"README.md:{i + 1}: a code block is never closed"
        marker = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        blocks.append(Block(match["language"], "\n".join(lines[i + 1:end]) + "\n", i + 1,
                            marker["reason"] if marker else None))
        i = end + 1
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block, continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        for part in line.split(";"):
            words = shlex.split(part, comments=True)
            if words:
                commands.append(words)
    return commands


def server_overrides(block: Block) -> list[str] | None:
    """The extra arguments for a block that starts a server, else None."""
    if block.language not in ("sh", "bash"):
        return None
    commands = shell_commands(block.text)
    for prefix, extra in SERVER_COMMANDS.items():
        if any(tuple(words[:len(prefix)]) == prefix for words in commands):
            assert len(commands) == 1, (f"{block.where}: a block that starts `{' '.join(prefix)}` runs in the "
                                        "foreground until Ctrl-C, so it must hold that one command only")
            return extra
    return None


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    return readme_blocks(README.read_text())


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A shell environment whose `raftka` is this checkout's command line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "raftka"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m raftka.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Server:
    """A README server command running in the background until `stop`."""

    def __init__(self, block: Block, extra: list[str], data_dir: Path, env: dict[str, str], cwd: Path) -> None:
        (words,) = shell_commands(block.text)
        self.block = block
        self.log_path = data_dir.with_suffix(".stderr")
        self.argv = ["raftka", *words[1:], *extra, "--data-dir", str(data_dir)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.bootstrap = self._wait_ready()

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def _wait_ready(self) -> str:
        assert self.process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        out = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk
                match = re.search(rb"^READY bootstrap=(\S+)$", out, re.MULTILINE)
                if match:
                    return match.group(1).decode()
            elif self.process.poll() is not None:
                break
        self.kill()
        pytest.fail(f"{self.block.where}: `{' '.join(self.argv)}` printed no READY line within "
                    f"{READY_TIMEOUT_S:.0f} s (exit {self.process.returncode}); stdout {out!r}; "
                    f"stderr:\n{self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C in the README; the server must stop cleanly."""
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.block.where}: `{' '.join(self.argv)}` did not stop within "
                        f"{STOP_TIMEOUT_S:.0f} s of SIGTERM; stderr:\n{self._log_tail()}")
        assert code == 0, (f"{self.block.where}: `{' '.join(self.argv)}` exited {code} after SIGTERM; "
                           f"stderr:\n{self._log_tail()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # a `cluster up` launcher's nodes get SIGTERM from the kernel (PDEATHSIG)
            self.process.wait()


def run_block(block: Block, bootstrap: str | None, env: dict[str, str], cwd: Path) -> str:
    """Run one shell or Python block against the running server; its stdout."""
    text = block.text
    if README_BOOTSTRAP.search(text):
        assert bootstrap is not None, f"{block.where}: talks to localhost:9092 before any server block started one"
        text = README_BOOTSTRAP.sub(bootstrap, text)
    if block.language == "python":
        argv = [sys.executable, "-c", text]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.where}: did not finish within {SNIPPET_TIMEOUT_S:.0f} s; "
                    f"stdout {exc.stdout!r}; stderr {exc.stderr!r}")
    assert done.returncode == 0, (f"{block.where}: exit {done.returncode}\n--- block\n{text}--- stdout\n"
                                  f"{done.stdout}--- stderr\n{done.stderr}")
    return done.stdout


@pytest.mark.slow
def test_every_readme_command_works_as_written(blocks: list[Block], user_env: dict[str, str],
                                               tmp_path: Path) -> None:
    runnable = [b for b in blocks if b.language in RUN_LANGUAGES and b.not_run is None]
    assert any(server_overrides(b) == SERVER_COMMANDS[("raftka", "dev")] for b in runnable), \
        "the README's five-minute start must run `raftka dev`"
    assert any(b.language == "python" for b in runnable), "the README must show a Python client"
    workdir = tmp_path / "user"
    workdir.mkdir()
    server: Server | None = None
    python_outputs = []
    try:
        for index, block in enumerate(runnable):
            extra = server_overrides(block)
            if extra is not None:
                if server is not None:
                    server.stop()
                    server = None
                server = Server(block, extra, tmp_path / f"server-{index}", user_env, workdir)
                continue
            out = run_block(block, server.bootstrap if server else None, user_env, workdir)
            if block.language == "python":
                python_outputs.append((block, out))
        if server is not None:
            server.stop()
            server = None
    finally:
        if server is not None:
            server.kill()
    # The five-minute start's snippet produces "hello 0".."hello 9" and prints what its
    # consumer received: every record, once.
    block, out = python_outputs[0]
    lines = out.strip().splitlines()
    assert lines, f"{block.where}: printed nothing"
    assert ast.literal_eval(lines[-1]) == sorted(f"hello {i}" for i in range(10)), \
        f"{block.where}: the consumer did not get the ten records produced; it printed {out!r}"


def test_blocks_left_out_are_few_and_say_why(blocks: list[Block]) -> None:
    shell_or_python = [b for b in blocks if b.language in RUN_LANGUAGES]
    left_out = [b for b in shell_or_python if b.not_run is not None]
    assert len(left_out) <= MAX_NOT_RUN, [b.where for b in left_out]
    assert len(shell_or_python) - len(left_out) >= 4, "most of the README's commands should run"
    for block in blocks:
        assert block.language, f"{block.where}: give the block a language (sh, python, properties, console, ...)"


def test_the_sample_properties_files_are_accepted(blocks: list[Block], user_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    """What the README's multi-host steps do first: `raftka storage format` with each file
    (log.dirs moved under the test's temp dir) accepts its keys."""
    samples = [b for b in blocks if b.language == "properties"]
    assert samples, "the README's multi-host deployment shows its properties files"
    cluster_id = subprocess.run(["raftka", "storage", "random-uuid"], env=user_env, capture_output=True,
                                text=True, check=True).stdout.strip()
    for index, block in enumerate(samples):
        assert re.search(r"^log\.dirs=", block.text, re.MULTILINE), f"{block.where}: no log.dirs"
        config = tmp_path / f"sample-{index}.properties"
        config.write_text(re.sub(r"^log\.dirs=.*$", f"log.dirs={tmp_path / f'dir-{index}'}", block.text,
                                 flags=re.MULTILINE))
        done = subprocess.run(["raftka", "storage", "format", "--config", str(config), "--cluster-id", cluster_id],
                              env=user_env, capture_output=True, text=True)
        assert done.returncode == 0, f"{block.where}: {done.stderr}"
        assert (tmp_path / f"dir-{index}" / "meta.properties").exists()


def test_links_in_the_readme_and_docs_lead_somewhere() -> None:
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: link to {target} leads nowhere"


def test_the_documentation_tells_no_development_history() -> None:
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for lineno, line in enumerate(page.read_text().splitlines(), 1):
            assert not HISTORY.search(line), f"{page.relative_to(REPO)}:{lineno}: {line.strip()}"
