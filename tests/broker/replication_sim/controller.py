"""The controller: the real `QuorumController` decisions over a `MetadataImage`.

It stands for an active controller whose quorum never fails (the quorum
has its own simulation in tests/quorum): a decision's records are
committed as soon as they are made. Every new image is pushed to the
subscribers (brokers, clients) over the network, and they also pull the
latest one now and then, so a node cut off from the controller keeps a
stale image until the cut heals, as a broker that cannot reach the quorum
does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig, QuorumController
from quorum.metadata import LoggedRecord, MetadataImage

from replication_sim.network import EventLoop, Node, SimNetwork

CONTROLLER = "controller"
TICK_MS = 20


class SimController(Node):
    def __init__(self, loop: EventLoop, network: SimNetwork, config: ControllerConfig, seed: int) -> None:
        super().__init__(CONTROLLER)
        self.loop = loop
        self.network = network
        self.image = MetadataImage()
        self.controller = QuorumController(self.image, 0, config, random.Random(seed))
        #: Nodes to push images to, with their handler.
        self.subscribers: list[tuple[Node, Callable[[MetadataImage], None]]] = []
        self.on_image: Callable[[MetadataImage], None] = lambda image: None
        loop.after(TICK_MS, self._tick)

    # --- the driver loop of an active controller ------------------------------

    def decide(self, request: Any) -> Any:
        result = self.controller.handle(request, self.image, self.loop.now_ms)
        base = self._append(result.records) if result.records else None
        return result.respond(base)

    def _append(self, records) -> int:
        base = self.image.offset + 1
        self.image = self.image.apply([LoggedRecord(base + i, 1, r) for i, r in enumerate(records)])
        self.on_image(self.image)
        for node, handler in self.subscribers:
            self._push(node, handler)
        return base

    def _tick(self) -> None:
        records = self.controller.tick(self.image, self.loop.now_ms)
        if records:
            self._append(records)
        self.loop.after(TICK_MS, self._tick)

    def _push(self, node: Node, handler: Callable[[MetadataImage], None]) -> None:
        image = self.image
        life = node.incarnation

        def arrive() -> None:
            if node.alive and node.incarnation == life:
                handler(image)

        self.network.send(self.name, node.name, arrive)

    # --- what nodes call over the network ----------------------------------------

    def serve(self, request: Any) -> Callable[[Callable[[Any], None]], None]:
        """A handler for `SimNetwork.call`: decide `request` on arrival."""
        return lambda reply: reply(self.decide(request))

    def serve_metadata(self) -> Callable[[Callable[[Any], None]], None]:
        return lambda reply: reply(self.image)

    # --- setup ------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, replicas: list[list[int]], configs: dict[str, str]) -> None:
        """Create the topic (an admin request arriving at the controller), retried
        until every broker named has registered."""
        topic = ct_req.CreatableTopic(
            name=name, num_partitions=-1, replication_factor=-1,
            assignments=tuple(ct_req.CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(r))
                              for i, r in enumerate(replicas[:partitions])),
            configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()))
        response = self.decide(ct_req.CreateTopicsRequest(topics=(topic,), validate_only=False))
        error = response.topics[0].error_code
        if error == ErrorCode.invalid_replica_assignment:
            self.loop.after(20, lambda: self.create_topic(name, partitions, replicas, configs))
            return
        assert error == ErrorCode.none, response
