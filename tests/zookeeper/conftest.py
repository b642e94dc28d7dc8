"""A real ZooKeeper for the ZooKeeper-mode tests.

One standalone server (Debian's zookeeper 3.8) for the whole session, with
tickTime=500 so sessions can be as short as 1 s. Each test gets its own
chroot (`zk_hosts`), so tests never see each other's znodes.
"""

import itertools
import tempfile

import pytest
from kazoo.client import KazooClient

from quorum.zookeeper.ensemble import ZooKeeperEnsemble, zookeeper_missing_reason

TICK_TIME_MS = 500
_chroots = itertools.count()


@pytest.fixture(scope="session")
def zk_ensemble():
    reason = zookeeper_missing_reason()
    if reason is not None:
        pytest.skip(f"ZooKeeper tests need a local ZooKeeper: {reason}")
    with tempfile.TemporaryDirectory(prefix="raftka-zk-") as d:
        with ZooKeeperEnsemble(d, 1, tick_time_ms=TICK_TIME_MS, force_sync=False) as ensemble:
            yield ensemble


@pytest.fixture
def zk_hosts(zk_ensemble, request):
    """A connect string rooted at a fresh chroot."""
    chroot = f"/t{next(_chroots)}"
    admin = KazooClient(zk_ensemble.connect_string)
    admin.start(10)
    admin.ensure_path(chroot)
    admin.stop()
    admin.close()
    return zk_ensemble.connect_string + chroot
