"""The group coordinator is pure: no clock, sockets, files, threads or
logging, and no randomness but the `random.Random` its caller injects (the
member ids). Checked on the source, so a stray `import time` fails here
before it can make a rebalance depend on the wall clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GROUP_DIR = Path(__file__).resolve().parents[2] / "broker" / "group"
FORBIDDEN_MODULES = {"trio", "anyio", "asyncio", "socket", "select", "selectors", "time", "os", "threading",
                     "subprocess", "multiprocessing", "pathlib", "shutil", "tempfile", "uuid", "secrets",
                     "logging", "io", "sys"}
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}
SOURCES = sorted(GROUP_DIR.glob("*.py"))


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    random_aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN_MODULES or top == "datetime":
                    found.append(f"line {node.lineno}: import {alias.name}")
                if top == "random":
                    random_aliases.add(alias.asname or "random")
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if top in FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            # Durations only: a timedelta cannot read the clock.
            if top == "datetime" and any(a.name != "timedelta" for a in node.names):
                found.append(f"line {node.lineno}: from datetime import {[a.name for a in node.names]}")
            if top == "random" and any(a.name != "Random" for a in node.names):
                found.append(f"line {node.lineno}: from random import {[a.name for a in node.names]}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            found.append(f"line {node.lineno}: call to {node.func.id}()")
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in random_aliases:
            if node.attr != "Random" or id(node) in calls:
                found.append(f"line {node.lineno}: uses random.{node.attr} (inject a seeded random.Random instead)")
        elif isinstance(node, ast.Name) and node.id == "Random" and id(node) in calls:
            found.append(f"line {node.lineno}: constructs its own Random")
    return found


def test_the_group_package_has_modules_to_check() -> None:
    assert {p.name for p in SOURCES} >= {"shard.py", "join.py", "rebalance.py", "offsets.py", "records.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_group_module_does_no_io_and_reads_no_clock(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize("snippet", [
    "import time\n",
    "from datetime import datetime\n",
    "import datetime\n",
    "import uuid\n",
    "import logging\n",
    "import random\nx = random.random()\n",
    "import random\nrng = random.Random(4)\n",
    "from random import Random\nrng = Random()\n",
    "from random import choice\n",
    "f = open('offsets')\n",
])
def test_the_checker_catches_impure_code(snippet: str) -> None:
    assert violations(snippet)


def test_the_checker_allows_the_injected_random_type_and_durations() -> None:
    assert violations("import random\nfrom datetime import timedelta\n"
                      "def f(rng: random.Random) -> int:\n    return rng.getrandbits(8)\n") == []
