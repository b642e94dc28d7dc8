"""The one in-process exception root.

On the wire, errors are Kafka error codes inside responses and are never
raised across the network. In process, every error raftka raises derives
from `RaftkaError`, and each subclass says whose fault it is and what to do.
"""


class RaftkaError(Exception):
    """Root of every exception raftka raises on purpose."""


class ConfigError(RaftkaError):
    """A configuration value is missing or invalid; the message names the key."""
