"""The quorum controller's pure decision logic (KIP-631); see `controller.QuorumController`."""

from quorum.controller.config import ControllerConfig
from quorum.controller.controller import SUPPORTED_REQUESTS, QuorumController
from quorum.controller.errors import ControllerUsageError
from quorum.controller.result import NO_THROTTLE, ControllerResult

__all__ = [
    "NO_THROTTLE",
    "SUPPORTED_REQUESTS",
    "ControllerConfig",
    "ControllerResult",
    "ControllerUsageError",
    "QuorumController",
]
