"""The broker's one way to the active controller.

Every controller-bound request of the broker (CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, IncrementalAlterConfigs forwarded for
clients; AllocateProducerIds for itself) goes through a `ControllerChannel`:
one coroutine that takes a kio request entity and returns the kio response
entity. The broker sends each API at one fixed version
(`CONTROLLER_VERSIONS`) and converts to and from the client's version
itself, so the channel never needs to negotiate.

Implementations:
- over the network: `broker.shell.quorum_link.QuorumControllerChannel`, to
  whichever voter is the active controller;
- in process, for broker tests: `LocalController` (tests/broker/), the
  controller's real decision functions applied to an image.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from common.errors import RaftkaError
from common.wire import ConnectionFailedError

_log = logging.getLogger("broker.controller_channel")

#: api_key -> the version the broker sends to the controller.
CONTROLLER_VERSIONS: dict[int, int] = {
    19: 7,  # CreateTopics
    20: 6,  # DeleteTopics
    32: 4,  # DescribeConfigs
    37: 3,  # CreatePartitions
    44: 1,  # IncrementalAlterConfigs
    67: 0,  # AllocateProducerIds
    64: 0,  # UnregisterBroker (KIP-631: an admin client may send it to any broker)
    55: 2,  # DescribeQuorum
    80: 1,  # AddRaftVoter (KIP-853: forwarded to the leader)
    81: 0,  # RemoveRaftVoter
    82: 0,  # UpdateRaftVoter
}


class ControllerUnavailableError(RaftkaError):
    """No active controller answered in time (none elected, or unreachable).
    The broker answers the client with a retriable error; the client retries."""


class ControllerChannel(Protocol):
    async def send(self, request: Any) -> Any:
        """Send a kio request entity to the active controller and return
        its kio response entity. Raise `ControllerUnavailableError` (or let
        a `common.wire.ConnectionFailedError` out) when there is no answer."""
        ...


async def ask(channel: ControllerChannel, request: Any) -> Any | None:
    """The active controller's answer to `request`, or None (logged) when
    there is none: the forwarding handlers then answer REQUEST_TIMED_OUT,
    which clients retry."""
    try:
        return await channel.send(request)
    except (ControllerUnavailableError, ConnectionFailedError) as exc:
        _log.warning("no answer from the controller: %s", exc)
        return None
