"""raftka's command line: one module per sub-command (`raftka.cli` lists them)."""

from common import __version__

__all__ = ["__version__"]
