"""What one step of the group coordinator asks of its shell (pure).

Every call into a `GroupCoordinatorShard` (a request, a `tick`, an
unload) returns one `CoordinatorResult`: the records to append to the
shard's `__consumer_offsets` partition and the responses that step
produced, each keyed by the opaque token of the request it answers. A step
can answer requests other than the one that caused it (a JoinGroup that
completes the join phase answers every parked JoinGroup) and can leave its
own request parked (no response for its token yet).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from broker.core.group.classic_group import Parked
from broker.core.group.records import Record


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who sent a request: `token` is the caller's handle for the request
    (any hashable, unique while the request is outstanding); client_id is
    the request header's, client_host the peer address (Kafka shows
    "/127.0.0.1")."""

    token: Hashable
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class CoordinatorResult:
    """Append `records` (in order, as one batch) to the shard's partition;
    send each (token, response) of `responses` once every record the shard
    has emitted so far, these included, is committed (the partition's high
    watermark reached the log end offset right after this append)."""

    records: tuple[Record, ...] = ()
    responses: tuple[tuple[Hashable, Any], ...] = ()
    #: Transactional records (TxnOffsetCommit), each `(producer id,
    #: producer epoch, records)` appended as its own transactional batch
    #: of that producer, after `records`.
    txn_records: tuple[tuple[int, int, tuple[Record, ...]], ...] = ()

    def response_for(self, token: Hashable) -> Any | None:
        for t, response in self.responses:
            if t == token:
                return response
        return None


@dataclass
class Effects:
    """The outputs of one step as they accumulate, and the step's clock."""

    now_ms: int
    records: list[Record] = field(default_factory=list)
    responses: list[tuple[Hashable, Any]] = field(default_factory=list)
    txn_records: list[tuple[int, int, tuple[Record, ...]]] = field(default_factory=list)
    #: Rebalances this step completed: classic groups' join phases that made
    #: a generation with members, consumer groups' new target assignments
    #: (Kafka's group-rebalance and consumer-group-rebalance sensors).
    rebalances: int = 0
    consumer_rebalances: int = 0

    def respond(self, token: Hashable, response: Any) -> None:
        self.responses.append((token, response))

    def reply(self, parked: Parked, response: Any) -> None:
        self.responses.append((parked.token, response))

    def result(self) -> CoordinatorResult:
        return CoordinatorResult(tuple(self.records), tuple(self.responses), tuple(self.txn_records))
