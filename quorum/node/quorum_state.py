"""The `quorum-state` file: a voter's epoch, leader and vote across crashes.

Raft §5.2 (and Fig. 2) requires a voter to remember its current epoch and
the vote it granted before it answers anyone: a voter that forgets could
vote twice in one epoch and let two leaders be elected. The driver writes
this file (Kafka's QuorumStateData JSON, see `quorum.raft.election`) and
fsyncs it before it sends any message of the step that changed it.

The write is atomic: a temp file is written and fsynced, renamed over the
old one, and the directory is fsynced, so a crash leaves either the old or
the new state, never a torn one.
"""

from __future__ import annotations

import os

from quorum.raft.election import ElectionState
from storage.checkpoint import write_atomically
from storage.fs import OsFileSystem

QUORUM_STATE_FILE = "quorum-state"


class QuorumStateFile:
    def __init__(self, dir_path: str, cluster_id: str = "") -> None:
        self.path = os.path.join(dir_path, QUORUM_STATE_FILE)
        self.cluster_id = cluster_id
        self._fs = OsFileSystem()

    def read(self) -> ElectionState | None:
        """The persisted state, or None if this voter never persisted one.
        Raises `RaftUsageError` (naming the fix) for a damaged file."""
        try:
            with open(self.path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return ElectionState.from_quorum_state_json(text)

    def write(self, state: ElectionState) -> None:
        """Durably replace the file's content with `state` (fsynced on return)."""
        data = state.to_quorum_state_json(self.cluster_id).encode()
        write_atomically(self._fs, self.path, data)
