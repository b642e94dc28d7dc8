"""In-process errors of the controller package (on the wire, errors are Kafka error codes)."""

from common.errors import RaftkaError


class ControllerUsageError(RaftkaError):
    """The driver called the controller API wrongly; the message says how to call it."""
