"""The `voters` fault (a dynamic quorum only): a controller removed from
the quorum's voters (RemoveRaftVoter), added back at the heal
(AddRaftVoter), as `raftka quorum remove-controller / add-controller` do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chaos.schedule import Fault
from cluster.launcher import LocalCluster

if TYPE_CHECKING:
    from chaos.nemesis import Nemesis


def start(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    node = nemesis.resolve_among(fault.target, [c.node_id for c in nemesis.cluster.controllers])
    error = change_voter(nemesis.cluster, node, add=False)
    if error is None:
        nemesis.removed_voters.add(node)
    return {"nodes": [node], "error": error}


def heal(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    removed = sorted(nemesis.removed_voters)
    return {"nodes": removed, "errors": add_removed_voters(nemesis)}


def add_removed_voters(nemesis: Nemesis) -> dict[int, str]:
    """Every controller the voters nemesis removed is added back (AddRaftVoter)."""
    errors = {}
    for node in sorted(nemesis.removed_voters):
        error = change_voter(nemesis.cluster, node, add=True)
        if error is None:
            nemesis.removed_voters.discard(node)
        else:
            errors[node] = error
    return errors


def change_voter(cluster: LocalCluster, node_id: int, *, add: bool, timeout_s: float = 40.0) -> str | None:
    """Remove controller `node_id` from a dynamic quorum's voters, or add it
    back (with its directory id and endpoint), asking the leader as
    `raftka quorum remove-controller / add-controller` do; retried through
    leader changes until `timeout_s`. None when done, else why not."""
    import datetime

    import trio
    from kio.schema.add_raft_voter.v1.request import AddRaftVoterRequest, Listener
    from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
    from kio.static.primitive import i32, i32Timedelta, u16

    from common.meta_properties import read_directory_id
    from common.wire import open_connection
    from quorum.node.describe_quorum import describe_quorum
    from quorum.node.voter_config import parse_directory_id

    node = cluster.nodes[node_id]
    directory = read_directory_id(node.log_dir)
    directory_id = parse_directory_id(directory) if directory else None
    if add:
        request: Any = AddRaftVoterRequest(
            cluster_id=None, timeout=i32Timedelta.parse(datetime.timedelta(seconds=15)), voter_id=i32(node_id),
            voter_directory_id=directory_id, listeners=(Listener(name="CONTROLLER", host=node.host,
                                                                 port=u16(node.port)),), ack_when_committed=True)
    else:
        request = RemoveRaftVoterRequest(cluster_id=None, voter_id=i32(node_id), voter_directory_id=directory_id)

    async def attempt() -> str | None:
        last = "no controller answered"
        with trio.move_on_after(timeout_s):
            while True:
                for controller in cluster.controllers:
                    if not controller.is_running():
                        continue
                    try:
                        d = await describe_quorum(controller.host, controller.port, 2000)
                        if d.leader_id not in d.nodes:
                            continue
                        host, port = d.nodes[d.leader_id]
                        async with open_connection(host, port, connect_timeout_ms=2000) as conn:
                            answer = await conn.request(request, timeout_ms=20000)
                    except Exception as exc:  # noqa: BLE001 (a fault may be on: any failure is retried)
                        last = f"{type(exc).__name__}: {exc}"
                        continue
                    code = int(answer.error_code)
                    if code == 0 or (add and code == 126) or (not add and code == 127):
                        return None  # done, or already so (duplicate voter / voter not found)
                    last = f"error {code}: {answer.error_message}"
                await trio.sleep(0.5)
        return last

    return trio.run(attempt)
