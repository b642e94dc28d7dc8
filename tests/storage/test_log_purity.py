"""The log engine's cores read no clock and open no socket (STYLE.md §1)."""

import ast
import pathlib

import pytest

STORAGE = pathlib.Path(__file__).resolve().parents[2] / "storage"
CORES = ["index", "epoch_cache", "segment", "recovery", "log", "log_append", "log_ops", "checkpoint", "config"]
FORBIDDEN = {"time", "socket", "trio", "random", "datetime"}


@pytest.mark.parametrize("module", CORES)
def test_core_imports_no_clock_socket_or_randomness(module):
    tree = ast.parse((STORAGE / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"storage/{module}.py imports {imported & FORBIDDEN}"
    # File access goes through storage.fs: no built-in open() in the cores.
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls
