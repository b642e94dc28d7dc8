"""The Raft core is pure: no clock, no sockets, no files, no threads, and no
randomness except the `random.Random` its caller injects. Checked on the
source itself, so a stray `import time` fails here before it can make the
simulation non-deterministic."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RAFT_DIR = Path(__file__).resolve().parents[2] / "quorum" / "raft"
FORBIDDEN_MODULES = {"trio", "anyio", "asyncio", "socket", "select", "selectors", "time", "os", "threading",
                     "subprocess", "multiprocessing", "datetime", "pathlib", "shutil", "tempfile", "uuid",
                     "secrets"}
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}
SOURCES = sorted(RAFT_DIR.glob("*.py"))


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    random_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN_MODULES:
                    found.append(f"line {node.lineno}: import {alias.name}")
                if top == "random":
                    random_aliases.add(alias.asname or "random")
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if top in FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            if top == "random" and any(a.name != "Random" for a in node.names):
                found.append(f"line {node.lineno}: from random import {[a.name for a in node.names]}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            found.append(f"line {node.lineno}: call to {node.func.id}()")
    # `random` may only name the injected generator's type: random.Random, never called.
    calls_of_random = {
        id(n.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id in random_aliases
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in random_aliases:
            if node.attr != "Random" or id(node) in calls_of_random:
                found.append(f"line {node.lineno}: uses random.{node.attr} (inject a seeded random.Random instead)")
        elif isinstance(node, ast.Name) and node.id == "Random" and isinstance(node.ctx, ast.Load):
            parent_calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.func is node]
            if parent_calls:
                found.append(f"line {node.lineno}: constructs its own Random")
    return found


def test_the_raft_package_has_modules_to_check() -> None:
    assert {p.name for p in SOURCES} >= {"core.py", "leader.py", "follower.py", "candidate.py", "messages.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_raft_module_does_no_io_and_reads_no_clock(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\n",
        "import os.path\n",
        "from trio import sleep\n",
        "import random\nx = random.random()\n",
        "import random\nrng = random.Random(4)\n",
        "from random import choice\n",
        "f = open('quorum-state')\n",
    ],
)
def test_the_checker_catches_impure_code(snippet: str) -> None:
    assert violations(snippet)


def test_the_checker_allows_the_injected_random_type() -> None:
    assert violations("import random\ndef f(rng: random.Random) -> int:\n    return rng.randrange(3)\n") == []
