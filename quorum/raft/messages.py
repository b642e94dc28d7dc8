"""The Raft RPCs as plain dataclasses, and the envelopes they travel in.

Fields follow Kafka's message schemas (VoteRequest v2 with KIP-996's
`pre_vote`, BeginQuorumEpoch v1, EndQuorumEpoch v1, Fetch v17, FetchSnapshot
v1), flattened to the single `__cluster_metadata-0` partition: the driver
fills the topic/partition wrapping when it maps them to kio objects. As on
the wire, an unknown leader id or epoch is -1 (`NO_LEADER`), and every
failure is an `ErrorCode` value.

Correlation. Every `Inbound` and `Outbound` carries a `correlation`:
- a request the core *receives* has the driver's opaque token; the core's
  response `Outbound` echoes it (the driver uses it to answer on the right
  connection, and the leader parks long-poll Fetches by it);
- a request the core *sends* has a fresh integer from the core; the driver
  must hand the response back with the same value. Responses the core is not
  waiting for (stale, duplicated) only teach it epochs and are then ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from quorum.raft.errors import ErrorCode

NO_LEADER = -1
UNKNOWN_EPOCH = -1
UNKNOWN_OFFSET = -1

_frozen = dataclasses.dataclass(frozen=True, slots=True, kw_only=True)


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class OffsetAndEpoch:
    """A log position. Ordered by (epoch, offset): the order Raft §5.4.1 uses
    to decide which of two logs is more up to date."""

    epoch: int
    offset: int


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """A snapshot covers offsets [0, end_offset); `epoch` is the epoch of
    the record at end_offset - 1 (Kafka's `OffsetAndEpoch` of a snapshot)."""

    end_offset: int
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class DivergingEpoch:
    """FetchResponse.DivergingEpoch: the leader's log for epochs up to
    `epoch` ends at `end_offset` (KIP-595 / KIP-320)."""

    epoch: int
    end_offset: int


# --- Vote (api key 52) ---------------------------------------------------


@_frozen
class VoteRequest:
    cluster_id: str | None
    voter_id: int  # the receiver (KIP-853); -1 when not known
    replica_id: int  # the (pre-)candidate
    replica_epoch: int  # the candidate's bumped epoch, or its current epoch for a pre-vote
    last_offset_epoch: int
    last_offset: int  # the candidate's log end offset
    pre_vote: bool  # KIP-996: a probe that changes no state on the receiver
    #: KIP-853: the directory id the candidate's voter set records for the
    #: receiver (None: unknown); a receiver with another one refuses.
    voter_directory_id: uuid.UUID | None = None  # noqa: F821
    replica_directory_id: uuid.UUID | None = None  # noqa: F821 (the candidate's own)


@_frozen
class VoteResponse:
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    vote_granted: bool


# --- BeginQuorumEpoch (53) -------------------------------------------------


@_frozen
class BeginQuorumEpochRequest:
    cluster_id: str | None
    voter_id: int
    leader_id: int
    leader_epoch: int
    voter_directory_id: uuid.UUID | None = None  # noqa: F821 (as in VoteRequest)


@_frozen
class BeginQuorumEpochResponse:
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int


# --- EndQuorumEpoch (54) ---------------------------------------------------


@_frozen
class EndQuorumEpochRequest:
    cluster_id: str | None
    leader_id: int
    leader_epoch: int
    preferred_successors: tuple[int, ...]  # most caught-up first


@_frozen
class EndQuorumEpochResponse:
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int


# --- Fetch (1) ---------------------------------------------------------------


@_frozen
class FetchRequest:
    cluster_id: str | None
    replica_id: int  # ReplicaState.ReplicaId: a voter, an observer's node id, or -1
    current_leader_epoch: int
    fetch_offset: int  # the fetcher's log end offset; a voter claims it is flushed
    last_fetched_epoch: int
    log_start_offset: int
    max_bytes: int
    max_wait_ms: int
    #: KIP-853: the fetcher's directory id; its fetch counts toward the high
    #: watermark only if the voter set records this one for its id.
    replica_directory_id: uuid.UUID | None = None  # noqa: F821


@_frozen
class FetchResponse:
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    high_watermark: int  # -1 when the leader does not know it yet
    log_start_offset: int
    diverging_epoch: DivergingEpoch | None = None
    snapshot_id: SnapshotId | None = None
    records: bytes = b""


# --- FetchSnapshot (59) ----------------------------------------------------


@_frozen
class FetchSnapshotRequest:
    cluster_id: str | None
    replica_id: int
    current_leader_epoch: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int
    #: KIP-853 (FetchSnapshot v1's ReplicaDirectoryId): the fetcher's
    #: directory id; the download counts as a voter's contact only if the
    #: voter set records this one for its id.
    replica_directory_id: uuid.UUID | None = None  # noqa: F821


@_frozen
class FetchSnapshotResponse:
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    snapshot_id: SnapshotId
    size: int
    position: int
    unaligned_records: bytes


Request = VoteRequest | BeginQuorumEpochRequest | EndQuorumEpochRequest | FetchRequest | FetchSnapshotRequest
Response = VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse | FetchResponse | FetchSnapshotResponse
Message = Request | Response

REQUEST_TYPES = (VoteRequest, BeginQuorumEpochRequest, EndQuorumEpochRequest, FetchRequest, FetchSnapshotRequest)
RESPONSE_TYPES = (VoteResponse, BeginQuorumEpochResponse, EndQuorumEpochResponse, FetchResponse, FetchSnapshotResponse)


@dataclasses.dataclass(frozen=True, slots=True)
class Inbound:
    """A message that arrived from `source_id` (-1 for an anonymous fetcher)."""

    source_id: int
    message: Message
    correlation: Hashable


@dataclasses.dataclass(frozen=True, slots=True)
class Outbound:
    """A message to send to `destination_id`. For a response, `correlation`
    is the token of the request it answers; for a request, the id the driver
    must attach to the response when it hands it back."""

    destination_id: int
    message: Message
    correlation: Hashable

    @property
    def is_request(self) -> bool:
        return isinstance(self.message, REQUEST_TYPES)
