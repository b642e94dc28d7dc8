"""The layout's rules, checked on the source with `ast`.

Two kinds of rule, each in one table:

- **Layers.** The top-level packages stand in a fixed order, from the shared
  floor to the command line. A module may import its own package and the
  ones below it, never one above: `quorum` cannot reach the launcher,
  `storage` cannot reach the broker, nothing reaches `raftka` (the command line).
- **Pure cores.** The modules that decide (the Raft core, the controller,
  the metadata image, partition and group state, the storage cores) do no
  I/O, read no clock and draw no unseeded random numbers, so that the seeded
  simulations replay exactly. Each rule names its modules by path and what
  they may not import or call.

A module that breaks a rule fails here with the file, the line and the rule.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Low to high. A module in one of these packages imports only from its own
#: package and those before it.
LAYERS = ["common", "storage", "quorum", "broker", "cluster", "mirror", "bench", "chaos", "raftka"]

#: What every pure core is denied: the event loop, sockets, files and
#: processes, the clock.
IO_AND_CLOCK = frozenset({
    "trio", "anyio", "asyncio", "socket", "select", "selectors", "threading", "subprocess",
    "multiprocessing", "shutil", "tempfile", "time", "secrets",
})
#: Built-ins a decision must not call.
IO_CALLS = frozenset({"open", "print", "input", "exec", "eval", "__import__"})


@dataclasses.dataclass(frozen=True)
class PureRule:
    """Modules matching `globs` import none of `forbidden` (a name and its
    submodules), call none of `forbidden_calls`, and use `random` only as
    the type of an injected, seeded `random.Random`."""

    name: str
    globs: tuple[str, ...]
    forbidden: frozenset[str] = IO_AND_CLOCK
    forbidden_calls: frozenset[str] = IO_CALLS
    #: `from datetime import <these>` is allowed (durations cannot read the clock).
    datetime_names: frozenset[str] = frozenset({"timedelta"})


PURE_RULES = [
    PureRule("the Raft core", ("quorum/raft/*.py",),
             forbidden=IO_AND_CLOCK | {"os", "pathlib", "uuid", "quorum.node", "quorum.process"}),
    PureRule("the metadata image and records", ("quorum/metadata/*.py",),
             forbidden=IO_AND_CLOCK | {"os", "quorum.node", "quorum.process"}),
    PureRule("the controller's decisions", ("quorum/controller/*.py",),
             forbidden=IO_AND_CLOCK | {"os", "quorum.node", "quorum.process"}),
    PureRule("the ZooKeeper-mode decisions", tuple(f"quorum/zookeeper/{m}.py" for m in (
        "znodes", "messages", "context", "batch", "decisions", "broker_metadata")),
             forbidden=IO_AND_CLOCK | {"os", "kazoo"}),
    PureRule("the migration's copy and dual write", tuple(f"quorum/migration/{m}.py" for m in (
        "copy", "dual_write", "znode", "meta_properties")),
             forbidden=IO_AND_CLOCK | {"os", "kazoo", "quorum.node", "quorum.migration.driver",
                                       "quorum.migration.zk_io"}),
    PureRule("the broker's pure state", ("broker/core/*.py", "broker/core/replication/*.py"),
             forbidden=IO_AND_CLOCK | {"os", "pathlib", "storage", "broker.api", "broker.shell"},
             forbidden_calls=IO_CALLS | {"uuid1", "uuid4", "getnode"}),
    # KIP-848 records and requests name topics by id: `uuid.UUID` values
    # are fine, drawing new ones (uuid1/uuid4) is not.
    PureRule("the group coordinator", ("broker/core/group/*.py",),
             forbidden=IO_AND_CLOCK | {"os", "pathlib", "logging", "io", "sys", "storage",
                                       "broker.api", "broker.shell"},
             forbidden_calls=IO_CALLS | {"uuid1", "uuid4", "getnode"}),
    PureRule("the transaction coordinator", ("broker/core/txn/*.py",),
             forbidden=IO_AND_CLOCK | {"os", "pathlib", "uuid", "logging", "io", "sys", "random", "storage",
                                       "broker.api", "broker.shell"}),
    PureRule("the mirror's decisions", tuple(f"mirror/{m}.py" for m in ("policy", "offsets", "config")),
             forbidden=IO_AND_CLOCK | {"os", "pathlib", "confluent_kafka", "mirror.worker", "mirror.status"}),
    PureRule("the storage cores", tuple(f"storage/{m}.py" for m in (
        "index", "epoch_cache", "segment", "recovery", "log", "log_append", "log_ops", "log_checkpoints", "checkpoint",
        "config",
        "batch", "batch_records", "batch_filter", "producer_state", "offset_map", "compression", "txn_index")),
             forbidden=IO_AND_CLOCK | {"datetime", "random"}),
]


def _sources(pattern: str) -> list[Path]:
    found = sorted(p for p in ROOT.glob(pattern) if p.is_file())
    assert found, f"the rule's pattern {pattern} matches no file: the layout moved, update the table"
    return found


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            out.append((node.lineno, module, [a.name for a in node.names]))
    return out


def _matches(module: str, names: frozenset[str] | set[str]) -> str | None:
    for name in names:
        if module == name or module.startswith(name + "."):
            return name
    return None


def layer_violations(path: str, source: str) -> list[str]:
    """Imports of `source` (the file at `path`, relative to the root) that
    reach a package above its own."""
    package = path.split("/")[0]
    if package not in LAYERS:
        return []
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    found = []
    for line, module, _ in _imports(ast.parse(source)):
        top = module.split(".")[0]
        if module.startswith("."):
            found.append(f"{path}:{line}: relative import {module} (name the package)")
        elif top in LAYERS and top not in allowed:
            found.append(f"{path}:{line}: {package} imports {module}, a layer above it")
    return found


def pure_violations(source: str, rule: PureRule, path: str = "<snippet>") -> list[str]:
    tree = ast.parse(source)
    found = []
    random_aliases = set()
    for line, module, names in _imports(tree):
        hit = _matches(module, rule.forbidden)
        if hit:
            found.append(f"{path}:{line}: imports {module} ({rule.name} may not use {hit})")
        if module == "datetime" and names and set(names) - rule.datetime_names:
            found.append(f"{path}:{line}: from datetime import {names} (only durations: a core reads no clock)")
        if module == "random":
            if names and set(names) != {"Random"}:
                found.append(f"{path}:{line}: from random import {names} (inject a seeded random.Random)")
            if not names:
                random_aliases.add("random")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            random_aliases |= {a.asname for a in node.names if a.name == "random" and a.asname}
    datetime_aliases = {a.asname or "datetime" for node in ast.walk(tree) if isinstance(node, ast.Import)
                        for a in node.names if a.name == "datetime"}
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            # A bare name is the built-in (`open(...)`); an attribute call is
            # checked only for the module-level draws (`uuid.uuid4()`), since
            # `self._fs.open(...)` goes through the injected, simulated disk.
            if isinstance(node.func, ast.Name):
                name = node.func.id
            else:
                name = getattr(node.func, "attr", None)
                name = name if name in rule.forbidden_calls - IO_CALLS else None
            if name in rule.forbidden_calls:
                found.append(f"{path}:{node.lineno}: calls {name}() ({rule.name} does no I/O)")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in datetime_aliases and node.attr not in rule.datetime_names):
            found.append(f"{path}:{node.lineno}: uses datetime.{node.attr} (only durations: a core reads no clock)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in random_aliases:
            if node.attr != "Random" or id(node) in calls:
                found.append(f"{path}:{node.lineno}: uses random.{node.attr} (inject a seeded random.Random)")
        elif isinstance(node, ast.Name) and node.id == "Random" and id(node) in calls:
            found.append(f"{path}:{node.lineno}: constructs its own Random (inject a seeded one)")
    return found


def _project_sources() -> list[Path]:
    return [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))]


def test_no_package_imports_one_above_it() -> None:
    found = []
    for path in _project_sources():
        rel = path.relative_to(ROOT).as_posix()
        found += layer_violations(rel, path.read_text())
    assert found == []


@pytest.mark.parametrize("rule", PURE_RULES, ids=lambda r: r.name)
def test_pure_cores_do_no_io_and_read_no_clock(rule: PureRule) -> None:
    found = []
    for pattern in rule.globs:
        for path in _sources(pattern):
            found += pure_violations(path.read_text(), rule, path.relative_to(ROOT).as_posix())
    assert found == []


#: A package that may use fewer layers than those below it: the mirror is a
#: Kafka client of two clusters, so it stands on `common` alone.
NARROWER = {"mirror": {"common", "mirror"}}


def test_narrower_packages_reach_only_their_own_floors() -> None:
    found = []
    for package, allowed in NARROWER.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, module, _ in _imports(ast.parse(path.read_text())):
                top = module.split(".")[0]
                if top in LAYERS and top not in allowed:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {package} imports {module}")
    assert found == []


def test_every_top_level_package_is_in_a_layer() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(LAYERS), "a new top-level package needs its place in LAYERS"


# The checkers themselves: each of these must be caught, or the tests above prove nothing.

STRICT = PURE_RULES[0]


@pytest.mark.parametrize("snippet", [
    "import time\n",
    "import trio\n",
    "from socket import socket\n",
    "import os.path\n",
    "import datetime\nnow = datetime.datetime.now()\n",
    "from datetime import datetime\n",
    "import uuid\nx = uuid.uuid4()\n",
    "import random\nx = random.random()\n",
    "import random\nrng = random.Random(4)\n",
    "from random import Random\nrng = Random()\n",
    "from random import choice\n",
    "import random as r\nx = r.choice([1])\n",
    "f = open('quorum-state')\n",
    "from quorum.node.driver import RaftNode\n",
])
def test_the_purity_checker_catches_impure_code(snippet: str) -> None:
    assert pure_violations(snippet, STRICT)


def test_the_purity_checker_allows_the_injected_random_type_and_durations() -> None:
    assert pure_violations("import random\nfrom datetime import timedelta\n"
                           "def f(rng: random.Random) -> int:\n    return rng.getrandbits(8)\n", STRICT) == []


@pytest.mark.parametrize(("path", "snippet"), [
    ("common/config.py", "from storage.log import Log\n"),
    ("storage/log.py", "from quorum.metadata import MetadataImage\n"),
    ("quorum/process.py", "from cluster.launcher import LocalCluster\n"),
    ("quorum/node/driver.py", "import raftka.cli\n"),
    ("broker/shell/process.py", "from bench.runner import run\n"),
    ("bench/runner.py", "from raftka.cli import build_parser\n"),
    ("broker/api/fetch.py", "from . import codec\n"),
])
def test_the_layer_checker_catches_an_import_from_above(path: str, snippet: str) -> None:
    assert layer_violations(path, snippet)


def test_the_layer_checker_allows_imports_from_below() -> None:
    assert layer_violations("broker/shell/process.py",
                            "from common.wire import serve\nfrom quorum.node.driver import RaftNode\n"
                            "from storage.log import Log\nimport trio\n") == []
