"""The migration's pure cores (their purity is checked in tests/test_layering.py): meta.properties from ZooKeeper mode to KRaft mode, the /migration znode."""

import pytest

from quorum.migration.meta_properties import render, to_kraft
from quorum.migration.znode import MigrationZnode, decode_migration, encode_migration
from quorum.zookeeper.errors import MalformedZNodeError
from common.config import read_properties


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
