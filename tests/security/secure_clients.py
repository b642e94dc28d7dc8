"""Each client library configured for a security protocol, and a round trip
with it: create a topic (admin), produce, consume it in a consumer group."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time


@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    bootstrap: str
    protocol: str = "PLAINTEXT"
    ca: str | None = None
    cert: str | None = None  # PEM with the private key and the chain
    mechanism: str | None = None
    user: str | None = None
    password: str | None = None

    def confluent(self) -> dict:
        conf = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol}
        if self.ca:
            conf["ssl.ca.location"] = self.ca
        if self.cert:
            conf["ssl.certificate.location"] = self.cert
            conf["ssl.key.location"] = self.cert
        if self.mechanism:
            conf.update({"sasl.mechanism": self.mechanism, "sasl.username": self.user,
                         "sasl.password": self.password})
        return conf

    def kafka_python(self) -> dict:
        conf = {"bootstrap_servers": self.bootstrap, "security_protocol": self.protocol}
        if self.ca:
            conf["ssl_cafile"] = self.ca
        if self.cert:
            conf["ssl_certfile"] = conf["ssl_keyfile"] = self.cert
        if self.mechanism:
            conf.update({"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                         "sasl_plain_password": self.password})
        return conf

    def aiokafka(self) -> dict:
        conf = {"bootstrap_servers": self.bootstrap, "security_protocol": self.protocol}
        if self.ca:
            context = ssl.create_default_context(cafile=self.ca)
            if self.cert:
                context.load_cert_chain(self.cert)
            conf["ssl_context"] = context
        if self.mechanism:
            conf.update({"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                         "sasl_plain_password": self.password})
        return conf


VALUES = [f"record-{i}".encode() for i in range(20)]


def confluent_round_trip(sec: ClientSecurity, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(sec.confluent())
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(60)
    producer = Producer({**sec.confluent(), "linger.ms": 5})
    for value in VALUES:
        producer.produce(topic, value=value)
    assert producer.flush(60) == 0
    consumer = Consumer({**sec.confluent(), "group.id": f"{topic}-group", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < len(VALUES) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                out.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return out


def kafka_python_round_trip(sec: ClientSecurity, topic: str) -> list[bytes]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(**sec.kafka_python())
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(**sec.kafka_python(), linger_ms=5)
    try:
        for future in [producer.send(topic, value=value) for value in VALUES]:
            future.get(30)
    finally:
        producer.close(5)
    consumer = KafkaConsumer(topic, **sec.kafka_python(), group_id=f"{topic}-group", auto_offset_reset="earliest")
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < len(VALUES) and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                out += [m.value for m in messages]
        consumer.commit()
    finally:
        consumer.close()
    return out


def aiokafka_round_trip(sec: ClientSecurity, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run() -> list[bytes]:
        admin = AIOKafkaAdminClient(**sec.aiokafka())
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**sec.aiokafka(), linger_ms=5)
        await producer.start()
        try:
            for future in [await producer.send(topic, value=value) for value in VALUES]:
                await future
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **sec.aiokafka(), group_id=f"{topic}-group",
                                    auto_offset_reset="earliest")
        await consumer.start()
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        try:
            while len(out) < len(VALUES) and time.monotonic() < deadline:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    out += [m.value for m in messages]
            await consumer.commit()
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


ROUND_TRIPS = {
    "confluent-kafka": confluent_round_trip,
    "kafka-python": kafka_python_round_trip,
    "aiokafka": aiokafka_round_trip,
}
