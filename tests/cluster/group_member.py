"""One consumer group member as its own process, for tests that kill members.

    python group_member.py CLIENT BOOTSTRAP GROUP TOPIC NAME [SESSION_MS HEARTBEAT_MS]

CLIENT is confluent-kafka, kafka-python or aiokafka. The member subscribes
to TOPIC in GROUP with manual commits, and loops: take at most 50 records,
report each, and every COMMIT_INTERVAL_S commit the next offsets of the
partitions it read since the last commit (synchronously), reporting the
commit if it succeeded. So at any moment the records read since the last
commit form the member's uncommitted window, which a member that takes its
partitions over reads again. A rebalance (partitions revoked, lost or
assigned) forgets the offsets not yet committed: they were positions of
an assignment that is over, and committing them later would skip records
(the consumer restarts from the committed offsets). Consumer errors are reported too. SIGTERM ends the loop
and closes the consumer (a dynamic member leaves the group); SIGKILL is
the test's other way to end it. Reports are JSON lines on stdout:

    {"ev": "assigned", "partitions": [0, 3]}      whenever the assignment changes
    {"ev": "records", "records": [[p, offset, value], ...]}
    {"ev": "committed", "offsets": {"p": next_offset, ...}}
    {"ev": "commit_failed", "error": "..."}
    {"ev": "error", "error": "...", "fatal": false}   (confluent-kafka)
    {"ev": "closed"}
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

MAX_RECORDS = 50
#: GROUP_MEMBER_INSTANCE_ID in the environment: the confluent-kafka member's group.instance.id.
INSTANCE_ID = os.environ.get("GROUP_MEMBER_INSTANCE_ID")
COMMIT_INTERVAL_S = 0.3


def say(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Reporter:
    def __init__(self) -> None:
        self.assigned: list[int] | None = None
        self.pending: dict = {}
        self.last_commit = time.monotonic()

    def rebalanced(self, *_args) -> None:
        self.pending = {}

    def read(self, key, next_offset: int) -> dict | None:
        """Note a read; the offsets to commit now, if it is time."""
        self.pending[key] = next_offset
        if time.monotonic() - self.last_commit < COMMIT_INTERVAL_S:
            return None
        due, self.pending = self.pending, {}
        self.last_commit = time.monotonic()
        return due

    def assignment(self, partitions) -> None:
        current = sorted(partitions)
        if current != self.assigned:
            self.assigned = current
            say(ev="assigned", partitions=current)


def run_confluent(bootstrap, group, topic, name, session_ms, heartbeat_ms, stopping) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": session_ms, "heartbeat.interval.ms": heartbeat_ms,
                         # A static member (KIP-345) when the test names its instance.
                         **({"group.instance.id": INSTANCE_ID} if INSTANCE_ID else {})})
    reporter = Reporter()
    consumer.subscribe([topic], on_assign=reporter.rebalanced, on_revoke=reporter.rebalanced,
                       on_lost=reporter.rebalanced)
    try:
        while not stopping():
            messages = consumer.consume(num_messages=MAX_RECORDS, timeout=0.1)
            reporter.assignment(tp.partition for tp in consumer.assignment())
            for m in messages:
                if m.error() is not None:
                    say(ev="error", error=str(m.error()), fatal=m.error().fatal())
            records = [m for m in messages if m.error() is None]
            if not records:
                continue
            say(ev="records", records=[[m.partition(), m.offset(), m.value().decode()] for m in records])
            offsets = None
            for m in records:
                offsets = reporter.read(m.partition(), m.offset() + 1) or offsets
            if not offsets:
                continue
            try:
                consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                                asynchronous=False)
                say(ev="committed", offsets=offsets)
            except KafkaException as exc:
                say(ev="commit_failed", error=str(exc))
    finally:
        consumer.close()


def run_kafka_python(bootstrap, group, topic, name, session_ms, heartbeat_ms, stopping) -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    from kafka import ConsumerRebalanceListener

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id=name,
                             enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=session_ms,
                             heartbeat_interval_ms=heartbeat_ms, max_poll_records=MAX_RECORDS)
    reporter = Reporter()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked) -> None:
            reporter.rebalanced()

        def on_partitions_assigned(self, assigned) -> None:
            reporter.rebalanced()

    consumer.subscribe([topic], listener=Listener())
    try:
        while not stopping():
            polled = consumer.poll(timeout_ms=100)
            reporter.assignment(tp.partition for tp in consumer.assignment())
            records = [m for batch in polled.values() for m in batch]
            if not records:
                continue
            say(ev="records", records=[[m.partition, m.offset, m.value.decode()] for m in records])
            offsets = None
            for tp, batch in polled.items():
                offsets = reporter.read(tp, batch[-1].offset + 1) or offsets
            if not offsets:
                continue
            try:
                consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
                say(ev="committed", offsets={tp.partition: o for tp, o in offsets.items()})
            except KafkaError as exc:
                say(ev="commit_failed", error=repr(exc))
    finally:
        consumer.close()


def run_aiokafka(bootstrap, group, topic, name, session_ms, heartbeat_ms, stopping) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    reporter = Reporter()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked) -> None:
            reporter.rebalanced()

        async def on_partitions_assigned(self, assigned) -> None:
            reporter.rebalanced()

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, client_id=name,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_ms)
        consumer.subscribe([topic], listener=Listener())
        await consumer.start()
        try:
            while not stopping():
                polled = await consumer.getmany(timeout_ms=100, max_records=MAX_RECORDS)
                reporter.assignment(tp.partition for tp in consumer.assignment())
                records = [m for batch in polled.values() for m in batch]
                if not records:
                    continue
                say(ev="records", records=[[m.partition, m.offset, m.value.decode()] for m in records])
                offsets = None
                for tp, batch in polled.items():
                    offsets = reporter.read(tp, batch[-1].offset + 1) or offsets
                if not offsets:
                    continue
                try:
                    await consumer.commit(offsets)
                    say(ev="committed", offsets={tp.partition: o for tp, o in offsets.items()})
                except KafkaError as exc:
                    say(ev="commit_failed", error=repr(exc))
        finally:
            await consumer.stop()

    asyncio.run(main())


CLIENTS = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


def main(argv: list[str]) -> None:
    client, bootstrap, group, topic, name = argv[:5]
    session_ms = int(argv[5]) if len(argv) > 5 else 6000
    heartbeat_ms = int(argv[6]) if len(argv) > 6 else 500
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic()))
    CLIENTS[client](bootstrap, group, topic, name, session_ms, heartbeat_ms, lambda: bool(stop))
    say(ev="closed")


if __name__ == "__main__":
    main(sys.argv[1:])
