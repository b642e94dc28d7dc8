"""Transaction coordinator failover: the broker leading a transactional
id's `__transaction_state` partition is killed (SIGKILL) with one
transaction logged PrepareCommit and another open (Ongoing).

Real processes (`LocalCluster`: one controller, three brokers; the same
in ZooKeeper mode with RAFTKA_SOAK=1;
`__transaction_state` with Kafka's default replication factor 3 and
min.insync.replicas 2). The coordinator answered EndTxn only once the
PrepareCommit record was committed to a majority, so the broker that
takes over the partition finds it in the records it replays, and goes on
with the commit: its markers are sent again, never an abort. The open
transaction is aborted by the new coordinator once its
`transaction.timeout.ms` has passed, at a bumped epoch, so its producer is
fenced. A confluent-kafka producer with its transaction open when the
coordinator dies commits it afterwards, through the new coordinator.

The markers themselves are written by the partitions' leaders
(WriteTxnMarkers), another module's work: until it answers, the
transaction stays PrepareCommit/PrepareAbort on the new coordinator while
the markers are retried; once it does, it reaches CompleteCommit/
CompleteAbort. Both are accepted here; a commit turned abort (or the
reverse) is not.
"""

from __future__ import annotations

import datetime
import os
import threading

import pytest
import trio
from kio.schema.add_partitions_to_txn.v3 import request as apt
from kio.schema.describe_transactions.v0 import request as dt
from kio.schema.end_txn.v3 import request as et
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as fc
from kio.schema.init_producer_id.v4 import request as ip

from cluster import LocalCluster
from common.wire import ConnectionFailedError, open_connection
from quorum.zookeeper.ensemble import zookeeper_missing_reason

SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "300",
    "transaction.state.log.num.partitions": "3",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}
OPEN_TIMEOUT_MS = 4000


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("t", 3, 3)], operation_timeout=30)["t"].result(60)


