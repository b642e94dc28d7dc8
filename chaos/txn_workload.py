"""The `txn` workload: transactional confluent-kafka producers and read_committed consumers.

- Producers `tp-<i>` (transactional.id `chaos-<seed>-tp-<i>`), each in a
  thread of its own, run one transaction after another: `begin`, one or two
  records to each of two or more partitions (values `<txn>-<n>`, the Kafka
  key the transaction's name), a flush, then `commit` or `abort`, chosen by
  a `random.Random` seeded from the run's seed and the producer's name.
  Every begin, send, commit and abort is an invoke and a completion in the
  history; a send's invoke carries the transaction's name as its `key`.
- A commit that fails with a retriable error is tried again; one that needs
  an abort is recorded `info` and followed by an abort; a fatal error (the
  producer fenced) is recorded and the producer is made again (its
  init_transactions aborts what the old one left open).
- A send that produce() refuses makes the transaction abort (committing it
  would leave out a record the history says belongs to it).
- Consumers `c-rc-group` (in a group) and `c-rc-assign` (assign()) poll with
  isolation.level=read_committed.
- After the heal the final reads are a read_uncommitted one (confluent-kafka
  and kafka-python: every acknowledged record, aborted or not, is in the log)
  and a read_committed one (confluent-kafka, once no transaction is open).
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from chaos.workload import _NEVER_SENT, QueueOptions, QueueWorkload, client_logger

#: The transaction timeout of the producers: a transaction its producer could not end
#: is aborted by the coordinator this long after it began, so the final
#: read_committed read waits no longer than this for the last stable offset.
TRANSACTION_TIMEOUT_MS = 20000


@dataclasses.dataclass
class TxnOptions(QueueOptions):
    transactional_producers: int = 2
    transactions_per_second: float = 5.0  # per producer
    abort_fraction: float = 0.3
    seed: int = 0
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS


class TxnWorkload(QueueWorkload):
    options: TxnOptions
    CONSUMERS = ("c-rc-group", "c-rc-assign")

    def start(self) -> None:
        for i in range(self.options.transactional_producers):
            self._spawn(self._transact, f"tp-{i}")
        self._spawn(self._consume, "c-rc-group", True, "read_committed", self.options.group_protocol)
        self._spawn(self._consume, "c-rc-assign", False, "read_committed")

    def _consumers_caught_up(self) -> bool:
        from chaos.txn_check import COMMITTED, transactions

        events = self.history.snapshot()
        committed = {v for t in transactions(events).values() if t.outcome == COMMITTED for v in t.sends}
        by: dict[str, set[str | None]] = {name: set() for name in self.CONSUMERS}
        for e in events:
            if e.f == "poll" and e.process in by:
                by[e.process].add(e.value)
        return all(committed <= seen for seen in by.values())

    def _new_producer(self, name: str) -> Any:
        from confluent_kafka import Producer

        o = self.options
        return Producer({
            **o.client(), "transactional.id": f"chaos-{o.seed}-{name}",
            "transaction.timeout.ms": o.transaction_timeout_ms, "linger.ms": 2,
            "message.timeout.ms": min(o.message_timeout_ms, o.transaction_timeout_ms),
            "request.timeout.ms": 4000, "retry.backoff.ms": 100, "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 2000, "client.id": name,
        }, logger=client_logger(self.log_path))

    def _producer(self, name: str) -> Any:
        """A producer whose init_transactions succeeded (None if the workload stopped first)."""
        producer = self._new_producer(name)
        while not self.stop_producers.is_set():
            self.history.record(name, "invoke", "init")
            try:
                producer.init_transactions(30)
                self.history.record(name, "ok", "init")
                return producer
            except Exception as exc:  # retriable or not, a producer that cannot start yet waits and tries again
                self.history.record(name, "info", "init", extra=_error(exc))
                if _is_fatal(exc):
                    producer = self._new_producer(name)
                time.sleep(1.0)
        return None

    def _transact(self, name: str) -> None:
        o = self.options
        rng = random.Random(f"{o.seed}-{name}")
        self.history.record(name, "info", "open", extra={"role": "producer", "idempotent": True, "ordered": True,
                                                         "transactional": True})
        producer = self._producer(name)
        interval = 1.0 / o.transactions_per_second
        n = 0
        next_at = time.monotonic()
        while producer is not None and not self.stop_producers.is_set():
            txn = f"{name}-t{n}"
            n += 1
            count = rng.randint(2, o.partitions) if o.partitions > 1 else 1
            partitions = sorted(rng.sample(range(o.partitions), count))
            sends = [(p, f"{txn}-{i}") for i, p in enumerate(p for p in partitions for _ in range(rng.randint(1, 2)))]
            commit = rng.random() >= o.abort_fraction
            ok = self._one_transaction(producer, name, txn, sends, commit)
            if not ok:
                producer = self._restart(name)
            next_at = max(next_at + interval, time.monotonic() - interval)
            while (left := next_at - time.monotonic()) > 0 and not self.stop_producers.is_set():
                if producer is not None:
                    producer.poll(min(left, 0.1))
                else:
                    time.sleep(min(left, 0.1))
        if producer is not None:
            producer.flush(10)

    def _restart(self, name: str) -> Any:
        """A producer in a fatal state is dropped for a new one with the same transactional id:
        its init_transactions fences the old one and aborts what it left open."""
        return self._producer(name) if not self.stop_producers.is_set() else None

    def _one_transaction(self, producer: Any, name: str, txn: str, sends: list[tuple[int, str]],
                         commit: bool) -> bool:
        """One transaction; False when the producer must be made again."""
        from confluent_kafka import KafkaException

        o = self.options
        self.history.record(name, "invoke", "begin", value=txn)
        try:
            producer.begin_transaction()
        except KafkaException as exc:
            self.history.record(name, "fail", "begin", value=txn, extra=_error(exc))
            return not _is_fatal(exc) and self._abort(producer, name, txn)
        self.history.record(name, "ok", "begin", value=txn)

        def delivered(err: Any, msg: Any) -> None:
            value = msg.value().decode()
            if err is None:
                self.history.record(name, "ok", "send", partition=msg.partition(), value=value, offset=msg.offset(),
                                    key=txn)
            else:
                kind = "fail" if err.name() in _NEVER_SENT else "info"
                self.history.record(name, kind, "send", partition=msg.partition(), value=value, key=txn,
                                    extra={"error": err.name(), "message": err.str()})

        for partition, value in sends:
            self.history.record(name, "invoke", "send", partition=partition, value=value, key=txn)
            try:
                producer.produce(o.topic, value=value.encode(), key=txn.encode(), partition=partition,
                                 on_delivery=delivered)
            except (BufferError, KafkaException) as exc:
                self.history.record(name, "fail", "send", partition=partition, value=value, key=txn,
                                    extra=_error(exc))
                commit = False  # a record left out: committing would break the transaction's atomicity
        producer.flush(o.transaction_timeout_ms / 1000)
        if not commit:
            return self._abort(producer, name, txn)
        deadline = time.monotonic() + o.transaction_timeout_ms / 1000 + 10
        while True:
            self.history.record(name, "invoke", "commit", value=txn)
            try:
                producer.commit_transaction(10)
                self.history.record(name, "ok", "commit", value=txn)
                return True
            except KafkaException as exc:
                # Unknown: only the abort that may follow says it did not happen.
                self.history.record(name, "info", "commit", value=txn, extra=_error(exc))
                err = exc.args[0] if exc.args else None
                if err is not None and err.txn_requires_abort():
                    return self._abort(producer, name, txn)
                if err is None or not err.retriable() or time.monotonic() > deadline:
                    return not _is_fatal(exc) and self._abort(producer, name, txn)

    def _abort(self, producer: Any, name: str, txn: str) -> bool:
        from confluent_kafka import KafkaException

        for _ in range(5):
            self.history.record(name, "invoke", "abort", value=txn)
            try:
                producer.abort_transaction(10)
                self.history.record(name, "ok", "abort", value=txn)
                return True
            except KafkaException as exc:
                self.history.record(name, "info", "abort", value=txn, extra=_error(exc))
                err = exc.args[0] if exc.args else None
                if err is None or not err.retriable():
                    return False
        return False


def _error(exc: BaseException) -> dict[str, Any]:
    err = exc.args[0] if exc.args else None
    if hasattr(err, "name"):
        return {"error": err.name(), "message": err.str(), "fatal": err.fatal(),
                "retriable": err.retriable(), "abortable": err.txn_requires_abort()}
    return {"error": type(exc).__name__, "message": str(exc)}


def _is_fatal(exc: BaseException) -> bool:
    err = exc.args[0] if exc.args else None
    return bool(getattr(err, "fatal", lambda: True)())
