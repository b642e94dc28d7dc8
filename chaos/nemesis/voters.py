"""The quorum faults (a dynamic quorum only):

- `voters`: a controller removed from the quorum's voters
  (RemoveRaftVoter), added back at the heal (AddRaftVoter), as `raftka
  quorum remove-controller / add-controller` do;
- `replace`: a controller's disk lost: SIGKILLed, its data dir wiped and
  formatted again (the same node id, a new directory id), started again as
  an observer; its old (id, directory id) is removed from the voters, and
  the heal adds the new one.
"""

from __future__ import annotations

import shutil
import signal
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


def start_replace(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    node = nemesis.resolve_among(fault.target, [c.node_id for c in nemesis.cluster.controllers])
    old = _wipe_and_reformat(nemesis.cluster, node)
    nemesis.old_identities[node] = old
    return {"nodes": [node], "old_directory_id": old, "error": _remove_old_identities(nemesis).get(node)}


def heal(nemesis: Nemesis, fault: Fault) -> dict[str, Any]:
    removed = sorted(nemesis.removed_voters | set(nemesis.old_identities))
    return {"nodes": removed, "errors": add_removed_voters(nemesis)}


def _wipe_and_reformat(cluster: LocalCluster, node_id: int) -> str | None:
    """SIGKILL, the data dir wiped, formatted again as `raftka storage format
    --no-initial-controllers` does (the same node id, a new directory id),
    started again: it follows the quorum as an observer. Its old directory id."""
    from common.meta_properties import format_log_dir, read_directory_id

    node = cluster.nodes[node_id]
    old = read_directory_id(node.log_dir)
    cluster.kill(node_id, signal.SIGKILL)
    shutil.rmtree(node.log_dir)
    format_log_dir(node.log_dir, cluster.cluster_id, node_id)
    cluster.start(node_id)
    return old


def _remove_old_identities(nemesis: Nemesis) -> dict[int, str]:
    """RemoveRaftVoter of each wiped controller's old (id, directory id);
    once done, it is added back with its new one at the heal."""
    errors = {}
    for node, old in sorted(nemesis.old_identities.items()):
        error = change_voter(nemesis.cluster, node, add=False, directory_id=old)
        if error is None:
            del nemesis.old_identities[node]
            nemesis.removed_voters.add(node)
        else:
            errors[node] = error
    return errors


def add_removed_voters(nemesis: Nemesis) -> dict[int, str]:
    """Every controller the voters or replace nemesis removed is added back (AddRaftVoter)."""
    errors = _remove_old_identities(nemesis)
    for node in sorted(nemesis.removed_voters):
        error = change_voter(nemesis.cluster, node, add=True)
        if error is None:
            nemesis.removed_voters.discard(node)
        else:
            errors[node] = error
    return errors


def change_voter(cluster: LocalCluster, node_id: int, *, add: bool, timeout_s: float = 40.0,
                 directory_id: str | None = None) -> str | None:
    """Remove controller `node_id` from a dynamic quorum's voters, or add it
    back (with its directory id and endpoint), asking the leader as
    `raftka quorum remove-controller / add-controller` do; retried through
    leader changes until `timeout_s`. None when done, else why not. The
    directory id is its data dir's, or `directory_id` (the one a wiped
    disk had)."""
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
    directory = directory_id or read_directory_id(node.log_dir)
    voter_directory_id = parse_directory_id(directory) if directory else None
    if add:
        request: Any = AddRaftVoterRequest(
            cluster_id=None, timeout=i32Timedelta.parse(datetime.timedelta(seconds=15)), voter_id=i32(node_id),
            voter_directory_id=voter_directory_id, listeners=(Listener(name="CONTROLLER", host=node.host,
                                                                       port=u16(node.port)),), ack_when_committed=True)
    else:
        request = RemoveRaftVoterRequest(cluster_id=None, voter_id=i32(node_id),
                                         voter_directory_id=voter_directory_id)

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
