"""The `queue` workload: real confluent-kafka clients, every operation in the history.

- Producers (acks=all), each in a thread of its own, send unique values
  (`<process>-<n>`) round-robin to the topic's partitions at a steady rate:
  `p-idem-<i>` with enable.idempotence, and one `p-plain` without it
  (retries may then write a value twice, which the checker allows and
  reports apart; and when a partition's leader moves, a send retried on the
  new leader may land after a later one, so only the idempotent producers
  are checked for order).
- Consumers poll concurrently: `c-group` subscribes in a consumer group
  (each assignment starts a new session in the history), `c-assign` is
  assigned every partition from the beginning.
- The `group` workload has the same producers and, instead of those two,
  `group_members` consumers `c-group-<i>` in one group, with auto-commit,
  speaking the classic group protocol or KIP-848's consumer protocol
  (`group_protocol`); the last member leaves and joins again every
  `member_rejoin_s`, so partitions move between members under the faults.
  Its history says so (`at_least_once` in their open
  events): the checker then requires every acknowledged value to be polled
  by some member (at-least-once delivery through rebalances, coordinator
  moves and member fencing).
- `final_read`, after the nemesis healed everything, reads every partition
  from its start to its high watermark with a fresh consumer.

A send's completion is `ok` with the acknowledged offset, or `info` (a
timeout or any error after the record may have left: the checker allows it
in or out), or `fail` only where the client says it never sent it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

from chaos.history import HistoryWriter

#: Errors after which the record certainly is not in the log.
_NEVER_SENT = {"_PURGE_QUEUE", "MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "INVALID_RECORD"}


#: Longer than a fault and the recovery after it: when librdkafka's idempotent
#: producer times a message out it bumps its epoch and sends the messages after it
#: again under the new one, duplicating those an earlier request had written.
MESSAGE_TIMEOUT_MS = 60000


#: How long each incarnation of the migrating group member of group_protocol=mixed lives.
MIGRATION_PERIOD_S = 15.0
#: session.timeout.ms of the classic group members.
CLASSIC_SESSION_TIMEOUT_MS = 10000


@dataclasses.dataclass
class QueueOptions:
    bootstrap: str
    topic: str = "chaos"
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    idempotent_producers: int = 2
    plain_producers: int = 1
    rate_per_producer: float = 40.0  # sends per second
    message_timeout_ms: int = MESSAGE_TIMEOUT_MS
    group_id: str = "chaos"
    #: The group protocol of the group consumers: classic, consumer (KIP-848), or (queue
    #: workload) mixed: `c-group` classic next to a member that restarts every
    #: MIGRATION_PERIOD_S seconds with the other protocol (`c-group-m<k>`), so the group
    #: upgrades and downgrades online again and again under the faults. mixed-static: the
    #: same with group.instance.id set (`c-group` and `c-group-m` for every incarnation), so
    #: the consumer-protocol incarnation's place is taken by the classic one (static member
    #: replacement) rather than left.
    group_protocol: str = "classic"
    #: Group members; more than one makes the `group` workload (module doc).
    group_members: int = 1
    #: In the `group` workload, the seconds between the last member's leaving
    #: the group and joining it again (0: it stays).
    member_rejoin_s: float = 0.0
    #: librdkafka's security keys (security.protocol, sasl.*, ssl.ca.location) for every client; empty: PLAINTEXT.
    security: dict[str, str] = dataclasses.field(default_factory=dict)

    def client(self) -> dict[str, str]:
        """librdkafka's keys to reach the cluster: bootstrap.servers and the security ones."""
        return {"bootstrap.servers": self.bootstrap, **self.security}

    def kafka_python(self) -> dict[str, Any]:
        """The same for kafka-python."""
        sec = self.security
        out: dict[str, Any] = {"bootstrap_servers": self.bootstrap.split(",")}
        if sec:
            out["security_protocol"] = sec["security.protocol"]
            out["ssl_cafile"] = sec.get("ssl.ca.location")
            if "sasl.mechanism" in sec:
                out.update(sasl_mechanism=sec["sasl.mechanism"], sasl_plain_username=sec["sasl.username"],
                           sasl_plain_password=sec["sasl.password"])
        return out


