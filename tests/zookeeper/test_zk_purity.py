"""The ZooKeeper-mode cores are pure: no ZooKeeper client, no I/O, no clock, no unseeded randomness."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["znodes.py", "messages.py", "context.py", "batch.py", "decisions.py", "broker_metadata.py"]
FORBIDDEN = {"trio", "socket", "time", "os", "asyncio", "threading", "subprocess", "selectors", "kazoo"}
UNSEEDED = {"random", "randint", "choice", "shuffle", "sample", "getrandbits", "uniform", "uuid4", "uuid1"}


@pytest.mark.parametrize("name", PURE)
def test_module_is_a_pure_core(name):
    path = ROOT / "quorum" / "zookeeper" / name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            names = set()
        assert not names & FORBIDDEN, f"{name} imports {names & FORBIDDEN}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("random", "uuid"):
                assert node.func.attr not in UNSEEDED, f"{name} calls {owner.id}.{node.func.attr}"
