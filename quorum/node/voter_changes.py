"""AddRaftVoter (80), RemoveRaftVoter (81), UpdateRaftVoter (82): KIP-853 on the controller listener.

Only the leader changes the voter set; any other node answers
NOT_LEADER_OR_FOLLOWER (a tool then asks the leader DescribeQuorum names).
The leader:

- AddRaftVoter: the new controller must be an observer of this leader
  that has caught up (its log end offset at the high watermark, a fetch
  within `controller.quorum.fetch.timeout.ms`); the leader waits for that
  up to the request's timeout. It then appends a VotersRecord with one voter
  more, carrying the new voter's directory id and endpoints, and answers once
  the record is committed (AddRaftVoter v1 with `ack_when_committed=false`:
  once written);
- RemoveRaftVoter: a VotersRecord with one voter less, answered once
  committed. A leader that removes itself leads until then and resigns;
- UpdateRaftVoter: a voter's new endpoints, as a VotersRecord with the same
  voters;
- UpdateFeatures with `kraft.version` 1 (`raftka features upgrade
  --feature kraft.version=1`, as `kafka-features` sends it): a static quorum
  becomes dynamic. The leader writes a VotersRecord of the voters of
  `controller.quorum.voters` (no directory ids: they were never recorded),
  and from then on the log's voter set is in force and AddRaftVoter and
  RemoveRaftVoter work. Other features are refused (raftka's other levels
  are fixed).

The Raft core enforces the rule that makes one change at a time safe: a
change starts only after the leader committed a record of its epoch and the
previous change is committed. A request arriving while one is pending
waits for it (up to its timeout), then answers REQUEST_TIMED_OUT saying why.
The cluster id, when given, must be this cluster's (INCONSISTENT_CLUSTER_ID);
a directory id, when the voter set knows one, must match (VOTER_NOT_FOUND).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import trio
from kio.schema.errors import ErrorCode

from quorum.controller.result import NO_THROTTLE
from quorum.raft import NotLeaderError, RaftUsageError
from quorum.raft.voters import VoterInfo

UPDATE_FEATURES = 57
ADD_RAFT_VOTER = 80
REMOVE_RAFT_VOTER = 81
UPDATE_RAFT_VOTER = 82
#: (min, max) version raftka serves of each.
VERSIONS = {ADD_RAFT_VOTER: (0, 1), REMOVE_RAFT_VOTER: (0, 0), UPDATE_RAFT_VOTER: (0, 0), UPDATE_FEATURES: (1, 1)}
KRAFT_VERSION_FEATURE = "kraft.version"
_POLL_S = 0.05

_log = logging.getLogger("quorum.node.voter_changes")


class VoterChangeError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def voter_change_response(body: Any, code: ErrorCode, message: str | None) -> Any:
    """The response to a voter change request, with `code` and `message`."""
    import importlib

    key = int(body.__api_key__)
    if key == UPDATE_FEATURES:
        from kio.schema.update_features.v1 import response as uf

        return uf.UpdateFeaturesResponse(
            throttle_time=NO_THROTTLE, error_code=code, error_message=message,
            results=tuple(uf.UpdatableFeatureResult(feature=u.feature, error_code=code, error_message=message)
                          for u in body.feature_updates))
    name = {ADD_RAFT_VOTER: "add_raft_voter", REMOVE_RAFT_VOTER: "remove_raft_voter",
            UPDATE_RAFT_VOTER: "update_raft_voter"}[key]
    m = importlib.import_module(f"kio.schema.{name}.v{int(body.__version__)}.response")
    cls = next(getattr(m, a) for a in dir(m) if a.endswith("Response") and a != "ResponseHeader")
    if key == UPDATE_RAFT_VOTER:
        return cls(throttle_time=NO_THROTTLE, error_code=code, current_leader=m.CurrentLeader(host="", port=-1))
    return cls(throttle_time=NO_THROTTLE, error_code=code, error_message=message)


class VoterChanges:
    """Serves the three KIP-853 APIs, and UpdateFeatures for kraft.version, for one `RaftNode`."""

    def __init__(self, node: Any) -> None:
        self.node = node

    async def handle(self, body: Any) -> Any:
        key = int(body.__api_key__)
        # RemoveRaftVoter and UpdateRaftVoter carry no timeout: Kafka's default request timeout.
        timeout = getattr(body, "timeout", None)
        timeout_ms = int(timeout.total_seconds() * 1000) if timeout is not None else 30000
        try:
            self._check_leader_and_cluster(body)
            with trio.fail_after(max(timeout_ms, 1) / 1000):
                if key == UPDATE_FEATURES:
                    await self._upgrade(body)
                elif key == ADD_RAFT_VOTER:
                    await self._add(body)
                elif key == REMOVE_RAFT_VOTER:
                    await self._remove(body)
                else:
                    await self._update(body)
        except VoterChangeError as exc:
            _log.info("node %d refused %s: %s", self.node.node_id, type(body).__name__, exc.message)
            return voter_change_response(body, exc.code, exc.message)
        except trio.TooSlowError:
            return voter_change_response(
                body, ErrorCode.request_timed_out,
                f"the voter change did not complete within {timeout_ms} ms: {self._why_waiting(body)}")
        return voter_change_response(body, ErrorCode.none, None)

    # --- checks ---------------------------------------------------------------------------

    def _check_leader_and_cluster(self, body: Any) -> None:
        cluster_id = getattr(body, "cluster_id", None)
        if cluster_id is not None and cluster_id != self.node.cluster_id:
            raise VoterChangeError(ErrorCode.inconsistent_cluster_id,
                                   f"the request names cluster {cluster_id}; this is cluster {self.node.cluster_id}")
        if not self.node.is_leader:
            leader = self.node.leader.leader_id if self.node.core is not None else None
            raise VoterChangeError(ErrorCode.not_leader_or_follower,
                                   f"node {self.node.node_id} is not the leader (leader: {leader}); ask the leader")

    def _why_waiting(self, body: Any) -> str:
        core = self.node.core
        if core is not None and core.voter_change_pending:
            return "the previous voter change is not committed yet"
        if int(body.__api_key__) == ADD_RAFT_VOTER:
            return (f"node {int(body.voter_id)} has not caught up as an observer of leader {self.node.node_id}; "
                    "start it with controller.quorum.bootstrap.servers pointing at the quorum and retry")
        return "the new voter set was not committed by a majority"

    def _voter_info(self, node_id: int) -> VoterInfo | None:
        log = self.node.log
        infos = log.latest_voters() if log is not None else None
        return next((v for v in infos or () if v.node_id == node_id), None)

    def _check_directory(self, node_id: int, directory_id: uuid.UUID | None) -> None:
        info = self._voter_info(node_id)
        if info is None:
            raise VoterChangeError(ErrorCode.voter_not_found, f"node {node_id} is not a voter "
                                   f"(voters: {sorted(self.node.voter_addresses)})")
        if directory_id is not None and info.directory_id is not None and info.directory_id != directory_id:
            raise VoterChangeError(ErrorCode.voter_not_found,
                                   f"voter {node_id} has directory id {info.directory_id}, not {directory_id}: "
                                   "`raftka quorum describe --replication` shows each voter's directory id")

    # --- the changes ----------------------------------------------------------------------

    async def _caught_up(self, node_id: int, directory_id: uuid.UUID | None = None) -> None:
        """Wait until `node_id` (on the disk of `directory_id`, if given)
        fetches from this leader and has reached its high watermark."""
        while True:
            self._check_leader_and_cluster_quietly()
            status = self.node.describe()
            hw = status.high_watermark
            for r in status.observers:
                fresh = r.last_fetch_timestamp_ms >= 0 and \
                    self.node.now_ms() - r.last_fetch_timestamp_ms <= self.node.config.controller_quorum_fetch_timeout_ms
                # (the same id on another disk, e.g. the replaced voter's, is not it)
                same_disk = directory_id is None or r.directory_id is None or r.directory_id == directory_id
                if r.replica_id == node_id and same_disk and hw is not None and r.log_end_offset >= hw and fresh:
                    return
            await trio.sleep(_POLL_S)

    def _check_leader_and_cluster_quietly(self) -> None:
        if not self.node.is_leader:
            raise VoterChangeError(ErrorCode.not_leader_or_follower,
                                   f"node {self.node.node_id} lost the leadership while changing the voters; retry")

    async def _change(self, voters: frozenset[int], info: VoterInfo | None, wait_commit: bool,
                      same_set: bool = False) -> None:
        """Append the VotersRecord once the core allows it; wait until it is committed."""
        while True:
            self._check_leader_and_cluster_quietly()
            result: list[Any] = []

            def change(now_ms: int, result: list[Any] = result) -> Any:
                core = self.node.core
                if info is not None:
                    self.node.log.remember_voter(info)
                try:
                    appended, output = core.change_voters(voters, now_ms, same_set=same_set)
                except (RaftUsageError, NotLeaderError) as exc:
                    result.append(exc)
                    return None
                result.append(appended)
                return output

            await self.node.call(change)
            outcome = result[0]
            if isinstance(outcome, NotLeaderError):
                raise VoterChangeError(ErrorCode.not_leader_or_follower, f"node {self.node.node_id} is no longer "
                                       "the leader; ask the new leader")
            if isinstance(outcome, RaftUsageError):
                if "exactly one voter" in str(outcome) or "keeps the voters" in str(outcome):
                    raise VoterChangeError(ErrorCode.invalid_request, str(outcome))
                await trio.sleep(_POLL_S)  # a change pending, or no commit in this epoch yet
                continue
            break
        _log.info("node %d appended the voter set %s at offset %d", self.node.node_id, sorted(voters),
                  outcome.last_offset)
        if not wait_commit:
            return
        while (self.node.high_watermark or 0) <= outcome.last_offset:
            core = self.node.core
            if core is None or core.epoch != outcome.epoch:
                raise VoterChangeError(ErrorCode.not_leader_or_follower, "the leader changed before the voter set "
                                       "was committed; describe the quorum and retry if it is not in force")
            await self.node.wait_for_change()

    def _check_dynamic(self) -> None:
        if self.node.log is None or self.node.log.latest_voters() is None:
            raise VoterChangeError(ErrorCode.invalid_request,
                                   "this quorum is static (controller.quorum.voters, kraft.version 0): make it dynamic "
                                   "first with `raftka features upgrade --bootstrap-controller HOST:PORT --feature "
                                   "kraft.version=1`")

    async def _add(self, body: Any) -> None:
        self._check_dynamic()
        node_id = int(body.voter_id)
        if node_id in self.node.voter_addresses:
            raise VoterChangeError(ErrorCode.duplicate_voter, f"node {node_id} is already a voter")
        endpoints = tuple((listener.name, listener.host, int(listener.port)) for listener in body.listeners)
        if not endpoints:
            raise VoterChangeError(ErrorCode.invalid_request, f"AddRaftVoter for node {node_id} names no listener: "
                                   "give the new controller's CONTROLLER endpoint")
        await self._caught_up(node_id, body.voter_directory_id)
        info = VoterInfo(node_id, body.voter_directory_id, endpoints)
        await self._change(frozenset(self.node.voter_addresses) | {node_id}, info,
                           wait_commit=getattr(body, "ack_when_committed", True))

    async def _remove(self, body: Any) -> None:
        self._check_dynamic()
        node_id = int(body.voter_id)
        self._check_directory(node_id, body.voter_directory_id)
        if set(self.node.voter_addresses) == {node_id}:
            raise VoterChangeError(ErrorCode.invalid_request, f"node {node_id} is the only voter: add another first")
        await self._change(frozenset(self.node.voter_addresses) - {node_id}, None, wait_commit=True)

    async def _upgrade(self, body: Any) -> None:
        for update in body.feature_updates:
            if update.feature != KRAFT_VERSION_FEATURE or int(update.max_version_level) not in (0, 1):
                raise VoterChangeError(ErrorCode.invalid_update_version,
                                       f"{update.feature}={int(update.max_version_level)}: raftka's controllers "
                                       "change only kraft.version, to 1 (a static quorum becoming dynamic)")
            if int(update.max_version_level) == 0:
                if self.node.log.latest_voters() is not None:
                    raise VoterChangeError(ErrorCode.invalid_update_version,
                                           "kraft.version cannot go back to 0: the voter set is in the log")
                continue
            if body.validate_only or self.node.log.latest_voters() is not None:
                continue  # already dynamic
            voters = frozenset(self.node.voter_addresses)
            for node_id, (host, port) in self.node.voter_addresses.items():
                self.node.log.remember_voter(VoterInfo(node_id, None, (("CONTROLLER", host, port),)))
            await self._change(voters, None, wait_commit=True, same_set=True)
            _log.info("node %d: kraft.version 1: the voters %s are in the log", self.node.node_id, sorted(voters))

    async def _update(self, body: Any) -> None:
        self._check_dynamic()
        node_id = int(body.voter_id)
        self._check_directory(node_id, body.voter_directory_id)
        endpoints = tuple((listener.name, listener.host, int(listener.port)) for listener in body.listeners)
        old = self._voter_info(node_id)
        assert old is not None
        info = VoterInfo(node_id, old.directory_id or body.voter_directory_id, endpoints or old.endpoints)
        if info == old:
            return
        await self._change(frozenset(self.node.voter_addresses), info, wait_commit=True, same_set=True)

