"""ElectionState: what a voter must remember across a crash (Raft §5.2, Fig. 2).

A voter that forgets its epoch or its vote could vote twice in one epoch and
let two leaders be elected. So the core emits `Output.persist_election_state`
whenever the epoch, the leader or the vote changes, and the driver fsyncs it
(the `quorum-state` file) before it sends anything from that output.

The file format is Kafka's `quorum-state` JSON (QuorumStateData, data
version 0), so a Kafka operator can read it.
"""

from __future__ import annotations

import dataclasses
import json

from quorum.raft.errors import RaftUsageError


@dataclasses.dataclass(frozen=True, slots=True)
class ElectionState:
    epoch: int
    leader_id: int | None
    voted_id: int | None
    voters: frozenset[int]

    def __post_init__(self) -> None:
        assert self.epoch >= 0, self

    def to_quorum_state_json(self, cluster_id: str = "") -> str:
        return json.dumps(
            {
                "clusterId": cluster_id,
                "leaderId": -1 if self.leader_id is None else self.leader_id,
                "leaderEpoch": self.epoch,
                "votedId": -1 if self.voted_id is None else self.voted_id,
                "appliedOffset": 0,
                "currentVoters": [{"voterId": v} for v in sorted(self.voters)],
                "data_version": 0,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_quorum_state_json(cls, text: str) -> ElectionState:
        try:
            data = json.loads(text)
            if data.get("data_version") != 0:
                raise ValueError(f"data_version {data.get('data_version')!r} is not 0")
            leader_id = int(data["leaderId"])
            voted_id = int(data["votedId"])
            return cls(
                epoch=int(data["leaderEpoch"]),
                leader_id=None if leader_id < 0 else leader_id,
                voted_id=None if voted_id < 0 else voted_id,
                voters=frozenset(int(v["voterId"]) for v in data.get("currentVoters") or ()),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RaftUsageError(
                f"quorum-state file is not valid Kafka QuorumStateData v0 JSON ({e}); "
                "restore it from a backup or delete it only if this voter's log is empty"
            ) from e
