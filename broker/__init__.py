"""The raftka broker: serves the Kafka protocol and hosts partition replicas.

Layout
------
- `broker.api`: the protocol handlers, one module per API family (produce,
  fetch, list_offsets, metadata, admin, find_coordinator) and the hand-built
  response encoders of the hot path (`codec`, `metadata_codec`).
- `broker.core`: pure state, no I/O, no clock reads: a partition replica's
  state (`core.replication`), the group coordinator (`core.group`), the
  broker's lifecycle with the controller, incremental fetch sessions.
- `broker.shell`: the I/O shell: the `Broker` object and its server, the
  process wiring (`shell.process`, `shell.quorum_link`, `shell.zk_link`),
  the logs on disk, the replica fetchers, and the coordinator and cleaner
  tasks.

Public API
----------
- `Broker(config, controller)`: `await nursery.start(broker.run)` serves and
  starts with the bound `common.wire.Server`; cancelling `run` shuts down
  cleanly. `on_metadata_update(image, delta=None)` is the one way metadata
  comes in.
- `BrokerConfig`: settings with Kafka's key names (`from_properties`).
- `ControllerChannel`: the one way requests go out to the controller; the
  broker sends each API at `CONTROLLER_VERSIONS[api_key]`.

Wiring to the quorum (`broker.shell.process.run_broker`, `raftka broker`, `raftka dev`)
-------------------------------------------------------------------------------------
- `broker.shell.quorum_link.BrokerQuorumLink`: the process's `RaftNode` (an
  observer of `__cluster_metadata`, or the voter of a combined node) feeds
  `on_metadata_update`, the first image only once caught up with the
  quorum's high watermark; registration and heartbeats follow
  `broker.core.lifecycle.BrokerLifecycle` (the pure core), and SIGTERM runs the
  controlled shutdown before `run` is cancelled.
- `broker.shell.quorum_link.QuorumControllerChannel`: the `ControllerChannel`
  over `quorum.node.ControllerClient` (whichever voter is active;
  NOT_CONTROLLER answers are retried, `ControllerUnavailableError` when
  none answers in time).
"""

from broker.shell.broker import Broker
from broker.config import BrokerConfig
from broker.shell.controller_channel import CONTROLLER_VERSIONS, ControllerChannel, ControllerUnavailableError

__all__ = [
    "CONTROLLER_VERSIONS",
    "Broker",
    "BrokerConfig",
    "ControllerChannel",
    "ControllerUnavailableError",
]
