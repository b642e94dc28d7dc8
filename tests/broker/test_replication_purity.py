"""The replication core is pure: it imports only what cannot do I/O, read a
clock or draw random numbers. Checked on the source with `ast` against an
allow-list, so a new import has to be a deliberate decision here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE_DIR = Path(__file__).resolve().parents[2] / "broker" / "replication"
SOURCES = sorted(CORE_DIR.glob("*.py"))

ALLOWED_MODULES = {
    "__future__", "dataclasses", "enum", "typing", "collections", "collections.abc", "bisect", "itertools",
    "functools", "math", "uuid",
    "kio",  # Kafka protocol entities and error codes: plain data
    "quorum.metadata",  # the immutable metadata image and records
    "raftka.frozen",  # building immutable messages faster: no I/O, clock or randomness
    "broker.replication",
}
#: Calls that would make a decision depend on the outside world.
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__", "uuid1", "uuid4", "getnode"}


def _allowed(module: str) -> bool:
    return any(module == allowed or module.startswith(allowed + ".") for allowed in ALLOWED_MODULES)


def violations(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if not _allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level or not _allowed(node.module or ""):
                found.append(f"line {node.lineno}: from {'.' * node.level}{node.module} import ...")
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in FORBIDDEN_CALLS:
                found.append(f"line {node.lineno}: call to {name}()")
    return found


def test_the_core_has_its_modules() -> None:
    assert {p.name for p in SOURCES} >= {"leader.py", "fetcher.py", "partition.py", "isr.py", "divergence.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_replication_module_does_no_io_and_reads_no_clock(path: Path) -> None:
    assert violations(path.read_text()) == []


@pytest.mark.parametrize("snippet", [
    "import time\n",
    "import trio\n",
    "from os import path\n",
    "import random\n",
    "from storage.log import Log\n",
    "from broker.replica_manager import HostedPartition\n",
    "from . import leader\n",
    "import uuid\nx = uuid.uuid4()\n",
    "f = open('replication-offset-checkpoint')\n",
])
def test_the_checker_catches_impure_code(snippet: str) -> None:
    assert violations(snippet)
