"""Exactly once, a transactional call that never returns (librdkafka 2.16's
send_offsets_to_transaction after the target's group coordinator went
away) makes the flow replace its producer; the stuck one keeps its
librdkafka threads until its call returns. A long run must not pile them
up: at most one is left behind, a second stuck call waits for it, and a
left-behind producer is closed (its threads gone) once its call returns.

The stuck call is a Python call blocked on an event (librdkafka cannot be
made to hang on demand); the producers are real librdkafka ones.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from mirror import config, eos
from mirror.worker import Flow
from mirror_testing import wait_until


def _os_threads() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


def test_at_most_one_stuck_producer_is_left_behind_and_it_is_closed(monkeypatch) -> None:
    monkeypatch.setattr(eos, "TXN_TIMEOUT_S", 0.2)
    monkeypatch.setattr(eos, "TXN_GRACE_S", 0.1)
    monkeypatch.setattr(eos, "STUCK_REPORT_S", 0.2)
    said: list[str] = []
    # Nothing listens on these ports: the producers are created (with their
    # threads) but never reach a cluster, which a stuck call needs no more than.
    flow_cfg = config.simple("127.0.0.1:9", "127.0.0.1:9", "t", **{"exactly.once.support": "enabled"})[0]
    flow = Flow(flow_cfg, threading.Event(), said.append, "m")
    flow._producer_config = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "stuck-test",
                             "enable.idempotence": True, "logger": eos._quiet("stuck-test")}
    flow._init_transactions = lambda: None  # no target: the new producer's fencing is what a cluster would do
    before = _os_threads()
    flow.producer = flow._client(eos.Producer, "producer", True, flow._producer_config)
    first = flow.producer
    releases = [threading.Event(), threading.Event()]

    assert not flow._txn_call("commit the transaction", releases[0].wait)
    assert flow.producer is not first
    assert (flow.stats.producer_replacements, flow.stats.abandoned_producers) == (1, 1)
    assert any("transactional producer replaced (1 so far)" in line for line in said), said

    # A second stuck call while the first producer is still left behind: no second replacement.
    second_call = threading.Thread(target=flow._txn_call, args=("commit the transaction", releases[1].wait))
    second_call.start()
    time.sleep(1.0)
    assert second_call.is_alive()
    assert (flow.stats.producer_replacements, flow.stats.abandoned_producers) == (1, 1)
    assert any("no second one is left behind" in line for line in said), said

    # The first call returns: its producer is closed, and only then is the second one replaced.
    releases[0].set()
    second_call.join(10)
    assert not second_call.is_alive()
    assert (flow.stats.producer_replacements, flow.stats.abandoned_producers) == (2, 1)
    releases[1].set()
    wait_until(lambda: (flow._reap_abandoned(), flow.stats.abandoned_producers == 0)[1], 10,
               "the second stuck producer closed")
    assert any("left behind" in line and "is closed" in line for line in said), said
    # Two replaced producers closed, one live: their librdkafka threads are gone.
    flow.producer.close()
    wait_until(lambda: _os_threads() <= before, 10, f"threads back to {before}: {_os_threads()}")
