"""Errors of the Kafka-protocol wire layer, by whose fault they are.

On the wire, errors are Kafka error codes inside responses. These
exceptions live only in process: the server turns a `RemoteProtocolError`
into a closed connection (never a crashed process), and the client turns a
broken or silent peer into a `ConnectionFailedError` that callers retry.
"""

from common.errors import RaftkaError


class ProtocolError(RaftkaError):
    """Something about Kafka-protocol bytes is wrong; see the two subclasses."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not a valid Kafka frame for this server.

    The connection they came on cannot be trusted any more: close it, log the
    peer address and the message, and keep serving everyone else.
    """


class LocalProtocolError(ProtocolError):
    """We misused the wire API (a bug on our side): e.g. a response whose API
    or version does not match its request, or a version nobody declared.
    Fix the calling code; the message says which call was wrong."""


class ConnectionFailedError(RaftkaError):
    """A connection to a peer could not be opened, broke, or is in reconnect
    backoff. The request may or may not have reached the peer; retry it
    (Raft and the broker-controller RPCs are all safe to retry)."""


class RequestTimeoutError(ConnectionFailedError):
    """No response arrived within the request's timeout. Like Kafka's
    NetworkClient, the connection is closed, because a late response could
    otherwise be taken for the answer to a later request."""


class UnsupportedVersionError(RaftkaError):
    """The peer supports no version of an API in the range we can speak.
    Upgrade one side, or lower the range we ask for."""
