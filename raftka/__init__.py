"""raftka: a Kafka-compatible replicated commit log with a Raft metadata quorum."""

__version__ = "0.1.0"
