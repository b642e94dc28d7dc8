"""Voters as an operator writes them: `--initial-controllers` and directory ids.

`parse_initial_controllers` reads Kafka's `id@host:port:directory-id,...`;
directory ids are printed as Kafka prints them (22 chars of URL-safe base64)
and read in that form or as a UUID.
"""

from __future__ import annotations

import base64
import uuid

from quorum.raft.voters import CONTROLLER_LISTENER, VoterInfo, VotersFormatError


def parse_initial_controllers(value: str, *, listener: str = CONTROLLER_LISTENER) -> tuple[VoterInfo, ...]:
    """`id@host:port:directory-id,...` (Kafka's --initial-controllers)."""
    voters = []
    for entry in value.split(","):
        entry = entry.strip()
        node, at, rest = entry.partition("@")
        parts = rest.rsplit(":", 2)
        if not at or len(parts) != 3 or not node.isdigit() or not parts[1].isdigit():
            raise VotersFormatError(
                f"--initial-controllers entry {entry!r} is not ID@HOST:PORT:DIRECTORY-ID "
                "(e.g. 1@localhost:9093:pbvuBlaTTwKRxS5NLJwRFQ; make directory ids with `raftka storage random-uuid`)")
        voters.append(VoterInfo(int(node), parse_directory_id(parts[2]), ((listener, parts[0], int(parts[1])),)))
    ids = [v.node_id for v in voters]
    if len(set(ids)) != len(ids):
        raise VotersFormatError(f"--initial-controllers names node ids {sorted(ids)} with a repeat: one entry per controller")
    return tuple(voters)


def parse_directory_id(value: str) -> uuid.UUID:
    """A directory id in Kafka's form (22 chars of URL-safe base64) or as a UUID."""
    try:
        if len(value) == 22:
            return uuid.UUID(bytes=base64.urlsafe_b64decode(value + "=="))
        return uuid.UUID(value)
    except ValueError as exc:
        raise VotersFormatError(f"directory id {value!r} is neither 22 chars of URL-safe base64 nor a UUID "
                                "(make one with `raftka storage random-uuid`)") from exc


def format_directory_id(directory_id: uuid.UUID | None) -> str:
    """Kafka's printed form of a directory id (URL-safe base64, no padding)."""
    if directory_id is None:
        return ""
    return base64.urlsafe_b64encode(directory_id.bytes).decode().rstrip("=")
