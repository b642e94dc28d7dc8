"""The raftka broker: serves the Kafka protocol and hosts partition replicas.

Public API:
- `Broker(config, controller)`: `run()` serves; `on_metadata_update(image,
  delta)` is the one way metadata comes in.
- `BrokerConfig`: settings with Kafka's key names.
- `ControllerChannel`: the one way requests go to the controller.
- `LocalController`: an in-process ControllerChannel over the real
  controller decisions (tests, `python -m broker`).
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
