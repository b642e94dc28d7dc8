"""`storage.Log` keeps its state to itself: no module but `storage/log.py`
reads or writes a Log's underscore fields or calls its underscore methods
(the append, roll, truncate and retention paths are the Log's own
methods; the helpers in `storage.log_append` and `storage.log_ops` take
plain values)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOG = ROOT / "storage" / "log.py"


def _log_private_names() -> set[str]:
    tree = ast.parse(LOG.read_text())
    log_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Log")
    names = {n.name for n in log_class.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_")}
    for node in ast.walk(log_class):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_only_the_log_module_touches_a_logs_private_fields():
    private = _log_private_names()
    assert {"_segments", "_log_end_offset", "_append_checked"} <= private
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == LOG or any(part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    assert not found, "a Log's private fields used outside storage/log.py:\n" + "\n".join(found)
