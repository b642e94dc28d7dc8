"""The raftka broker: serves the Kafka protocol and hosts partition replicas.

Public API
----------
- `Broker(config, controller)`: `await nursery.start(broker.run)` serves and
  starts with the bound `raftka.wire.Server`; cancelling `run` shuts down
  cleanly. `on_metadata_update(image, delta=None)` is the one way metadata
  comes in.
- `BrokerConfig`: settings with Kafka's key names (`from_properties`).
- `ControllerChannel`: the one way requests go out to the controller; the
  broker sends each API at `CONTROLLER_VERSIONS[api_key]`.
- `LocalController`: an in-process ControllerChannel and metadata source
  over the real `quorum.controller.QuorumController` (tests, `python -m broker`).

Wiring the broker to the quorum (pending, for the integrator)
--------------------------------------------------------------
1. Start `broker.run`; register with the active controller
   (BrokerRegistration v4) using the bound port, heartbeat every
   `broker.heartbeat.interval.ms`; on SIGTERM do the controlled shutdown
   (heartbeats with want_shut_down) before cancelling `run`.
2. As a Raft observer of `__cluster_metadata`, replay committed records
   into `MetadataImage`s and call `on_metadata_update` with each; the first
   call only once caught up with the metadata log's high watermark.
3. Implement `ControllerChannel.send` with a `raftka.wire.KafkaConnection`
   to the active controller, retrying NOT_CONTROLLER answers and raising
   `ControllerUnavailableError` when no controller answers in time.
"""

from broker.broker import Broker
from broker.config import BrokerConfig
from broker.controller_channel import CONTROLLER_VERSIONS, ControllerChannel, ControllerUnavailableError
from broker.local_controller import LocalController

__all__ = [
    "CONTROLLER_VERSIONS",
    "Broker",
    "BrokerConfig",
    "ControllerChannel",
    "ControllerUnavailableError",
    "LocalController",
]
