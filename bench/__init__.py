"""raftka bench package."""
