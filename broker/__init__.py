"""raftka broker package."""
