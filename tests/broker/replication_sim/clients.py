"""An acks=all producer and a read_uncommitted consumer.

Both find partition leaders in the metadata images the controller pushes
(and that they pull now and then), as a Kafka client refreshes its metadata;
a client cut off from the controller keeps sending to a stale leader, which
answers NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from quorum.metadata import MetadataImage
from storage.batch import build_batch

from replication_sim.broker import TOPIC
from replication_sim.network import Node

if TYPE_CHECKING:
    from replication_sim.cluster import SimCluster

PRODUCE_TIMEOUT_MS = 400
METADATA_PULL_MS = 100
CONSUME_EVERY_MS = 30


class Client(Node):
    def __init__(self, name: str, cluster: SimCluster) -> None:
        super().__init__(name)
        self.cluster = cluster
        self.image = MetadataImage()
        cluster.controller.subscribers.append((self, self.on_image))
        cluster.every(METADATA_PULL_MS, self._pull)

    def on_image(self, image: MetadataImage) -> None:
        if image.offset > self.image.offset:
            self.image = image

    def _pull(self) -> None:
        controller = self.cluster.controller
        self.cluster.network.call(self, controller, controller.serve_metadata(),
                                  lambda image: image is not None and self.on_image(image), 100)

    def leader(self, p: int):
        topic = self.image.topic(TOPIC)
        registration = None if topic is None else topic.partitions.get(p)
        if registration is None or registration.leader < 0:
            return None
        return self.cluster.brokers[registration.leader]


class Producer(Client):
    def __init__(self, cluster: SimCluster) -> None:
        super().__init__("producer", cluster)
        self.sequence = 0
        self.acked = 0
        self.errors: dict[int, int] = {}

    def produce(self, p: int) -> None:
        leader = self.leader(p)
        if leader is None:
            return
        count = self.cluster.rng.randint(1, 3)
        values = [f"{p}:{self.sequence + i}".encode() for i in range(count)]
        self.sequence += count
        now = self.cluster.loop.now_ms
        batch = build_batch([(None, v, (), now) for v in values])

        def on_reply(response) -> None:
            if response is None:
                self.errors[-1] = self.errors.get(-1, 0) + 1
                return
            error, _base = response
            if error == ErrorCode.none:
                self.acked += count
            else:
                self.errors[int(error)] = self.errors.get(int(error), 0) + 1

        self.cluster.network.call(self, leader,
                                  lambda reply: leader.handle_produce(p, batch, values, PRODUCE_TIMEOUT_MS, reply),
                                  on_reply, PRODUCE_TIMEOUT_MS + 100)


class Consumer(Client):
    """Reads every partition from its position up to the HW; checks that what
    it gets starts at its position, is consecutive, and stays below the HW."""

    def __init__(self, cluster: SimCluster, partitions: int) -> None:
        super().__init__("consumer", cluster)
        self.positions = [0] * partitions
        self.consumed = 0
        self._in_flight = [False] * partitions
        for p in range(partitions):
            cluster.every(CONSUME_EVERY_MS, lambda p=p: self.poll(p))

    def poll(self, p: int) -> None:
        leader = self.leader(p)
        if leader is None or self._in_flight[p]:
            return
        self._in_flight[p] = True
        position = self.positions[p]

        def on_reply(response) -> None:
            self._in_flight[p] = False
            if response is None:
                return
            error, hw, records = response
            if position != self.positions[p]:
                return
            if error == ErrorCode.offset_out_of_range:
                # Past the leader's log end: records this consumer read were
                # lost (the invariants decide whether that was allowed).
                # Start again at the HW, as auto.offset.reset=latest does.
                self.positions[p] = hw
                return
            if error != ErrorCode.none:
                return
            # A fetch returns whole batches: skip what precedes the position.
            records = [(offset, value) for offset, value in records if offset >= position]
            for expected, (offset, value) in enumerate(records, start=position):
                if offset != expected:
                    self.cluster.invariants.fail(f"consumer expected {p}/{expected}, got {offset}")
                self.cluster.invariants.on_consume(p, offset, value, hw)
            self.positions[p] = position + len(records)
            self.consumed += len(records)

        self.cluster.network.call(self, leader, lambda reply: leader.handle_consumer_fetch(p, position, reply),
                                  on_reply, 150)
