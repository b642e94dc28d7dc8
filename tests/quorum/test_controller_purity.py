"""The metadata and controller packages are pure cores: no I/O, no clock, no unseeded randomness."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "quorum" / "metadata").glob("*.py")) + sorted((ROOT / "quorum" / "controller").glob("*.py"))
FORBIDDEN = {"trio", "socket", "time", "os", "asyncio", "threading", "subprocess", "selectors"}
UNSEEDED = {"random", "randint", "choice", "shuffle", "sample", "getrandbits", "uniform", "uuid4", "uuid1"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_module_is_a_pure_core(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            names = set()
        assert not names & FORBIDDEN, f"{path.name} imports {names & FORBIDDEN}"
        # Randomness only through an injected random.Random instance.
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("random", "uuid"):
                assert node.func.attr not in UNSEEDED, f"{path.name} calls {owner.id}.{node.func.attr}"
