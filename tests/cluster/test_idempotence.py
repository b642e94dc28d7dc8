"""The idempotent producer: a lost Produce response makes the client retry,
and the partition still holds each record once, at the offset the client
was told.

A `raftka dev` node advertises a proxy's address, so every client
connection goes through the proxy: a thread per direction forwards bytes
as they come, splitting them into Kafka frames only to see which responses
answer Produce requests (the correlation id), and drops the first Produce
response of the run. The client times its request out, retries the batch
with the same producer id, epoch and sequence, and the broker answers that
duplicate with the offset the batch got the first time.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from cluster_group_testing import DevNode
from common.wire.ports import free_ports

PRODUCE = 0
RECORDS = 30
REQUEST_TIMEOUT_MS = 2000


class DropFirstProduceResponse:
    """A TCP proxy to `target` that drops the first Produce response it
    sees after `arm()`."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.armed = False
        self.produce_requests = 0
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        with self.lock:
            self.armed = True
            self.produce_requests = self.dropped = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            produce_ids: set[int] = set()
            threading.Thread(target=self._requests, args=(client, upstream, produce_ids), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, produce_ids), daemon=True).start()

    def _requests(self, source: socket.socket, sink: socket.socket, produce_ids: set[int]) -> None:
        for frame in _frames(source, sink):
            api_key, _version, correlation_id = struct.unpack_from(">hhi", frame, 4)
            if api_key == PRODUCE:
                with self.lock:
                    self.produce_requests += 1
                    produce_ids.add(correlation_id)
            if not _send(sink, frame):
                return

    def _responses(self, source: socket.socket, sink: socket.socket, produce_ids: set[int]) -> None:
        for frame in _frames(source, sink):
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            with self.lock:
                drop = self.armed and correlation_id in produce_ids
                if drop:
                    self.armed = False
                    self.dropped += 1
            if not drop and not _send(sink, frame):
                return

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self.listener.close()


def _send(sink: socket.socket, frame: bytes) -> bool:
    """Forward `frame`; False once the other side has gone away (leaving
    the loop closes the generator, whose `finally` shuts both sockets)."""
    try:
        sink.sendall(frame)
    except OSError:
        return False
    return True


def _frames(source: socket.socket, other: socket.socket):
    """Complete frames (size prefix included) read from `source`; closes
    both sockets when either side goes away."""
    buffer = b""
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                return
            buffer += chunk
            while len(buffer) >= 4:
                size = struct.unpack_from(">i", buffer)[0] + 4
                if len(buffer) < size:
                    break
                frame, buffer = buffer[:size], buffer[size:]
                yield frame
    except OSError:
        return
    finally:
        for s in (source, other):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="module")
def proxied_node(tmp_path_factory):
    broker_port, proxy_port, controller_port = free_ports(3)
    node = DevNode(tmp_path_factory.mktemp("idempotence") / "dev",
                   f"advertised.listeners=PLAINTEXT://127.0.0.1:{proxy_port}", port=broker_port,
                   controller_port=controller_port)
    proxy = DropFirstProduceResponse(proxy_port, ("127.0.0.1", broker_port))
    try:
        yield proxy, f"127.0.0.1:{proxy_port}"
    finally:
        proxy.close()
        node.stop()


def produce_confluent(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    from confluent_kafka import Producer

    offsets, errors = [], []
    # librdkafka times Produce requests out by socket.timeout.ms (request.timeout.ms is the broker's).
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "socket.timeout.ms": REQUEST_TIMEOUT_MS, "linger.ms": 50})
    for v in values:
        producer.produce(topic, value=v, partition=0,
                         on_delivery=lambda err, msg: (errors if err else offsets).append(err or msg.offset()))
    assert producer.flush(60) == 0
    assert not errors, errors
    return offsets


def produce_kafka_python(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             request_timeout_ms=REQUEST_TIMEOUT_MS, linger_ms=50)
    try:
        futures = [producer.send(topic, value=v, partition=0) for v in values]
        producer.flush(60)
        return [f.get(30).offset for f in futures]
    finally:
        producer.close(5)


def produce_aiokafka(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    from aiokafka import AIOKafkaProducer

    async def produce() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                    request_timeout_ms=REQUEST_TIMEOUT_MS, linger_ms=50)
        await producer.start()
        try:
            futures = [await producer.send(topic, value=v, partition=0) for v in values]
            return [(await f).offset for f in futures]
        finally:
            await producer.stop()

    return asyncio.run(produce())


PRODUCERS = {"confluent-kafka": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka}


def read_partition(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "idempotence-check",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[tuple[int, bytes]] = []
        empty_polls = 0
        while empty_polls < 10:
            messages = consumer.consume(num_messages=1000, timeout=0.2)
            out += [(m.offset(), m.value()) for m in messages if m.error() is None]
            empty_polls = empty_polls + 1 if not messages and len(out) >= count else 0
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("client", list(PRODUCERS))
def test_a_lost_produce_response_is_retried_and_the_record_stored_once(proxied_node, client) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    proxy, bootstrap = proxied_node
    topic = f"idempotent-{client}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(60)
    values = [f"{client}-{i}".encode() for i in range(RECORDS)]
    proxy.arm()
    offsets = PRODUCERS[client](bootstrap, topic, values)
    assert proxy.dropped == 1 and proxy.produce_requests >= 2, "the client never had to retry"
    stored = read_partition(bootstrap, topic, RECORDS)
    assert [v for _o, v in stored] == values  # each record once, in order
    assert [o for o, _v in stored] == offsets  # where the client was told it is
