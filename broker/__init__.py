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

Wiring to the quorum (`broker.process.run_broker`, `raftka broker`)
--------------------------------------------------------------------
- `broker.quorum_link.BrokerQuorumLink`: the process's `RaftNode` (an
  observer of `__cluster_metadata`, or the voter of a combined node) feeds
  `on_metadata_update`, the first image only once caught up with the
  quorum's high watermark; registration and heartbeats follow
  `broker.lifecycle.BrokerLifecycle` (the pure core), and SIGTERM runs the
  controlled shutdown before `run` is cancelled.
- `broker.quorum_link.QuorumControllerChannel`: the `ControllerChannel`
  over `quorum.node.ControllerClient` (whichever voter is active;
  NOT_CONTROLLER answers are retried, `ControllerUnavailableError` when
  none answers in time).
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
