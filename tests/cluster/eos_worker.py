"""A consume-transform-produce loop with exactly-once semantics, as its own
process so that a test can SIGKILL it anywhere.

    python eos_worker.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID MAX_RECORDS

The loop is what a Kafka Streams task does under exactly_once_v2, with
confluent-kafka: a transactional producer (init_transactions fences any
earlier process with the same transactional id and aborts what it left
open), a read_committed consumer in GROUP with manual offsets and a static
member id (a restart takes the old member's place without a rebalance
wait), and per poll of at most MAX_RECORDS records one transaction: each
input record's value v becomes b"out-" + v on the same partition of
OUT_TOPIC, the consumed positions are sent to the transaction with the
consumer's group metadata (KIP-447), and the transaction is committed.

An error the transaction can recover from by aborting (librdkafka's
txn_requires_abort) aborts it and rewinds the consumer to the group's
committed offsets; a retriable one retries the call; anything else ends
the process with status 1 (the test restarts it, as a supervisor would).
Reports are lines on stdout:

    ready                      producer and consumer set up
    committed <sum>            a commit; <sum> is the total of the committed offsets
    aborted <reason>           a transaction aborted and the consumer rewound
    done                       every partition's position reached its end offset
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def retrying(call, *args):
    """`call(*args)`, again while librdkafka calls its error retriable."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return call(*args)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main(bootstrap: str, in_topic: str, out_topic: str, group: str, transactional_id: str, max_records: int) -> None:
    # RAFTKA_EOS_DEBUG=eos,cgrp,...: librdkafka's debug contexts, on stderr (the worker log).
    debug = {"debug": os.environ["RAFTKA_EOS_DEBUG"]} if os.environ.get("RAFTKA_EOS_DEBUG") else {}
    producer = Producer({**debug, "bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
                         "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    retrying(producer.init_transactions, 60)
    consumer = Consumer({**debug, "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": transactional_id,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
                         "heartbeat.interval.ms": 500, "enable.partition.eof": False})
    consumer.subscribe([in_topic])
    partitions = len(consumer.list_topics(in_topic, timeout=30).topics[in_topic].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(in_topic, p), timeout=30)[1] for p in range(partitions)}
    say("ready")
    # Where each partition stands: the group's committed offsets once the
    # assignment is whole, then the positions of each commit. (librdkafka
    # reports no position for a partition it has fetched nothing from, such
    # as one already consumed to its end by an earlier run.)
    known: dict[int, int] | None = None
    while True:
        messages = consumer.consume(num_messages=max_records, timeout=0.3)
        for m in messages:
            if m.error() is not None:
                raise KafkaException(m.error())
        assignment = consumer.assignment()
        if known is None and len(assignment) == partitions:
            known = {tp.partition: max(tp.offset, 0) for tp in consumer.committed(assignment, timeout=30)}
        if messages:
            try:
                producer.begin_transaction()
                for m in messages:
                    while True:
                        try:
                            producer.produce(out_topic, key=m.key(), value=b"out-" + m.value(), partition=m.partition())
                            break
                        except BufferError:
                            producer.poll(0.05)
                positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
                retrying(producer.send_offsets_to_transaction, positions, consumer.consumer_group_metadata(), 30)
                retrying(producer.commit_transaction, 60)
            except KafkaException as exc:
                error = exc.args[0]
                if not error.txn_requires_abort():
                    raise
                retrying(producer.abort_transaction, 60)
                # What was read since the last commit is read again.
                for tp in consumer.committed(consumer.assignment(), timeout=30):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
                say(f"aborted {error.name()}")
                continue
            if known is not None:
                known.update({tp.partition: tp.offset for tp in positions})
                say(f"committed {sum(known.values())}")
        elif known is not None and all(known[p] >= end for p, end in ends.items()):
            say("done")
            consumer.close()
            return


if __name__ == "__main__":
    bootstrap, in_topic, out_topic, group, transactional_id, max_records = sys.argv[1:7]
    main(bootstrap, in_topic, out_topic, group, transactional_id, int(max_records))
