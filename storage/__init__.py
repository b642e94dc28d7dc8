"""raftka storage package."""
