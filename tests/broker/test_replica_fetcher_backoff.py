"""A follower's fetcher and a leader it cannot reach (`broker.shell.replica_fetcher`).

A failed connection to the leader is tried again after
`replica.fetch.backoff.ms`. Partitions leaving that leader (a fence moves a
dead broker's partitions off it a metadata batch at a time) are no reason
to try sooner: each batch made the fetcher reconnect at once, while its
log said "retrying in 1000 ms". A partition added to it is (Kafka's
fetcher thread is woken from its back-off by added partitions only).
"""

from __future__ import annotations

import logging
import time

import trio

from broker.core.replication import ReplicationConfig
from broker.core.replication.partition import Role
from broker_testing import start_broker
from quorum.metadata.records import PartitionChangeRecord

BACKOFF_MS = 1000
PARTITIONS = 6
#: Port 1: nothing listens there, so every connection is refused at once.
DEAD_PORT = 1


async def test_partitions_leaving_an_unreachable_leader_do_not_cut_the_fetchers_back_off(tmp_path, nursery, caplog):
    caplog.set_level(logging.INFO, logger="broker.replica_fetcher")
    running = await start_broker(nursery, tmp_path, replication=ReplicationConfig(replica_fetch_backoff_ms=BACKOFF_MS))
    controller = running.controller
    await controller.register_broker(2, "127.0.0.1", DEAD_PORT)
    await running.create_topic("t", assignments=[(2, 1)] * PARTITIONS)
    topic_id = controller.image.topic("t").topic_id

    def attempts() -> list[float]:
        return [r.created for r in caplog.records
                if r.getMessage().startswith("fetcher from broker 2: cannot connect")]

    async def next_attempt(after: int) -> float:
        with trio.fail_after(10):
            while len(found := attempts()) <= after:
                await trio.sleep(0.005)
        return found[after]

    await next_attempt(0)
    # All but the last partition leave broker 2, one metadata update every 150 ms.
    for p in range(PARTITIONS - 1):
        controller.append([PartitionChangeRecord(topic_id, p, leader=1, isr=(1,))])
        assert running.partition("t", p).state.role is Role.LEADER
        await trio.sleep(0.15)
    await trio.sleep(2 * BACKOFF_MS / 1000)

    times = attempts()
    gaps_ms = [round((b - a) * 1000) for a, b in zip(times, times[1:])]
    # The fetcher still tries (one partition is still followed from broker 2) ...
    assert len(times) >= 3, gaps_ms
    # ... and never sooner than its back-off (10% for the clocks).
    assert min(gaps_ms) >= 0.9 * BACKOFF_MS, gaps_ms

    # Right after an attempt, a new topic followed from broker 2 brings the
    # next one well before the back-off is over.
    await next_attempt(len(times))
    before = len(attempts())
    added_at = time.time()
    await running.create_topic("u", assignments=[(2, 1)])
    assert await next_attempt(before) - added_at < 0.5 * BACKOFF_MS / 1000
