"""The Kafka-protocol wire layer shared by controllers and brokers.

Pure parts: `framing` (size-prefixed frames, response parts), `codec`
(headers, kio bodies), `apis` (what a server serves; ApiVersions answers),
hand decoders of the bodies kio is slow on (`produce_request`,
`fetch_response`; `metadata_leaders`, asked for per request).
I/O shells on trio: `server` (serve), `client` (KafkaConnection), `pool`
(ConnectionPool), `transmit` (sending parts, sendfile).
"""

from common.wire.apis import Feature, SupportedApis
from common.wire.client import KafkaConnection, connect, open_connection
from common.wire.codec import (
    API_VERSIONS_KEY,
    ApiCodec,
    DecodedRequest,
    RequestHeader,
    api_codec,
    api_name,
    decode_request,
    decode_response,
    duration_ms,
    encode_request,
    encode_response,
    encode_response_header,
)
from common.wire.errors import (
    ConnectionFailedError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeoutError,
    UnsupportedVersionError,
)
from common.wire.framing import (
    DEFAULT_REQUEST_MAX_BYTES,
    FileSlice,
    FrameBuffer,
    ReceiveBuffer,
    frame_parts,
    frame_size_prefix,
    part_length,
    split_frames,
)
from common.wire.pool import ConnectionPool, open_connection_pool
from common.wire.server import ConnectionContext, Server, ServerStats, serve

__all__ = [
    "API_VERSIONS_KEY",
    "ApiCodec",
    "ConnectionContext",
    "ConnectionFailedError",
    "ConnectionPool",
    "DEFAULT_REQUEST_MAX_BYTES",
    "DecodedRequest",
    "duration_ms",
    "Feature",
    "FileSlice",
    "FrameBuffer",
    "ReceiveBuffer",
    "KafkaConnection",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestHeader",
    "RequestTimeoutError",
    "Server",
    "ServerStats",
    "SupportedApis",
    "UnsupportedVersionError",
    "api_codec",
    "api_name",
    "connect",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_response_header",
    "frame_parts",
    "frame_size_prefix",
    "open_connection",
    "open_connection_pool",
    "part_length",
    "serve",
    "split_frames",
]
