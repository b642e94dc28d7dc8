"""A real ZooKeeper for the migration tests (one standalone server per session,
tickTime=500 so sessions can be short); each test gets its own chroot."""

import itertools
import tempfile

import pytest
from kazoo.client import KazooClient

from quorum.zookeeper.ensemble import ZooKeeperEnsemble, zookeeper_missing_reason

_chroots = itertools.count()


@pytest.fixture(scope="session")
def migration_zk():
    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"migration tests need a local ZooKeeper: {reason}")
    with tempfile.TemporaryDirectory(prefix="raftka-migration-zk-") as d:
        with ZooKeeperEnsemble(d, 1, tick_time_ms=500, force_sync=False) as ensemble:
            yield ensemble


@pytest.fixture
def zk_connect(migration_zk):
    """A connect string rooted at a fresh chroot."""
    chroot = f"/m{next(_chroots)}"
    admin = KazooClient(migration_zk.connect_string)
    admin.start(10)
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    return migration_zk.connect_string + chroot


@pytest.fixture
def zk(zk_connect):
    """A blocking kazoo client on the test's chroot."""
    client = KazooClient(zk_connect, timeout=2.0)
    client.start(10)
    yield client
    client.stop()
    client.close()
