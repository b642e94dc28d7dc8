"""`raftka transactions list|describe|abort|force-terminate`: the cluster's
transactions, like Kafka's `kafka-transactions.sh`.

    raftka transactions list            --bootstrap-server H:P [--state S]...
    raftka transactions describe        --bootstrap-server H:P --transactional-id ID
    raftka transactions abort           --bootstrap-server H:P --topic T --partition N
                                        (--start-offset O | --producer-id P --producer-epoch E
                                         --coordinator-epoch C)
    raftka transactions force-terminate --bootstrap-server H:P --transactional-id ID

list asks every broker for the transactions its coordinator holds (state,
producer id); describe asks the transactional id's coordinator for the
whole state: producer id and epoch, timeout, when the open transaction
started and its partitions.

abort ends a hanging transaction on one partition, as kafka-transactions'
abort does: an ABORT marker for the given producer is written to the
partition by its leader (WriteTxnMarkers), so that consumers with
read_committed move past it. With --start-offset the producer is the one
whose open transaction on the partition starts at that offset (found with
DescribeProducers). Use it for a transaction its coordinator no longer
knows of; a transaction the coordinator knows is ended with
force-terminate instead.

force-terminate fences the producer of a transactional id and aborts its
open transaction through the coordinator (InitProducerId, as a new
instance of the producer would), then waits for the abort to complete.

Talks to the brokers with raftka's own Kafka-protocol client. Exit status:
0 on success, 1 if the cluster refused, 2 for bad arguments or an
unreachable cluster.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from common.errors import RaftkaError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 30.0


def register(sub: argparse._SubParsersAction) -> None:
    txns = sub.add_parser("transactions", help="list, describe and abort transactions (like kafka-transactions)",
                          description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = txns.add_subparsers(dest="transactions_command", metavar="COMMAND")
    commands.required = True

    def command(name: str, help_text: str, func: Any) -> argparse.ArgumentParser:
        p = commands.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="H:P",
                       help=f"any broker (default {DEFAULT_BOOTSTRAP})")
        p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="S",
                       help=f"give up after S seconds (default {TIMEOUT_S:.0f})")
        p.set_defaults(func=lambda args: _run(func, args))
        return p

    listing = command("list", "the transactional ids every coordinator holds", _list)
    listing.add_argument("--state", action="append", default=[],
                         help="only these states (Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, "
                              "CompleteAbort)")
    describe = command("describe", "one transactional id's state", _describe)
    describe.add_argument("--transactional-id", required=True, metavar="ID")
    abort = command("abort", "write an ABORT marker for a hanging transaction on one partition", _abort)
    abort.add_argument("--topic", required=True)
    abort.add_argument("--partition", type=int, required=True, metavar="N")
    abort.add_argument("--start-offset", type=int, metavar="O",
                       help="the offset where the hanging transaction's first record is")
    abort.add_argument("--producer-id", type=int, metavar="P")
    abort.add_argument("--producer-epoch", type=int, metavar="E")
    abort.add_argument("--coordinator-epoch", type=int, metavar="C")
    terminate = command("force-terminate", "fence a transactional id's producer and abort its open transaction",
                        _force_terminate)
    terminate.add_argument("--transactional-id", required=True, metavar="ID")


class _Refused(RaftkaError):
    """The cluster answered with an error (exit status 1)."""


class _Usage(RaftkaError):
    """Bad arguments or an unreachable cluster (exit status 2)."""


def _fail(message: str, code: int) -> int:
    from rich.console import Console

    Console(stderr=True).print(f"raftka transactions: {message}", style="red", markup=False, highlight=False,
                               soft_wrap=True)
    return code


def _run(fn: Any, args: argparse.Namespace) -> int:
    import trio

    from common.wire import ConnectionFailedError

    async def main() -> int:
        with trio.fail_after(args.timeout):
            return await fn(args)

    try:
        return trio.run(main)
    except _Refused as exc:
        return _fail(str(exc), 1)
    except _Usage as exc:
        return _fail(str(exc), 2)
    except (ConnectionFailedError, OSError) as exc:
        return _fail(f"no answer from {args.bootstrap_server}: {exc}", 2)
    except trio.TooSlowError:
        return _fail(f"no complete answer within {args.timeout:.0f} s", 2)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        raise _Usage(f"--bootstrap-server {text!r}: give host:port")
    return host, int(port)


async def _request(host: str, port: int, request: Any) -> Any:
    from common.wire import open_connection

    async with open_connection(host, port, client_id="raftka-transactions") as conn:
        return await conn.request(request)


async def _metadata(args: argparse.Namespace, topics: list[str] | None = None) -> Any:
    from kio.schema.metadata.v12 import request as md

    return await _request(*_address(args.bootstrap_server), md.MetadataRequest(
        topics=None if topics is None else tuple(md.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))


def _name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR {code}"


def _table(columns: list[str], rows: list[list[Any]]) -> None:
    """Columns padded to their widest cell, never cut: the output is read
    by people and by scripts (often through a pipe, where a terminal's
    width is unknown), as kafka-transactions prints it."""
    cells = [columns] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


async def _list(args: argparse.Namespace) -> int:
    from kio.schema.list_transactions.v1 import request as lt

    metadata = await _metadata(args, [])
    rows, errors = [], []
    for broker in sorted(metadata.brokers, key=lambda b: b.node_id):
        answer = await _request(broker.host, broker.port, lt.ListTransactionsRequest(
            state_filters=tuple(args.state), producer_id_filters=(), duration_filter=-1))
        if answer.error_code != 0:
            errors.append(f"broker {broker.node_id}: {_name(answer.error_code)}")
        if answer.unknown_state_filters:
            raise _Usage(f"unknown states: {', '.join(answer.unknown_state_filters)}")
        rows += [[t.transactional_id, broker.node_id, t.producer_id, t.transaction_state]
                 for t in answer.transaction_states]
    _table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], sorted(rows))
    if errors:
        raise _Refused("; ".join(errors) + " (list again once their transactions are loaded)")
    return 0


async def _coordinator(args: argparse.Namespace, transactional_id: str) -> tuple[int, str, int]:
    import trio
    from kio.schema.errors import ErrorCode
    from kio.schema.find_coordinator.v3 import request as fc

    while True:
        found = await _request(*_address(args.bootstrap_server),
                               fc.FindCoordinatorRequest(key=transactional_id, key_type=1))
        if found.error_code == ErrorCode.none:
            return found.node_id, found.host, found.port
        if found.error_code not in (ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress):
            raise _Refused(f"FindCoordinator: {_name(found.error_code)} {found.error_message or ''}")
        await trio.sleep(0.2)


async def _describe(args: argparse.Namespace) -> int:
    import trio
    from kio.schema.describe_transactions.v0 import request as dt
    from kio.schema.errors import ErrorCode

    while True:
        node_id, host, port = await _coordinator(args, args.transactional_id)
        answer = await _request(host, port, dt.DescribeTransactionsRequest(
            transactional_ids=(args.transactional_id,)))
        (state,) = answer.transaction_states
        if state.error_code in (ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress):
            await trio.sleep(0.2)
            continue
        break
    if state.error_code != ErrorCode.none:
        raise _Refused(f"{args.transactional_id}: {_name(state.error_code)}")
    started_ms = int(state.transaction_start_time.timestamp() * 1000)
    now_ms = int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
    open_txn = state.transaction_state == "Ongoing" or state.transaction_state.startswith("Prepare")
    _table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
            "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
           [[node_id, state.transactional_id, state.producer_id, state.producer_epoch, state.transaction_state,
             int(state.transaction_timeout.total_seconds() * 1000), started_ms if open_txn else "None",
             now_ms - started_ms if open_txn else "None",
             ",".join(f"{t.topic}-{p}" for t in state.topics for p in t.partitions)]])
    return 0


async def _leader(args: argparse.Namespace, topic: str, partition: int) -> tuple[str, int]:
    metadata = await _metadata(args, [topic])
    (t,) = metadata.topics
    if t.error_code != 0:
        raise _Refused(f"{topic}: {_name(t.error_code)}")
    brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
    for p in t.partitions:
        if p.partition_index == partition and p.leader_id in brokers:
            return brokers[p.leader_id]
    raise _Refused(f"{topic}-{partition} has no leader now (or does not exist)")


async def _abort(args: argparse.Namespace) -> int:
    from kio.schema.write_txn_markers.v1 import request as wtm

    explicit = (args.producer_id, args.producer_epoch, args.coordinator_epoch)
    if args.start_offset is None and None in explicit:
        raise _Usage("give --start-offset, or all of --producer-id, --producer-epoch and --coordinator-epoch")
    host, port = await _leader(args, args.topic, args.partition)
    if args.start_offset is not None:
        pid, epoch, coordinator_epoch = await _producer_at(host, port, args)
    else:
        pid, epoch, coordinator_epoch = explicit
    answer = await _request(host, port, wtm.WriteTxnMarkersRequest(markers=(wtm.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=False, coordinator_epoch=coordinator_epoch,
        topics=(wtm.WritableTxnMarkerTopic(name=args.topic, partition_indexes=(args.partition,)),)),)))
    errors = [p.error_code for m in answer.markers for t in m.topics for p in t.partitions]
    if errors != [0]:
        raise _Refused(f"WriteTxnMarkers to {args.topic}-{args.partition}: "
                       f"{', '.join(_name(e) for e in errors) or 'no answer for the partition'}")
    print(f"aborted the transaction of producer {pid} (epoch {epoch}) on {args.topic}-{args.partition}")
    return 0


async def _producer_at(host: str, port: int, args: argparse.Namespace) -> tuple[int, int, int]:
    from kio.schema.describe_producers.v0 import request as dp

    answer = await _request(host, port, dp.DescribeProducersRequest(topics=(dp.TopicRequest(
        name=args.topic, partition_indexes=(args.partition,)),)))
    (t,) = answer.topics
    (p,) = t.partitions
    if p.error_code != 0:
        raise _Refused(f"DescribeProducers {args.topic}-{args.partition}: {_name(p.error_code)}")
    for producer in p.active_producers:
        if producer.current_txn_start_offset == args.start_offset:
            return producer.producer_id, producer.producer_epoch, producer.coordinator_epoch
    raise _Refused(f"no open transaction starts at offset {args.start_offset} of {args.topic}-{args.partition}")


async def _force_terminate(args: argparse.Namespace) -> int:
    import trio
    from kio.schema.errors import ErrorCode
    from kio.schema.init_producer_id.v4 import request as ip

    # As a new producer instance: the coordinator fences the old epoch and
    # aborts the open transaction (CONCURRENT_TRANSACTIONS until done).
    while True:
        _node, host, port = await _coordinator(args, args.transactional_id)
        answer = await _request(host, port, ip.InitProducerIdRequest(
            transactional_id=args.transactional_id, transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1, producer_epoch=-1))
        if answer.error_code == ErrorCode.none:
            break
        if answer.error_code not in (ErrorCode.concurrent_transactions, ErrorCode.not_coordinator,
                                     ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available):
            raise _Refused(f"{args.transactional_id}: {_name(answer.error_code)}")
        await trio.sleep(0.1)
    print(f"{args.transactional_id}: producer {answer.producer_id} fenced (now epoch {answer.producer_epoch}); "
          "no transaction is open")
    return 0
