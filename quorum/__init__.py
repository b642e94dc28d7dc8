"""raftka quorum package."""
