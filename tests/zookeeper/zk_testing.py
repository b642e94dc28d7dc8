"""Helpers for tests against a real ZooKeeper (fixtures are in conftest.py)."""

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio
from kazoo.client import KazooClient

from quorum.metadata.records import Endpoint
from quorum.zookeeper.broker_metadata import ZkMetadataCache
from quorum.zookeeper.broker_side import ZkBrokerRegistration, ensure_cluster_paths
from quorum.zookeeper.channel import LocalBrokerSender
from quorum.zookeeper.controller import ZkController
from quorum.zookeeper.decisions import ZkControllerConfig
from quorum.zookeeper.znodes import BrokerInfo


async def connect(hosts: str, session_timeout_s: float = 2.0) -> KazooClient:
    zk = KazooClient(hosts, timeout=session_timeout_s)
    await trio.to_thread.run_sync(zk.start, 10)
    return zk


async def close(zk: KazooClient) -> None:
    await trio.to_thread.run_sync(zk.stop)
    await trio.to_thread.run_sync(zk.close)


async def eventually(predicate, timeout_s: float = 10.0, what: str = "condition") -> float:
    """Wait until `predicate()` holds; return how long it took."""
    start = trio.current_time()
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.02)
        return trio.current_time() - start
    raise AssertionError(f"{what} did not hold within {timeout_s}s")


# --- in-process ZooKeeper-mode brokers ----------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def broker_info(broker_id: int) -> BrokerInfo:
    return BrokerInfo(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", 19000 + broker_id, 0),))


@dataclass
class TestBroker:
    """A broker's ZooKeeper-mode metadata path: session, registration, controller, metadata cache."""

    broker_id: int
    zk: KazooClient
    cache: ZkMetadataCache
    registration: ZkBrokerRegistration
    controller: ZkController
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


async def start_broker(nursery: trio.Nursery, hosts: str, broker_id: int, caches: dict[int, ZkMetadataCache],
                       session_timeout_s: float = 2.0, unclean: bool = False, info: BrokerInfo | None = None,
                       sender=None) -> TestBroker:
    """Register `broker_id` and start its controller; its requests reach every cache in `caches`
    (or go to `sender`)."""
    zk = await connect(hosts, session_timeout_s)
    await trio.to_thread.run_sync(ensure_cluster_paths, zk)
    cache = caches[broker_id] = ZkMetadataCache(broker_id)

    def on_epoch(epoch: int) -> None:
        cache.broker_epoch = epoch

    registration = ZkBrokerRegistration(zk, info or broker_info(broker_id), on_epoch)
    await trio.to_thread.run_sync(registration.start)
    controller = ZkController(zk, ZkControllerConfig(broker_id, unclean_leader_election_enable=unclean),
                              sender or LocalBrokerSender(caches))
    broker = TestBroker(broker_id, zk, cache, registration, controller)

    async def run_controller(task_status=trio.TASK_STATUS_IGNORED):
        with broker.scope:
            await controller.run(task_status=task_status)

    await nursery.start(run_controller)
    return broker


async def kill_session(broker: TestBroker) -> None:
    """The broker's process ends cleanly: its session closes and its ephemeral znodes go at once."""
    broker.scope.cancel()
    await close(broker.zk)


def active(brokers) -> list:
    return [b for b in brokers if b.controller.active]


def spawn_registered_broker(hosts: str, broker_id: int, session_timeout_s: float = 2.0) -> subprocess.Popen:
    """A separate process holding broker `broker_id`'s registration, to be SIGKILLed (a real crash)."""
    code = (
        "import sys, time\n"
        "from kazoo.client import KazooClient\n"
        "from quorum.zookeeper.broker_side import register_broker\n"
        "from quorum.metadata.records import Endpoint\n"
        "from quorum.zookeeper.znodes import BrokerInfo\n"
        f"zk = KazooClient({hosts!r}, timeout={session_timeout_s})\n"
        "zk.start(10)\n"
        f"register_broker(zk, BrokerInfo({broker_id}, (Endpoint('PLAINTEXT', '127.0.0.1', {19000 + broker_id}, 0),)))\n"
        "print('registered', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "registered"
    return process


async def expire_session(hosts: str, zk: KazooClient) -> None:
    """Expire `zk`'s session from outside (as ZooKeeper does to a broker cut off for too long):
    a second client attaches to the same session and closes it."""
    session_id, password = zk.client_id
    twin = KazooClient(hosts, client_id=(session_id, password))
    await trio.to_thread.run_sync(twin.start, 10)
    await close(twin)
