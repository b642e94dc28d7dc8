"""Exactly once (`exactly.once.support=enabled`): the transaction steps of a flow.

The worker's step 3 (storing the acknowledged source offsets) is a
transaction on the target per batch, holding the records and the source group's offsets
(`send_offsets_to_transaction`): a killed process's open transaction is
aborted by its successor (same `transactional.id`), which resumes from the
offsets committed with the last committed transaction.

These steps are kept apart from the copy loop in `mirror.worker` because
each one has its own way to fail: every transactional call runs in a helper
thread with a time limit (librdkafka can wait for ever), a fatal error or a
stuck call replaces the producer (the new one fences the old), and an
aborted batch rewinds the consumer to the positions committed on the target.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from mirror.errors import Backoff, MirrorError, _quiet
from mirror.topics import ADMIN_TIMEOUT_S

#: One wait of a transactional call (flush, send offsets, commit, abort);
#: faults of the target shorter than this are ridden out within one call.
TXN_TIMEOUT_S = 10.0
#: How long a timed-out transactional call is retried before its batch is aborted and copied again.
TXN_RETRY_S = 60.0
#: How long past its own timeout a transactional call may take before it counts as stuck.
TXN_GRACE_S = 5.0
#: How often a call stuck while an earlier stuck producer is still closing says it still waits.
STUCK_REPORT_S = 15.0


class AbandonedProducer:
    """A transactional producer replaced while one of its calls was stuck,
    closed by a daemon thread once that call returns (librdkafka's handle
    must not be destroyed under a running call). Until then its threads
    live on: the flow keeps at most one such producer (`alive`)."""

    def __init__(self, producer: Producer, stuck: threading.Thread) -> None:
        self.since = time.monotonic()
        self._producer: Producer | None = producer
        self._stuck = stuck
        self._closer = threading.Thread(target=self._close, name="mirror-abandoned-producer", daemon=True)
        self._closer.start()

    def _close(self) -> None:
        self._stuck.join()
        producer, self._producer = self._producer, None
        try:
            # Fenced by its successor: nothing it holds may reach the target, so
            # nothing is waited for (close() would flush what is left).
            producer.purge(blocking=False)
            producer.close()
        except (KafkaException, RuntimeError):
            pass

    def alive(self) -> bool:
        return self._closer.is_alive()

    def wait(self, timeout: float) -> bool:
        """True once it is closed (its call returned and its handle is destroyed)."""
        self._closer.join(timeout)
        return not self._closer.is_alive()


class ExactlyOnceSteps:
    """The transaction steps of `mirror.worker.Flow` (a mixin: they share the
    flow's clients, its assignment and its per-batch state)."""

    def _copy_transaction(self, messages: list[Any]) -> None:
        """Exactly once: the batch and the source offsets commit together on the target."""
        self._txn_offsets = {}
        if not self._txn_call("begin the transaction", self.producer.begin_transaction):
            return self._abort_batch()
        self._copy_batch(messages)
        left = self.producer.flush(TXN_TIMEOUT_S)
        if left and not self._blocked:
            # Records still unacknowledged would be committed without their source
            # offsets (a restart would copy them twice): the batch goes again.
            reason = f"{left} records not acknowledged by {self.cfg.target} within {TXN_TIMEOUT_S:.0f} s"
            self._blocked[("", -1)] = (0, reason)
        if self._blocked:
            return self._abort_batch()
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(self._txn_offsets.items())]
        if offsets and not self._txn_call("send the source offsets to the transaction",
                                          lambda: self.producer.send_offsets_to_transaction(
                                              offsets, self.positions.consumer_group_metadata(), TXN_TIMEOUT_S)):
            return self._abort_batch()
        if not self._txn_call("commit the transaction", lambda: self.producer.commit_transaction(TXN_TIMEOUT_S)):
            return self._abort_batch()
        for tp, offset in self._txn_offsets.items():
            self._done[tp] = offset
        self._backoff.reset()
        for sync in self.emitter.pending():
            self._send_sync(sync)

    def _txn_call(self, what: str, call: Callable[[], Any]) -> bool:
        """One step of the transaction, with a bounded wait (librdkafka's own
        default waits forever, and a target that stops answering one request
        would stall the copy without a word). A timeout is retried until
        TXN_RETRY_S; False when the batch must be aborted and copied again."""
        deadline = time.monotonic() + TXN_RETRY_S
        while True:
            try:
                if not self._bounded(what, call):
                    if self.stop.is_set():
                        return False  # stopping: the process exit ends the stuck call
                    # librdkafka (2.16) can leave send_offsets_to_transaction waiting for ever
                    # when the target's group coordinator went away, whatever its timeout
                    # (its coordinator requests never time out: librdkafka issues 5456, 5511):
                    # the stuck call is left behind with its producer, a new producer fences it.
                    self._error(f"the transactional producer on {self.cfg.target} did not {what} within "
                                f"{TXN_TIMEOUT_S + TXN_GRACE_S:.0f} s; starting a new one (the open "
                                "transaction is aborted and its records copied again)")
                    self._renew_producer(abandon=True)
                    return False
                return True
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    self._error(f"the transactional producer on {self.cfg.target} failed to {what}: "
                                f"{err.name()}: {err.str()}; starting a new one (the open transaction is aborted)")
                    self._renew_producer()
                    return False
                if err.txn_requires_abort() or not err.retriable() or time.monotonic() >= deadline \
                        or self.stop.is_set():
                    self._blocked.setdefault(("", -1), (0, f"cannot {what}: {err.name()}: {err.str()}"))
                    return False
                self._error(f"{self.cfg.target} did not let the mirror {what} ({err.name()}: {err.str()}); "
                            "retrying")

    def _bounded(self, what: str, call: Callable[[], Any]) -> bool:
        """Run a transactional call in a helper thread; False if it has not
        returned within its own timeout and a grace (its exception, if any, is
        raised here), and then `self._stuck` is its thread. While an earlier
        stuck producer is still closing, the call is waited for (at most one
        producer is left behind, with its librdkafka threads)."""
        outcome: list[BaseException | None] = []

        def body() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - raised again in the worker thread
                outcome.append(exc)

        helper = threading.Thread(target=body, name="mirror-txn", daemon=True)
        helper.start()
        helper.join(TXN_TIMEOUT_S + TXN_GRACE_S)
        while not outcome and self._abandoned is not None and not self.stop.is_set():
            if not self._abandoned.alive():
                self._reap_abandoned()
                break
            self._error(f"the transactional producer on {self.cfg.target} still did not {what}; the one it "
                        f"replaced {time.monotonic() - self._abandoned.since:.0f} s ago is still stuck, so no "
                        "second one is left behind: waiting for either (a new one then fences this one)")
            self._update_lag()  # the source goes on: the lag shown grows while the copy waits
            self._abandoned.wait(STUCK_REPORT_S)
            helper.join(0.1)
        if not outcome:
            self._stuck = helper
            return False
        if outcome[0] is not None:
            raise outcome[0]
        return True

    def _abort_batch(self) -> None:
        """Abort the open transaction (retrying until the target answers), set the
        consumer back to the positions of the last committed one, and back off."""
        backoff = Backoff()
        while not self.stop.is_set() and not self._renewed:
            try:
                self.producer.abort_transaction(TXN_TIMEOUT_S)
                break
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    self._error(f"the transactional producer on {self.cfg.target} failed to abort the transaction: "
                                f"{err.name()}: {err.str()}; starting a new one (it aborts what was left open)")
                    self._renew_producer()
                    break
                if err.code() == KafkaError._STATE:
                    break  # no transaction open (begin failed)
                self._error(f"cannot abort the transaction on {self.cfg.target} ({err.name()}: {err.str()}); "
                            f"retrying in {backoff.delay:.0f} s")
                self._update_lag()  # the source goes on: the lag shown grows while the target is away
                self.stop.wait(backoff.next())
        self._renewed = False
        self._rewind_to_committed()
        self._retry_batch()

    def _renew_producer(self, abandon: bool = False) -> None:
        """A new transactional producer (same transactional.id): its
        init_transactions fences the old one and aborts what it left open.
        `abandon`: a call of the old one (`self._stuck`) is stuck; the old one
        is closed by a daemon thread once that call returns."""
        if abandon:
            self._abandoned = AbandonedProducer(self.producer, self._stuck)
            self._stuck = None
            self.stats.producer_replacements += 1
            self.stats.abandoned_producers = 1
            self.say(f"[{self.cfg.name}] transactional producer replaced ({self.stats.producer_replacements} so "
                     "far); the stuck one is left behind until its call returns, then closed")
        else:
            try:
                self.producer.flush(0)
            except (KafkaException, RuntimeError):
                pass
            self.stats.producer_replacements += 1
        self.producer = self._client(Producer, "producer", True, self._producer_config)
        self._init_transactions()
        self._renewed = True  # nothing open on the new producer: no abort

    def _reap_abandoned(self) -> None:
        """Forget the producer left behind once its daemon thread closed it."""
        if self._abandoned is not None and not self._abandoned.alive():
            held = time.monotonic() - self._abandoned.since
            self._abandoned = None
            self.stats.abandoned_producers = 0
            self.say(f"[{self.cfg.name}] the stuck transactional producer left behind {held:.0f} s ago is closed")

    def _rewind_to_committed(self) -> None:
        assigned = [TopicPartition(t, p) for t, p in sorted(self._assigned)]
        backoff = Backoff()
        while assigned and not self.stop.is_set():
            try:
                positions = self._target_positions(assigned)
            except KafkaException as exc:
                # Going on without the seek would skip the aborted batch's records.
                self._error(f"cannot read the positions committed on {self.cfg.target} to copy the aborted "
                            f"batch again ({exc.args[0].str()}); retrying in {backoff.delay:.0f} s")
                self.stop.wait(backoff.next())
                continue
            for tp in positions:
                try:
                    self.consumer.seek(tp)
                except KafkaException:
                    pass  # no longer assigned here: whoever gets it starts from these positions (`_on_assign`)
            return

    # --- offset syncs, checkpoints, heartbeats -----------------------------

    def _init_transactions(self) -> None:
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                self.producer.init_transactions(ADMIN_TIMEOUT_S)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or err.code() in (KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION):
                    raise MirrorError(f"exactly.once.support=enabled needs transactions on {self.cfg.target} "
                                      f"({self.cfg.target_bootstrap}), which refused them: {err.name()}: "
                                      f"{err.str()}; set exactly.once.support=disabled for at-least-once") from None
                # librdkafka retries a missing transaction coordinator on its own and says only "timed out".
                self._error(f"exactly.once.support=enabled: no transaction coordinator of {self.cfg.target} "
                            f"({self.cfg.target_bootstrap}) answered within {ADMIN_TIMEOUT_S:.0f} s ({err.str()}); "
                            "the target must serve transactions (its transaction.state.log.replication.factor "
                            "live brokers, for one), or set "
                            f"exactly.once.support=disabled; retrying in {backoff.delay:.0f} s")
                self.stop.wait(backoff.next())

    def _check_aborts_hidden(self) -> None:
        """Exactly once rests on the target hiding aborted records from
        read_committed consumers (the batch a killed mirror left open is
        aborted by its successor, then copied again). Not every
        Kafka-compatible broker does (Tansu 0.6.0 does not): one aborted and
        one committed probe record in an internal topic of the target, read
        back read_committed, tell before anything is copied."""
        c = self.cfg
        topic = f"mm2-eos-probe.{c.source}.internal"
        self.topics.create(self.tgt_admin, c.target, [NewTopic(topic, 1, c.internal_replication_factor)])
        offsets: dict[bytes, int] = {}

        def record(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                offsets[msg.value()] = msg.offset()

        for value, commit in ((b"aborted", False), (b"committed", True)):
            self.producer.begin_transaction()
            self.producer.produce(topic, value=value, partition=0, on_delivery=record)
            self.producer.flush(ADMIN_TIMEOUT_S)
            if commit:
                self.producer.commit_transaction(ADMIN_TIMEOUT_S)
            else:
                self.producer.abort_transaction(ADMIN_TIMEOUT_S)
        if len(offsets) != 2:
            raise MirrorError(f"exactly.once.support=enabled: the probe transactions on {c.target} "
                              f"({c.target_bootstrap}) were not acknowledged within {ADMIN_TIMEOUT_S:.0f} s; "
                              "is the target up? Or set exactly.once.support=disabled for at-least-once")
        reader = Consumer({"bootstrap.servers": c.target_bootstrap, "group.id": f"{c.mirror_group}-eos-probe",
                           "enable.auto.commit": False, "isolation.level": "read_committed",
                           "logger": _quiet("eos-probe"), **c.target_client("consumer")})
        seen: list[bytes] = []
        try:
            reader.assign([TopicPartition(topic, 0, offsets[b"aborted"])])
            deadline = time.monotonic() + ADMIN_TIMEOUT_S
            while b"committed" not in seen and time.monotonic() < deadline and not self.stop.is_set():
                seen += [m.value() for m in reader.consume(10, 0.5) if m.error() is None]
        finally:
            reader.close()
        if b"aborted" in seen:
            raise MirrorError(f"exactly.once.support=enabled: {c.target} ({c.target_bootstrap}) shows records of "
                              "aborted transactions to read_committed consumers, so a mirror restarted after a "
                              "crash would leave duplicates there; this target cannot hold an exactly-once copy: "
                              "set exactly.once.support=disabled (at-least-once)")

