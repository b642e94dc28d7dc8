"""The migration's pure cores: no I/O, no clock; meta.properties from ZooKeeper mode to KRaft mode."""

import ast
from pathlib import Path

import pytest

from quorum.migration.meta_properties import render, to_kraft
from quorum.migration.znode import MigrationZnode, decode_migration, encode_migration
from quorum.zookeeper.errors import MalformedZNodeError
from common.config import read_properties

ROOT = Path(__file__).resolve().parents[2]
PURE = ["copy.py", "dual_write.py", "znode.py", "meta_properties.py"]
FORBIDDEN = {"trio", "socket", "time", "os", "asyncio", "threading", "subprocess", "kazoo", "random"}


@pytest.mark.parametrize("name", PURE)
def test_module_is_a_pure_core(name):
    tree = ast.parse((ROOT / "quorum" / "migration" / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        assert not names & FORBIDDEN, f"{name} imports {names & FORBIDDEN}"


def test_zookeeper_meta_properties_become_kraft_ones_for_the_same_broker(tmp_path):
    v0 = {"version": "0", "broker.id": "4", "cluster.id": "abc"}
    v1 = to_kraft(v0, "abc", 4)
    assert v1 == {"version": "1", "cluster.id": "abc", "node.id": "4"}
    path = tmp_path / "meta.properties"
    path.write_text(render(v1))
    assert read_properties(path) == v1
    assert to_kraft(v1, "abc", 4) == v1, "idempotent: a second run changes nothing"
    assert to_kraft({"version": "0", "broker.id": "4"}, "abc", 4)["cluster.id"] == "abc"
    with pytest.raises(ValueError, match="broker 4"):
        to_kraft(v0, "abc", 5)
    with pytest.raises(ValueError, match="cluster abc"):
        to_kraft(v0, "other", 4)


def test_migration_znode_round_trips_and_refuses_garbage():
    m = MigrationZnode(kraft_metadata_offset=120, kraft_metadata_epoch=3, kraft_controller_id=1,
                       kraft_controller_epoch=3)
    assert decode_migration(encode_migration(m)) == m
    with pytest.raises(MalformedZNodeError):
        decode_migration(b'{"version":0}')
