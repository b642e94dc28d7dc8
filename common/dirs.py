"""Directories named on a command line, made before anything runs."""

from __future__ import annotations

import os

from common.errors import RaftkaError


def ensure_dir(option: str, path: str) -> None:
    """Make `path` (like `mkdir -p`) for command-line `option` before
    anything runs: one that cannot be made or written is a RaftkaError
    saying so, not a traceback (or, for a bench, a run whose rows are lost)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RaftkaError(f"{option} {path}: cannot make the directory ({exc.strerror or exc}); "
                          "pass a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RaftkaError(f"{option} {path}: the directory is not writable; pass a writable directory")
