"""The `/migration` znode (KIP-866): how far the KRaft metadata log has been written to ZooKeeper.

Theory of operation
-------------------
The active KRaft controller creates `/migration` when it copies ZooKeeper's
metadata into the log, and rewrites it after every batch of dual writes:

    /migration  {"version":0,"kraft_metadata_offset":..,"kraft_metadata_epoch":..,
                 "kraft_controller_id":..,"kraft_controller_epoch":..}

A controller that takes over during a migration reads it to know which
committed records ZooKeeper already has; `raftka migrate rollback` deletes
it (with `/controller`), which hands the cluster back to ZooKeeper mode.
Pure: encoders return bytes, the decoder raises `MalformedZNodeError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from quorum.zookeeper.errors import MalformedZNodeError

MIGRATION_PATH = "/migration"


@dataclass(frozen=True, slots=True)
class MigrationZnode:
    """Where ZooKeeper stands relative to the metadata log (-1: nothing written yet)."""

    kraft_metadata_offset: int
    kraft_metadata_epoch: int
    kraft_controller_id: int
    kraft_controller_epoch: int


def encode_migration(m: MigrationZnode) -> bytes:
    return json.dumps({"version": 0, "kraft_metadata_offset": m.kraft_metadata_offset,
                       "kraft_metadata_epoch": m.kraft_metadata_epoch, "kraft_controller_id": m.kraft_controller_id,
                       "kraft_controller_epoch": m.kraft_controller_epoch}, separators=(",", ":")).encode()


def decode_migration(data: bytes) -> MigrationZnode:
    try:
        obj = json.loads(data)
        return MigrationZnode(*(int(obj[k]) for k in ("kraft_metadata_offset", "kraft_metadata_epoch",
                                                        "kraft_controller_id", "kraft_controller_epoch")))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise MalformedZNodeError(f"{MIGRATION_PATH}: not KIP-866's migration JSON: {data[:200]!r}") from None
