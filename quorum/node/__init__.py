"""The trio shell around the Raft core: a metadata quorum member as a process component.

- `driver.RaftNode`: runs a `RaftCore` as a voter or an observer; persists
  before it sends; applies committed records to the `MetadataImage` and
  publishes it; `propose` / `propose_with` for the active controller.
- `events`, `publish`: what callers wait on; who hears of new images and
  leadership.
- `network.RaftChannel`: outbound Raft requests (ConnectionPool), failed
  requests as error responses, dead-leader detection.
- `handler.QuorumRequestHandler`: the controller listener's dispatch.
- `controller_service.ControllerService`: the controller APIs on the
  active controller, NOT_CONTROLLER elsewhere.
- `controller_client.ControllerClient`: find the active controller and send to it.
- `metadata_log`: where the metadata log lives (`quorum.raft.storage_log`
  keeps it); `snapshots`: the snapshot blob (CBOR records, header, CRC32C);
  `quorum_state`: the quorum-state file.
- `rpc`: Raft messages <-> kio; `describe_quorum`: API 55.
- `process.run_controller`: the `raftka controller` process.
"""

from quorum.node.driver import RaftNode
from quorum.node.events import MetadataListener, Staged
from quorum.node.publish import LeadershipListener

__all__ = ["LeadershipListener", "MetadataListener", "RaftNode", "Staged"]
