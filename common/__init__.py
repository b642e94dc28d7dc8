"""The shared floor of raftka: errors, config parsing, the Kafka wire codec, and small helpers.

Nothing here imports `storage`, `quorum`, `broker`, `cluster`, `bench` or `raftka`.
"""

__version__ = "0.1.0"
