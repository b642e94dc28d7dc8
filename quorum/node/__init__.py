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
- `workload`: metadata write workloads against a quorum, for `raftka bench
  quorum` (which starts the controllers with `cluster.local_quorum`).

The `raftka controller` process that wires these together is
`quorum.process.run_controller`.

A broker follows the metadata as an observer (or, in a combined process,
through its own voter) like this:

    node = RaftNode(node_id=broker_id, voters=config.controller_quorum_voters,
                    log_dir=config.log_dirs[0], cluster_id=cluster_id,
                    config=quorum.process.quorum_config(config))
    node.subscribe(on_image, broker_id=broker_id)   # on_image(image, delta)
    await nursery.start(node.run)
    ...node.image, node.applied_offset, node.high_watermark, node.leader...
    await node.wait_until_applied(offset); await node.wait_for_change()

and reaches the active controller with
`ControllerClient(pool, voters, leader_hint=lambda: node.leader.leader_id)`.
"""

from quorum.node.driver import RaftNode
from quorum.node.events import MetadataListener, Staged
from quorum.node.publish import LeadershipListener

__all__ = ["LeadershipListener", "MetadataListener", "RaftNode", "Staged"]