class ClientTransaction(threading.Thread):
    """confluent-kafka: init, begin, produce to every partition and flush;
    once the coordinator is killed, commit (librdkafka looks the coordinator up again)."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.transactional_id = bootstrap, transactional_id
        self.produced, self.killed = threading.Event(), threading.Event()
        self.outcome = "not run"

    def run(self) -> None:
        from confluent_kafka import KafkaException, Producer

        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id})
            producer.init_transactions(60)
            producer.begin_transaction()
            for p in range(3):
                producer.produce("t", value=b"in-flight", partition=p)
            producer.flush(30)
            self.produced.set()
            self.killed.wait(60)
            producer.commit_transaction(60)
            self.outcome = "committed"
        except KafkaException as exc:
            self.outcome = repr(exc.args[0])
        finally:
            self.produced.set()


async def request(address: str, req):
    host, port = address.rsplit(":", 1)
    async with open_connection(host, int(port)) as conn:
        return await conn.request(req)


async def retry(addresses: list[str], req, ok=lambda a: True, timeout_s: float = 60):
    """Send `req` to the first address that answers, until `ok(answer)`."""
    last = None
    with trio.fail_after(timeout_s):
        while True:
            for address in addresses:
                try:
                    last = await request(address, req)
                except (ConnectionFailedError, OSError):
                    continue
                if ok(last):
                    return last
            await trio.sleep(0.2)


async def coordinator(addresses: list[str], tid: str, by_id: dict[int, str], dead: int = -1) -> tuple[int, str]:
    # Until the controller fences a killed broker, the survivors still name it.
    found = await retry(addresses, fc.FindCoordinatorRequest(key=tid, key_type=1),
                        lambda a: a.error_code == ErrorCode.none and a.node_id in by_id and a.node_id != dead)
    return found.node_id, by_id[found.node_id]


async def describe(address: str, tid: str):
    answer = await retry([address], dt.DescribeTransactionsRequest(transactional_ids=(tid,)),
                         lambda a: a.transaction_states[0].error_code == ErrorCode.none)
    return answer.transaction_states[0]


@pytest.mark.parametrize("mode", ["kraft", pytest.param("zk", marks=pytest.mark.skipif(
    os.environ.get("RAFTKA_SOAK") != "1", reason="ZooKeeper mode, the same code: set RAFTKA_SOAK=1"))])
async def test_a_new_coordinator_completes_the_commit_and_aborts_the_open_transaction(tmp_path, mode):
    if mode == "zk" and (reason := zookeeper_missing_reason()) is not None:
        pytest.skip(f"ZooKeeper mode needs a local ZooKeeper: {reason}")
    settings = {**SETTINGS, "zookeeper.session.timeout.ms": "4000"} if mode == "zk" else SETTINGS
    with LocalCluster(tmp_path, controllers=1, brokers=3, overrides=settings, mode=mode,
                      zookeeper_tick_time_ms=500) as cluster:
        cluster.start_all()
        await trio.to_thread.run_sync(cluster.wait_ready, 120)
        by_id = {b.node_id: b.address for b in cluster.brokers}
        everyone = list(by_id.values())
        await trio.to_thread.run_sync(create_topic, cluster.bootstrap)

        # Three transactional ids with the same coordinator.
        placed: dict[int, list[str]] = {}
        for i in range(60):
            node, _ = await coordinator(everyone, f"tx-{i}", by_id)
            placed.setdefault(node, []).append(f"tx-{i}")
            if len(placed[node]) == 3:
                break
        victim, (committing, open_id, client_id) = next((n, ids) for n, ids in placed.items() if len(ids) == 3)
        address = by_id[victim]
        # A real client's transaction, open when the coordinator dies, committed after.
        client = ClientTransaction(cluster.bootstrap, client_id)
        client.start()
        await trio.to_thread.run_sync(client.produced.wait, 60)

        async def init(tid: str, timeout_ms: int):
            return await retry([address], ip.InitProducerIdRequest(
                transactional_id=tid, transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
                producer_id=-1, producer_epoch=-1), lambda a: a.error_code == ErrorCode.none)

        def add(tid, pid, epoch):
            return apt.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=(apt.AddPartitionsToTxnTopic(name="t", partitions=(0, 1, 2)),))

        c = await init(committing, 60_000)
        added = await request(address, add(committing, c.producer_id, c.producer_epoch))
        assert {r.partition_error_code for t in added.results_by_topic_v3_and_below
                for r in t.results_by_partition} == {ErrorCode.none}
        ended = await request(address, et.EndTxnRequest(transactional_id=committing, producer_id=c.producer_id,
                                                        producer_epoch=c.producer_epoch, committed=True))
        assert ended.error_code == ErrorCode.none
        o = await init(open_id, OPEN_TIMEOUT_MS)
        await request(address, add(open_id, o.producer_id, o.producer_epoch))

        # Where the commit stands when the coordinator dies: PrepareCommit
        # while its markers are being written, CompleteCommit once they are.
        at_kill = (await describe(address, committing)).transaction_state
        cluster.kill(victim)
        client.killed.set()
        survivors = [a for n, a in by_id.items() if n != victim]
        successor, new_address = await coordinator(survivors, committing, by_id, dead=victim)

        state = await describe(new_address, committing)
        assert state.transaction_state in ("PrepareCommit", "CompleteCommit"), state
        assert (state.producer_id, state.producer_epoch) == (c.producer_id, c.producer_epoch)
        if at_kill == "PrepareCommit":
            # Found preparing in the records: the new coordinator sends its markers.
            output = cluster.node(successor).output_since_start()
            assert "1 transactions to complete" in output, output[-3000:]

        # The open one: aborted past its timeout by the new coordinator, its producer fenced.
        with trio.fail_after(OPEN_TIMEOUT_MS / 1000 + 30):
            while (state := await describe(new_address, open_id)).transaction_state == "Ongoing":
                await trio.sleep(0.2)
        assert state.transaction_state in ("PrepareAbort", "CompleteAbort"), state
        assert (state.producer_id, state.producer_epoch) == (o.producer_id, o.producer_epoch + 1)
        fenced = await request(new_address, et.EndTxnRequest(transactional_id=open_id, producer_id=o.producer_id,
                                                             producer_epoch=o.producer_epoch, committed=True))
        assert fenced.error_code == ErrorCode.producer_fenced
        # The commit stayed a commit.
        assert (await describe(new_address, committing)).transaction_state in ("PrepareCommit", "CompleteCommit")

        # The client found the new coordinator and committed there.
        await trio.to_thread.run_sync(client.join, 90)
        assert client.outcome == "committed", client.outcome
        _node, client_coordinator = await coordinator(survivors, client_id, by_id, dead=victim)
        assert (await describe(client_coordinator, client_id)).transaction_state in (
            "PrepareCommit", "CompleteCommit")
