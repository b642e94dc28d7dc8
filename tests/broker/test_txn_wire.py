"""The transaction coordinator's APIs over the wire, request by request, at
the versions clients and brokers send: FindCoordinator key type 1 (single
and batched), InitProducerId, AddPartitionsToTxn (the client form and the
v4+ batched and verify-only form of KIP-890), AddOffsetsToTxn, EndTxn,
DescribeTransactions and ListTransactions; and the errors a client sees."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import trio
from broker_testing import start_broker
from kio.schema.add_offsets_to_txn.v3 import request as aot3
from kio.schema.add_partitions_to_txn.v1 import request as apt1
from kio.schema.add_partitions_to_txn.v3 import request as apt3
from kio.schema.add_partitions_to_txn.v5 import request as apt5
from kio.schema.describe_transactions.v0 import request as dt0
from kio.schema.end_txn.v1 import request as et1
from kio.schema.end_txn.v3 import request as et3
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3 import request as fc3
from kio.schema.find_coordinator.v4 import request as fc4
from kio.schema.init_producer_id.v4 import request as ip4
from kio.schema.list_transactions.v1 import request as lt1
from txn_testing import GROUP_CONFIG, TXN_CONFIG, MarkerRecorder

from broker.core.group import OFFSETS_TOPIC_NAME, partition_for_group

MS = datetime.timedelta(milliseconds=1)


async def setup(nursery, tmp_path):
    running = await start_broker(nursery, tmp_path, txn_coordinator=TXN_CONFIG, group_coordinator=GROUP_CONFIG)
    recorder = MarkerRecorder(running.broker).install()
    await running.create_topic("a", partitions=2)
    conn = await running.connect(nursery)
    return running, recorder, conn


async def init_pid(conn, tid: str, timeout_ms: int = 10_000, pid: int = -1, epoch: int = -1):
    return await conn.request(ip4.InitProducerIdRequest(transactional_id=tid, transaction_timeout=timeout_ms * MS,
                                                        producer_id=pid, producer_epoch=epoch))


async def found(conn, tid: str, key_type: int = 1):
    for _ in range(100):
        answer = await conn.request(fc3.FindCoordinatorRequest(key=tid, key_type=key_type))
        if answer.error_code == ErrorCode.none:
            return answer
        await trio.sleep(0.05)
    raise AssertionError(answer)


def add3(tid, pid, epoch, partitions):
    return apt3.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(apt3.AddPartitionsToTxnTopic(name="a", partitions=partitions),))


async def test_a_transaction_request_by_request(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder, conn = await setup(nursery, tmp_path)
        coordinator = await found(conn, "w1")
        assert coordinator.node_id == 1 and coordinator.port == running.port
        batched = await conn.request(fc4.FindCoordinatorRequest(key_type=1, coordinator_keys=("w1", "w2", "")))
        assert [c.error_code for c in batched.coordinators] == [ErrorCode.none, ErrorCode.none,
                                                                 ErrorCode.invalid_request]

        assert (await init_pid(conn, "w1", timeout_ms=900_001)).error_code == ErrorCode.invalid_transaction_timeout
        init = await init_pid(conn, "w1")
        assert init.error_code == ErrorCode.none and init.producer_epoch == 0
        pid = init.producer_id

        added = await conn.request(add3("w1", pid, 0, (0, 1)))
        assert [(r.partition_index, r.partition_error_code) for t in added.results_by_topic_v3_and_below
                for r in t.results_by_partition] == [(0, ErrorCode.none), (1, ErrorCode.none)]
        unknown = await conn.request(apt3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="w1", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
            v3_and_below_topics=(apt3.AddPartitionsToTxnTopic(name="a", partitions=(0,)),
                                 apt3.AddPartitionsToTxnTopic(name="nope", partitions=(0,)))))
        assert {t.name: t.results_by_partition[0].partition_error_code
                for t in unknown.results_by_topic_v3_and_below} == {
            "a": ErrorCode.operation_not_attempted, "nope": ErrorCode.unknown_topic_or_partition}
        # The group's __consumer_offsets partition joins the transaction.
        await found(conn, "g", key_type=0)
        offsets = await conn.request(aot3.AddOffsetsToTxnRequest(transactional_id="w1", producer_id=pid,
                                                                 producer_epoch=0, group_id="g"))
        assert offsets.error_code == ErrorCode.none

        # KIP-890 verify-only, as a partition leader asks.
        verify = await conn.request(apt5.AddPartitionsToTxnRequest(transactions=(apt5.AddPartitionsToTxnTransaction(
            transactional_id="w1", producer_id=pid, producer_epoch=0, verify_only=True,
            topics=(apt5.AddPartitionsToTxnTopic(name="a", partitions=(0,)),)),
            apt5.AddPartitionsToTxnTransaction(transactional_id="w2", producer_id=pid, producer_epoch=0,
                                               verify_only=True,
                                               topics=(apt5.AddPartitionsToTxnTopic(name="a", partitions=(0,)),)))))
        assert [t.topic_results[0].results_by_partition[0].partition_error_code
                for t in verify.results_by_transaction] == [ErrorCode.none, ErrorCode.invalid_producer_id_mapping]

        described = await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=("w1", "nope")))
        w1, nope = described.transaction_states
        assert (w1.error_code, w1.transaction_state, w1.producer_id, w1.producer_epoch) == \
            (ErrorCode.none, "Ongoing", pid, 0)
        assert {(t.topic, tuple(t.partitions)) for t in w1.topics} == {
            ("a", (0, 1)), (OFFSETS_TOPIC_NAME, (partition_for_group("g", 3),))}
        assert w1.transaction_timeout == 10_000 * MS
        assert nope.error_code == ErrorCode.transactional_id_not_found
        listed = await conn.request(lt1.ListTransactionsRequest(state_filters=("Ongoing", "Bogus"),
                                                                producer_id_filters=(), duration_filter=-1))
        assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [("w1", "Ongoing")]
        assert listed.unknown_state_filters == ("Bogus",)

        # A stale epoch on EndTxn: PRODUCER_FENCED for v2+, INVALID_PRODUCER_EPOCH before (KIP-588).
        assert (await conn.request(et3.EndTxnRequest(transactional_id="w1", producer_id=pid, producer_epoch=5,
                                                     committed=True))).error_code == ErrorCode.producer_fenced
        assert (await conn.request(et1.EndTxnRequest(transactional_id="w1", producer_id=pid, producer_epoch=5,
                                                     committed=True))).error_code == ErrorCode.invalid_producer_epoch
        assert (await conn.request(apt1.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="w1", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=5,
            v3_and_below_topics=(apt1.AddPartitionsToTxnTopic(name="a", partitions=(0,)),))
        )).results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == \
            ErrorCode.invalid_producer_epoch

        ended = await conn.request(et3.EndTxnRequest(transactional_id="w1", producer_id=pid, producer_epoch=0,
                                                     committed=True))
        assert ended.error_code == ErrorCode.none
        with trio.fail_after(10):
            while True:
                d = await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=("w1",)))
                if d.transaction_states[0].transaction_state == "CompleteCommit":
                    break
                # Until the markers are written, the next transaction must wait.
                assert (await conn.request(add3("w1", pid, 0, (0,)))).results_by_topic_v3_and_below[0] \
                    .results_by_partition[0].partition_error_code == ErrorCode.concurrent_transactions
                await trio.sleep(0.01)
        assert {(t, p) for t, p, *_ in recorder.written} == {
            ("a", 0), ("a", 1), (OFFSETS_TOPIC_NAME, partition_for_group("g", 3))}
        # The next InitProducerId bumps the epoch; the old epoch is fenced.
        again = await init_pid(conn, "w1")
        assert (again.producer_id, again.producer_epoch) == (pid, 1)
        stale = await conn.request(add3("w1", pid, 0, (0,)))
        assert stale.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == \
            ErrorCode.producer_fenced
        nursery.cancel_scope.cancel()


async def test_not_the_coordinator_and_transaction_timeout(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder, conn = await setup(nursery, tmp_path)
        await found(conn, "w1")
        # The coordinator drops its shards (as when leadership moves away): NOT_COORDINATOR.
        runtime = running.broker.txn_coordinator
        for runner in list(runtime.shards.values()):
            runtime._unload(runner, "test")
        assert (await init_pid(conn, "w1")).error_code == ErrorCode.not_coordinator
        runtime.on_metadata_update()  # leading again: reloaded from the log
        with trio.fail_after(5):
            while (answer := await init_pid(conn, "w1", timeout_ms=1)).error_code != ErrorCode.none:
                assert answer.error_code in (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator)
                await trio.sleep(0.01)
        pid = answer.producer_id
        await conn.request(add3("w1", pid, 0, (0,)))
        # Past transaction.timeout.ms the coordinator aborts it at a bumped epoch.
        await trio.sleep(0.05)
        for runner in runtime.shards.values():
            runner.shard._next_abort_check_ms = 0
        runtime._timers_moved.set()
        with trio.fail_after(10):
            while not any(not commit for *_x, commit, _c in recorder.written):
                await trio.sleep(0.01)
        (written,) = recorder.written
        assert written[:4] == ("a", 0, pid, 1) and written[4] is False
        ended = await conn.request(et3.EndTxnRequest(transactional_id="w1", producer_id=pid, producer_epoch=0,
                                                     committed=True))
        assert ended.error_code == ErrorCode.producer_fenced
        nursery.cancel_scope.cancel()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run([sys.executable, "-m", "raftka.cli", "transactions", *args, "--timeout", "20"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


async def test_transactions_command_lists_describes_and_aborts(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder, conn = await setup(nursery, tmp_path)
        await found(conn, "cli-txn")
        init = await init_pid(conn, "cli-txn", timeout_ms=60_000)
        pid = init.producer_id
        await conn.request(add3("cli-txn", pid, 0, (0, 1)))
        boot = ("--bootstrap-server", running.bootstrap)

        listed = await trio.to_thread.run_sync(cli, "list", *boot)
        assert listed.returncode == 0, listed.stderr
        assert ["cli-txn", "1", str(pid), "Ongoing"] in [line.split() for line in listed.stdout.splitlines()]
        only_empty = await trio.to_thread.run_sync(cli, "list", *boot, "--state", "Empty")
        assert "cli-txn" not in only_empty.stdout

        described = await trio.to_thread.run_sync(cli, "describe", *boot, "--transactional-id", "cli-txn")
        assert described.returncode == 0, described.stderr
        row = described.stdout.splitlines()[-1].split()
        assert row[:5] == ["1", "cli-txn", str(pid), "0", "Ongoing"] and row[-1] == "a-0,a-1"
        missing = await trio.to_thread.run_sync(cli, "describe", *boot, "--transactional-id", "nope")
        assert missing.returncode == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr

        # A hanging transaction on one partition, ended by an ABORT marker from its leader.
        aborted = await trio.to_thread.run_sync(cli, "abort", *boot, "--topic", "a", "--partition", "1",
                                                "--producer-id", str(pid), "--producer-epoch", "0",
                                                "--coordinator-epoch", "0")
        assert aborted.returncode == 0, aborted.stderr
        assert ("a", 1, pid, 0, False, 0) in recorder.written

        # Through the coordinator: the producer is fenced and its transaction aborted.
        terminated = await trio.to_thread.run_sync(cli, "force-terminate", *boot, "--transactional-id", "cli-txn")
        assert terminated.returncode == 0, terminated.stderr
        assert {("a", 0, pid, 1, False), ("a", 1, pid, 1, False)} <= {w[:5] for w in recorder.written}
        described = await trio.to_thread.run_sync(cli, "describe", *boot, "--transactional-id", "cli-txn")
        assert described.stdout.splitlines()[-1].split()[3:5] == ["2", "Empty"]
        nursery.cancel_scope.cancel()


async def test_markers_follow_the_partition_leader_when_it_moves(tmp_path):
    async with trio.open_nursery() as nursery:
        running, recorder, conn = await setup(nursery, tmp_path)
        await found(conn, "w-move")  # __transaction_state, all on broker 1
        # A second broker id served by this same process: its requests land
        # here, where the recorder refuses them while the image names broker 2 as leader.
        await running.controller.register_broker(2, "127.0.0.1", running.port)
        await running.create_topic("moving", assignments=[(2, 1)])
        sender = running.broker.txn_coordinator.markers
        sender.keep_sent = True
        pid = (await init_pid(conn, "w-move")).producer_id
        added = await conn.request(apt3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="w-move", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
            v3_and_below_topics=(apt3.AddPartitionsToTxnTopic(name="moving", partitions=(0,)),)))
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == ErrorCode.none
        assert (await conn.request(et3.EndTxnRequest(transactional_id="w-move", producer_id=pid, producer_epoch=0,
                                                     committed=True))).error_code == ErrorCode.none
        with trio.fail_after(10):
            while len(sender.sent) < 2:  # refused, and retried
                await trio.sleep(0.01)
        assert {target for target, _r in sender.sent} == {2} and not recorder.written
        await running.controller.controlled_shutdown(2)  # leadership moves to broker 1
        with trio.fail_after(10):
            while not recorder.written:
                await trio.sleep(0.01)
        assert sender.sent[-1][0] == 1
        assert recorder.written == [("moving", 0, pid, 0, True, 0)]
        with trio.fail_after(10):
            while (await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=("w-move",)))) \
                    .transaction_states[0].transaction_state != "CompleteCommit":
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_a_deleted_topic_gets_no_marker_and_the_transaction_completes(tmp_path):
    from kio.schema.delete_topics.v4 import request as dt4
    async with trio.open_nursery() as nursery:
        running, recorder, conn = await setup(nursery, tmp_path)
        await running.create_topic("gone", partitions=1)
        await found(conn, "w-gone")
        pid = (await init_pid(conn, "w-gone")).producer_id
        await conn.request(apt3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="w-gone", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=0,
            v3_and_below_topics=(apt3.AddPartitionsToTxnTopic(name="gone", partitions=(0,)),
                                 apt3.AddPartitionsToTxnTopic(name="a", partitions=(0,)))))
        recorder.fail_next = 10 ** 6  # nothing is written until the topic is gone
        ended = await conn.request(et3.EndTxnRequest(transactional_id="w-gone", producer_id=pid, producer_epoch=0,
                                                     committed=False))
        assert ended.error_code == ErrorCode.none
        deleted = await conn.request(dt4.DeleteTopicsRequest(topic_names=("gone",), timeout=5 * 1000 * MS))
        assert deleted.responses[0].error_code == ErrorCode.none
        recorder.fail_next = 0
        with trio.fail_after(10):
            while (await conn.request(dt0.DescribeTransactionsRequest(transactional_ids=("w-gone",)))) \
                    .transaction_states[0].transaction_state != "CompleteAbort":
                await trio.sleep(0.01)
        assert [w[:2] for w in recorder.written] == [("a", 0)]
        nursery.cancel_scope.cancel()
