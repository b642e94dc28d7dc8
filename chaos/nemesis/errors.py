"""The nemeses' error."""

from __future__ import annotations

from common.errors import RaftkaError


class NemesisError(RaftkaError):
    """A fault could not be applied or healed; the message says which and why."""
