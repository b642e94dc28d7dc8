"""A consumer-protocol (KIP-848) librdkafka member run as its own process,
so a test can SIGKILL it. Prints `assigned <partitions>` when its
assignment changes and `record <partition> <offset>` per record; commits
every record it consumed synchronously before printing it."""

import sys

from confluent_kafka import Consumer


def main() -> None:
    bootstrap, group, topic, name = sys.argv[1:5]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                         "group.protocol": "consumer", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    last = None
    while True:
        msg = consumer.poll(0.05)
        owned = sorted(tp.partition for tp in consumer.assignment())
        if owned != last:
            print("assigned", ",".join(map(str, owned)), flush=True)
            last = owned
        if msg is not None and msg.error() is None:
            consumer.commit(message=msg, asynchronous=False)
            print("record", msg.partition(), msg.offset(), flush=True)


if __name__ == "__main__":
    main()