def client_logger(path: str) -> logging.Logger:
    """librdkafka's own log lines go to a file, not the terminal."""
    logger = logging.getLogger(f"chaos.clients.{path}")
    logger.propagate = False
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger


def create_topic(options: QueueOptions, log_path: str, timeout_s: float = 60.0) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(options.client(), logger=client_logger(log_path))
    config = {"min.insync.replicas": str(options.min_insync_replicas)}
    new = NewTopic(options.topic, options.partitions, options.replication_factor, config=config)
    admin.create_topics([new], operation_timeout=timeout_s)[options.topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(options.topic, timeout=10).topics[options.topic]
        if meta.error is None and len(meta.partitions) == options.partitions and all(
                p.leader >= 0 for p in meta.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {options.topic} has no leader for every partition after {timeout_s} s")
        time.sleep(0.2)


class PartitionLeaders:
    """Who leads each partition, from a Metadata request at the moment of asking."""

    def __init__(self, options: QueueOptions, log_path: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.topic = options.topic
        self.admin = AdminClient({**options.client(), "socket.timeout.ms": 3000},
                                 logger=client_logger(log_path))

    def leader_of(self, partition: int) -> int | None:
        try:
            meta = self.admin.list_topics(self.topic, timeout=3).topics[self.topic]
            leader = meta.partitions[partition].leader
            return leader if leader >= 0 else None
        except Exception:
            return None


class QueueWorkload:
    def __init__(self, options: QueueOptions, history: HistoryWriter, log_path: str) -> None:
        self.options = options
        self.history = history
        self.log_path = log_path
        self.stop_producers = threading.Event()
        self.stop_consumers = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    # --- threads --------------------------------------------------------------------------------

    def start(self) -> None:
        names = [(f"p-idem-{i}", True) for i in range(self.options.idempotent_producers)]
        names += [("p-plain" if i == 0 else f"p-plain-{i}", False) for i in range(self.options.plain_producers)]
        for name, idempotent in names:
            self._spawn(self._produce, name, idempotent)
        o = self.options
        if o.group_members > 1:
            for name in self.consumer_names():
                self._spawn(self._group_member, name)
            return
        mixed = o.group_protocol in ("mixed", "mixed-static")
        static = o.group_protocol == "mixed-static"
        self._spawn(self._consume, "c-group", True, "read_uncommitted",
                    "classic" if mixed else o.group_protocol, None, "c-group" if static else None)
        if mixed:
            self._spawn(self._migrating_member, "c-group-m", "c-group-m" if static else None)
        self._spawn(self._consume, "c-assign", False)

    def consumer_names(self) -> list[str]:
        if self.options.group_members > 1:
            return [f"c-group-{i}" for i in range(self.options.group_members)]
        return ["c-group", "c-assign"]

    def _group_member(self, name: str) -> None:
        """A member of the `group` workload's group; the last one leaves the group
        and joins again every `member_rejoin_s`, so partitions move between members
        while the faults go on."""
        o = self.options
        rejoins = o.member_rejoin_s > 0 and name == f"c-group-{o.group_members - 1}"
        session = [0]
        while not self.stop_consumers.is_set():
            self._consume(name, True, "read_uncommitted", o.group_protocol, o.member_rejoin_s if rejoins else None,
                          session=session)
            if self.stop_consumers.is_set():
                break
            self.history.record(name, "info", "leave", session=session[0])
            self.stop_consumers.wait(1.0)

    def _migrating_member(self, name: str, instance_id: str | None = None) -> None:
        """A group member restarted with the other protocol every MIGRATION_PERIOD_S:
        each restart converts the group (classic <-> consumer protocol) while the other
        member keeps consuming. Each incarnation is its own process in the history."""
        k = 0
        while not self.stop_consumers.is_set():
            protocol = "consumer" if k % 2 == 0 else "classic"
            if instance_id is not None and k > 0 and protocol == "consumer":
                # A classic static member closes without leaving; its instance id is
                # free for a consumer-protocol member once its session expired (before,
                # Kafka and raftka answer UNRELEASED_INSTANCE_ID, fatal to librdkafka).
                if self.stop_consumers.wait(CLASSIC_SESSION_TIMEOUT_MS / 1000 + 2):
                    break
            self._consume(f"{name}{k}", True, "read_uncommitted", protocol, MIGRATION_PERIOD_S, instance_id)
            k += 1

    def _spawn(self, target: Any, *args: Any) -> None:
        def guarded() -> None:
            try:
                target(*args)
            except Exception as exc:  # a client thread's crash is a harness failure, kept for the report
                self.errors.append(f"{args[0]}: {type(exc).__name__}: {exc}")
                self.history.record(str(args[0]), "info", "error", extra={"error": repr(exc)})

        thread = threading.Thread(target=guarded, name=str(args[0]), daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self, drain_s: float = 15.0) -> None:
        """Stop sending, wait for the outstanding acknowledgements, then stop the consumers
        once they have had `drain_s` seconds at most to catch up."""
        self.stop_producers.set()
        producers = [t for t in self.threads if t.name.startswith("p-")]
        for t in producers:
            t.join(timeout=self.options.message_timeout_ms / 1000 + 30)  # their flush waits out the timeout
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and not self._consumers_caught_up():
            time.sleep(0.2)
        self.stop_consumers.set()
        for t in self.threads:
            t.join(timeout=30)

    def _consumers_caught_up(self) -> bool:
        """Every acknowledged value polled: by each consumer, or, in the
        `group` workload, by some member of the group."""
        events = self.history.snapshot()
        acked = {e.value for e in events if e.f == "send" and e.type == "ok"}
        members = self.options.group_members > 1
        by: dict[str, set[str | None]] = {("group" if members else name): set() for name in self.consumer_names()}
        for e in events:
            # The members of the group together (more than one with group_protocol=mixed);
            # in the `group` workload, all of its members.
            if e.f != "poll" or e.process is None:
                continue
            key = "group" if members else ("c-group" if e.process.startswith("c-group") else e.process)
            if key in by:
                by[key].add(e.value)
        return all(acked <= seen for seen in by.values())

    # --- producers ---------------------------------------------------------------------------------

    def _produce(self, name: str, idempotent: bool) -> None:
        from confluent_kafka import KafkaException, Producer

        o = self.options
        config: dict[str, Any] = {
            **o.client(), "acks": "all", "enable.idempotence": idempotent,
            "linger.ms": 2, "message.timeout.ms": o.message_timeout_ms, "request.timeout.ms": 4000,
            "retry.backoff.ms": 100, "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 2000, "client.id": name,
        }
        if idempotent:
            # librdkafka's idempotence log (producer ids, epoch bumps, drains) goes to
            # clients.log: the evidence when a duplicate is found.
            config["debug"] = os.environ.get("RAFTKA_CHAOS_CLIENT_DEBUG", "eos")
        else:
            config["max.in.flight.requests.per.connection"] = 1
        producer = Producer(config, logger=client_logger(self.log_path))
        self.history.record(name, "info", "open", extra={"role": "producer", "idempotent": idempotent,
                                                          "ordered": idempotent})

        def delivered(err: Any, msg: Any) -> None:
            value = msg.value().decode()
            if err is None:
                self.history.record(name, "ok", "send", partition=msg.partition(), value=value,
                                    offset=msg.offset())
            else:
                kind = "fail" if err.name() in _NEVER_SENT else "info"
                self.history.record(name, kind, "send", partition=msg.partition(), value=value,
                                    extra={"error": err.name(), "message": err.str()})

        interval = 1.0 / o.rate_per_producer
        n = 0
        next_at = time.monotonic()
        while not self.stop_producers.is_set():
            if len(producer) > 1000:
                producer.poll(0.05)
                continue
            partition = n % o.partitions
            value = f"{name}-{n}"
            n += 1
            self.history.record(name, "invoke", "send", partition=partition, value=value)
            try:
                producer.produce(o.topic, value=value.encode(), partition=partition, on_delivery=delivered)
            except BufferError as exc:
                self.history.record(name, "fail", "send", partition=partition, value=value,
                                    extra={"error": "BufferError", "message": str(exc)})
            except KafkaException as exc:
                # produce() refused it (e.g. the partition is unknown just now): never enqueued.
                self.history.record(name, "fail", "send", partition=partition, value=value,
                                    extra={"error": exc.args[0].name() if exc.args else repr(exc),
                                           "message": str(exc)})
            # poll() returns as soon as it served a callback: keep polling until the
            # next send is due, and never make up for a stall with a burst.
            next_at = max(next_at + interval, time.monotonic() - interval)
            while (left := next_at - time.monotonic()) > 0:
                producer.poll(left)
        remaining = producer.flush(o.message_timeout_ms / 1000 + 10)
        if remaining:
            self.history.record(name, "info", "error", extra={"error": f"{remaining} sends unacknowledged at the end"})

    # --- consumers --------------------------------------------------------------------------------

    def _consume(self, name: str, group: bool, isolation: str = "read_uncommitted", protocol: str = "classic",
                 lifetime_s: float | None = None, instance_id: str | None = None,
                 session: list[int] | None = None) -> None:
        """One consumer until the consumers stop or `lifetime_s` passes. `session` counts its
        assignments in the history; a member that comes back passes its count on, so a
        process's sessions keep rising."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        o = self.options
        config = {**o.client(), "group.id": o.group_id if group else f"{o.group_id}-{name}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": group, "auto.commit.interval.ms": 1000,
                  "session.timeout.ms": CLASSIC_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 1000, "client.id": name,
                  "topic.metadata.refresh.interval.ms": 2000, "reconnect.backoff.max.ms": 1000,
                  "isolation.level": isolation}
        if group and protocol == "consumer":
            # KIP-848: the broker sets the session timeout and heartbeat interval
            # (group.consumer.*) and assigns; librdkafka refuses both keys with this protocol.
            del config["session.timeout.ms"], config["heartbeat.interval.ms"]
            config["group.protocol"] = "consumer"
        if instance_id is not None:
            config["group.instance.id"] = instance_id
        until = float("inf") if lifetime_s is None else time.monotonic() + lifetime_s
        consumer = Consumer(config, logger=client_logger(self.log_path))
        session = [0] if session is None else session
        # The `group` workload's members say `at_least_once`: the checker then
        # requires every acknowledged value polled by some member of the group.
        self.history.record(name, "info", "open", extra={
            "role": "consumer", "group": group, "isolation": isolation, "protocol": protocol,
            "instance_id": instance_id,
            **({"group_id": config["group.id"], "group_protocol": protocol, "at_least_once": o.group_members > 1}
               if group else {})})

        def assigned(_consumer: Any, partitions: list[Any]) -> None:
            session[0] += 1
            self.history.record(name, "info", "assign", session=session[0],
                                extra={"partitions": sorted(p.partition for p in partitions)})

        def revoked(_consumer: Any, partitions: list[Any]) -> None:
            self.history.record(name, "info", "revoke", session=session[0],
                                extra={"partitions": sorted(p.partition for p in partitions)})

        if group:
            consumer.subscribe([o.topic], on_assign=assigned, on_revoke=revoked)
        else:
            consumer.assign([TopicPartition(o.topic, p, OFFSET_BEGINNING) for p in range(o.partitions)])
        try:
            self._poll(consumer, name, session, until)
        finally:
            consumer.close()

    def _poll(self, consumer: Any, name: str, session: list[int], until: float) -> None:
        """Record what `consumer` receives until the consumers stop or `until` (monotonic) passes."""
        last_error = ("", 0.0)
        while not self.stop_consumers.is_set() and time.monotonic() < until:
            for msg in consumer.consume(num_messages=500, timeout=0.3):
                if msg.error() is not None:
                    code = msg.error().name()
                    if code != last_error[0] or time.monotonic() - last_error[1] > 2:
                        self.history.record(name, "info", "error", session=session[0],
                                            extra={"error": code, "message": msg.error().str()})
                        last_error = (code, time.monotonic())
                    continue
                self.history.record(name, "ok", "poll", partition=msg.partition(), offset=msg.offset(),
                                    value=msg.value().decode(), session=session[0])


FINAL_CONFLUENT = "final-confluent"
FINAL_CONFLUENT_COMMITTED = "final-confluent-rc"
FINAL_KAFKA_PYTHON = "final-kafka-python"


def final_read(options: QueueOptions, history: HistoryWriter, log_path: str, timeout_s: float = 60.0,
               isolation: str = "read_uncommitted") -> list[int]:
    """Read every partition from its start to its high watermark with confluent-kafka;
    the partitions not fully read. read_committed waits until no transaction is open
    (the last stable offset reached the high watermark), then reads up to it."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    name = FINAL_CONFLUENT if isolation == "read_uncommitted" else FINAL_CONFLUENT_COMMITTED
    history.record(name, "info", "open", extra={"role": "final", "isolation": isolation})
    committed = isolation == "read_committed"
    # The end is an end-of-partition event, not the last record: the log may end with
    # transaction markers, which no consumer receives.
    consumer = Consumer({**options.client(), "group.id": f"{options.group_id}-{name}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "enable.partition.eof": True, "isolation.level": isolation,
                         "topic.metadata.refresh.interval.ms": 2000}, logger=client_logger(log_path))
    deadline = time.monotonic() + timeout_s
    ranges: dict[int, tuple[int, int]] = {}
    try:
        for p in range(options.partitions):
            tp = TopicPartition(options.topic, p)
            while p not in ranges and time.monotonic() < deadline:
                try:
                    low, high = consumer.get_watermark_offsets(tp, timeout=5)
                    if committed:
                        # ListOffsets answers a read_committed client with the last stable
                        # offset: equal to the high watermark once every transaction ended.
                        high_watermark = _high_watermark(options, p, log_path)
                        if high_watermark is None or high < high_watermark:
                            time.sleep(0.5)
                            continue
                    ranges[p] = (low, high)
                except KafkaException:
                    time.sleep(0.5)
        todo = {p for p, (low, high) in ranges.items() if high > low}
        consumer.assign([TopicPartition(options.topic, p, ranges[p][0]) for p in todo])
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                p = msg.partition()
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ranges[p][1]:
                        todo.discard(p)
                    continue
                history.record(name, "ok", "final-read", partition=p, offset=msg.offset(),
                               value=msg.value().decode())
                if msg.offset() >= ranges[p][1] - 1:
                    todo.discard(p)
        for p, (low, high) in ranges.items():
            if p not in todo:
                history.record(name, "ok", "final-range", partition=p, extra={"low": low, "high": high})
        return sorted(set(range(options.partitions)) - (set(ranges) - todo))
    finally:
        consumer.close()


def _high_watermark(options: QueueOptions, partition: int, log_path: str) -> int | None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**options.client(), "group.id": f"{options.group_id}-hw",
                         "isolation.level": "read_uncommitted"}, logger=client_logger(log_path))
    try:
        return consumer.get_watermark_offsets(TopicPartition(options.topic, partition), timeout=5)[1]
    except KafkaException:
        return None
    finally:
        consumer.close()


def final_read_kafka_python(options: QueueOptions, history: HistoryWriter, timeout_s: float = 60.0) -> list[int]:
    """The same read with kafka-python, a second client library's opinion; the partitions not fully read."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**options.kafka_python(), group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=10000)
    deadline = time.monotonic() + timeout_s
    try:
        tps = [TopicPartition(options.topic, p) for p in range(options.partitions)]
        consumer.assign(tps)
        low = consumer.beginning_offsets(tps)
        high = consumer.end_offsets(tps)
        consumer.seek_to_beginning()
        todo = {tp.partition for tp in tps if high[tp] > low[tp]}
        history.record(FINAL_KAFKA_PYTHON, "info", "open", extra={"role": "final", "isolation": "read_uncommitted"})
        while todo and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=2000).items():
                for r in records:
                    history.record(FINAL_KAFKA_PYTHON, "ok", "final-read", partition=tp.partition, offset=r.offset,
                                   value=r.value.decode())
                    if r.offset >= high[tp] - 1:
                        todo.discard(tp.partition)
            # The log may end with transaction markers: the position passes them, no record does.
            todo = {p for p in todo if consumer.position(tps[p]) < high[tps[p]]}
        for tp in tps:
            if tp.partition not in todo:
                history.record(FINAL_KAFKA_PYTHON, "ok", "final-range", partition=tp.partition,
                               extra={"low": low[tp], "high": high[tp]})
        return sorted(todo)
    finally:
        consumer.close()
