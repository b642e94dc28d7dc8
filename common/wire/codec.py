"""Kafka request/response headers and kio bodies (pure: no sockets, no trio).

Theory of operation
-------------------
A request frame is a request header then a body:

    api_key int16 | api_version int16 | correlation_id int32 |
    client_id nullable int16-length string | [tagged fields, header v2 only]

Header v2 (with tagged fields) is used exactly when the API version is
"flexible" (KIP-482). client_id keeps its int16 length even in v2, a Kafka
quirk kept for ApiVersions fallback. A response frame is a response header
(correlation_id, then tagged fields in header v1 for flexible versions) and
a body. ApiVersions responses always use response header v0, even when
flexible, so that a client which sent a version the server does not know
can still read the answer (KIP-511).

Bodies are decoded and encoded by kio, except Produce requests, which are
decoded by hand so their records stay in the frame (`produce_request`).
Looking up a kio schema and building
its reader and writer is not free (about 5 µs), so `api_codec(api_key,
version)` caches everything needed for one (API, version) pair; servers warm
the cache for every version they declare.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from common.varint import uvarint
from common.wire.errors import LocalProtocolError, RemoteProtocolError
from common.wire.framing import SIZE_PREFIX
from common.wire.length_check import check_lengths, skip_tagged_fields
from common.wire.fetch_response import FETCH_KEY, fetch_response_reader
from common.wire.produce_request import PRODUCE_KEY, produce_request_reader

API_VERSIONS_KEY = 18

_REQUEST_FIXED = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_EMPTY_TAGGED_FIELDS = b"\x00"
# What parsing a header out of garbage can raise.
_HEADER_ERRORS = (ValueError, struct.error, UnicodeDecodeError, SerialError)


_ONE_MS = datetime.timedelta(milliseconds=1)


def string_bytes(value: str, flexible: bool) -> bytes:
    """A string field: compact (varint length + 1) in flexible versions, else int16 length."""
    raw = value.encode()
    return (uvarint(len(raw) + 1) if flexible else _INT16.pack(len(raw))) + raw


@dataclass(frozen=True, slots=True)
class EncodedRequest:
    """A request body encoded already (`fetch_request`): `encode_request`
    writes the header and then `body`, and the answer decodes as this API
    version's."""

    __api_key__: int
    __version__: int
    body: bytes


def duration_ms(value: datetime.timedelta) -> int:
    """A kio duration field (a timedelta) as the wire's whole milliseconds.
    Exact: `int(value.total_seconds() * 1000)` turns 1001 ms into 1000."""
    return value // _ONE_MS


def api_name(api_key: int) -> str:
    """Kafka's name for an API key, for messages: `Fetch(1)`, `Unknown(999)`."""
    name = api_key_map.get(api_key)
    if name is None:
        return f"Unknown({api_key})"
    return "".join(w.capitalize() for w in name.split("_")) + f"({api_key})"


# RequestHeader and DecodedRequest are built for every request: named
# tuples, as immutable as frozen dataclasses, cost a third of their
# construction time.
class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: 1 or 2 (2 = flexible, with tagged fields).
    header_version: int


class DecodedRequest(NamedTuple):
    header: RequestHeader
    #: The kio request entity, e.g. `kio.schema.vote.v0.VoteRequest`. None only
    #: for an ApiVersions request of a version this server does not support,
    #: which the server answers itself (KIP-511 fallback).
    body: Any
    #: Size of the frame without its 4-byte size prefix.
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ApiCodec:
    """Everything needed to speak one version of one API, looked up once."""

    api_key: int
    api_version: int
    request_type: type
    response_type: type
    read_request: Callable[[Any, int], tuple[Any, int]]
    write_request: Callable[[Any, Any], None]
    read_response: Callable[[Any, int], tuple[Any, int]]
    write_response: Callable[[Any, Any], None]
    request_header_version: int
    #: 0 or 1; ApiVersions is always 0.
    response_header_version: int
    #: Whether read_request / read_response are kio's (which need
    #: `check_lengths` first) rather than hand decoders that check their
    #: own bounds (`produce_request`, `fetch_response`).
    kio_reads_request: bool = True
    kio_reads_response: bool = True


@functools.cache
def api_codec(api_key: int, api_version: int) -> ApiCodec:
    """The cached codec of one (API, version); LocalProtocolError if kio has none."""
    try:
        request_type = load_request_schema(api_key, api_version)
        response_type = load_response_schema(api_key, api_version)
    except KioIndexError as exc:
        raise LocalProtocolError(
            f"kio has no schema for {api_name(api_key)} v{api_version}: {exc}; "
            "declare only versions kio knows"
        ) from None
    hand_reader = produce_request_reader(api_version) if api_key == PRODUCE_KEY else None
    hand_response_reader = fetch_response_reader(api_version) if api_key == FETCH_KEY else None
    return ApiCodec(
        api_key=api_key,
        api_version=api_version,
        request_type=request_type,
        response_type=response_type,
        read_request=hand_reader or entity_reader(request_type),
        write_request=entity_writer(request_type),
        read_response=hand_response_reader or entity_reader(response_type),
        write_response=entity_writer(response_type),
        request_header_version=2 if request_type.__flexible__ else 1,
        response_header_version=response_type.__header_schema__.__version__,
        kio_reads_request=hand_reader is None,
        kio_reads_response=hand_response_reader is None,
    )


#: A hand reader of a response body: (frame, position) -> (value, bytes
#: read). It checks its own bounds: whatever it raises becomes a
#: RemoteProtocolError.
ResponseReader = Callable[[memoryview, int], tuple[Any, int]]


@functools.cache
def api_codec_read_by(api_key: int, api_version: int, read: ResponseReader) -> ApiCodec:
    """`api_codec`, with the answers read by `read` instead of kio (a
    client that needs a sliver of a large answer: `metadata_leaders`)."""
    return dataclasses.replace(api_codec(api_key, api_version), read_response=read, kio_reads_response=False)


def parse_request_header(frame: memoryview, header_version: int) -> tuple[RequestHeader, int]:
    """The request header at the start of `frame`, and where the body starts."""
    api_key, api_version, correlation_id = _REQUEST_FIXED.unpack_from(frame, 0)
    (client_id_len,) = _INT16.unpack_from(frame, 8)
    pos = 10
    if client_id_len == -1:
        client_id = None
    elif client_id_len < 0:
        raise ValueError(f"client_id has negative length {client_id_len}")
    else:
        if pos + client_id_len > frame.nbytes:
            raise ValueError("client_id runs past the end of the frame")
        client_id = str(frame[pos : pos + client_id_len], "utf-8")
        pos += client_id_len
    if header_version >= 2:
        # Nearly always no tagged fields: one 0 byte.
        if pos < frame.nbytes and frame[pos] == 0:
            pos += 1
        else:
            pos = skip_tagged_fields(frame, pos)
    header = RequestHeader(api_key, api_version, correlation_id, client_id, header_version)
    return header, pos


def peek_request_api(frame: memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame."""
    if frame.nbytes < 10:
        raise RemoteProtocolError(
            f"a request frame of {frame.nbytes} bytes is too short for a request header"
        )
    return _REQUEST_FIXED.unpack_from(frame, 0)


def decode_request(frame: memoryview, supports: Callable[[int, int], bool]) -> DecodedRequest:
    """Decode one request frame (without its size prefix).

    `supports(api_key, version)` says what this server serves. As Kafka does
    (SocketServer's parseRequestHeader), a request for an API or version the
    server does not serve is a RemoteProtocolError (close the connection),
    except ApiVersions, whose unsupported versions decode to `body=None` and
    get the v0 UNSUPPORTED_VERSION answer (KIP-511).
    """
    if frame.nbytes < 10:
        peek_request_api(frame)  # raises, saying why
    api_key, api_version, _ = _REQUEST_FIXED.unpack_from(frame, 0)
    if not supports(api_key, api_version):
        what = f"{api_name(api_key)} v{api_version}"
        if api_key != API_VERSIONS_KEY:
            raise RemoteProtocolError(
                f"{what} request: this server does not serve that API version "
                "(as Kafka does, the connection is closed; the client should "
                "have used ApiVersions)"
            )
        # Kafka's rule for ApiVersions headers: v3 and later are flexible.
        try:
            header, _ = parse_request_header(frame, 2 if api_version >= 3 else 1)
        except _HEADER_ERRORS as exc:
            raise RemoteProtocolError(f"{what} request: bad request header: {exc}") from None
        return DecodedRequest(header, None, frame.nbytes)
    codec = api_codec(api_key, api_version)
    try:
        header, pos = parse_request_header(frame, codec.request_header_version)
    except _HEADER_ERRORS as exc:
        raise RemoteProtocolError(
            f"{api_name(api_key)} v{api_version} request: bad request header: {exc}"
        ) from None
    try:
        if codec.kio_reads_request:
            check_lengths(codec.request_type, frame, pos)
        body, size = codec.read_request(frame, pos)
    except RemoteProtocolError as exc:  # the length check's own words
        raise RemoteProtocolError(
            f"{api_name(api_key)} v{api_version} request (correlation id {header.correlation_id}): {exc}"
        ) from None
    except Exception as exc:  # kio raises SerialError, ValueError, ... on garbage
        raise RemoteProtocolError(
            f"{api_name(api_key)} v{api_version} request (correlation id "
            f"{header.correlation_id}): body does not decode: {type(exc).__name__}: {exc}"
        ) from None
    # Bytes after a complete body are ignored, as Kafka's RequestContext does:
    # librdkafka 2.16 sends a 4-byte null array count where Metadata v9+ has
    # a 1-byte compact one, and Kafka brokers serve it.
    return DecodedRequest(header, body, frame.nbytes)


def response_header_bytes(correlation_id: int, response_header_version: int) -> bytes:
    header = _INT32.pack(correlation_id)
    if response_header_version >= 1:
        header += _EMPTY_TAGGED_FIELDS
    return header


def encode_response_header(request_header: RequestHeader) -> bytes:
    """Response header bytes answering `request_header` (no size prefix).

    For hand-built responses: `frame_parts(encode_response_header(h), *body)`.
    """
    codec = api_codec(request_header.api_key, request_header.api_version)
    return response_header_bytes(request_header.correlation_id, codec.response_header_version)


def _check_answers(request_header: RequestHeader, response: Any) -> None:
    key = getattr(response, "__api_key__", None)
    version = getattr(response, "__version__", None)
    if key != request_header.api_key or version != request_header.api_version:
        raise LocalProtocolError(
            f"{type(response).__name__} (api key {key} v{version}) cannot answer a "
            f"{api_name(request_header.api_key)} v{request_header.api_version} "
            "request; build the response class of the request's own version"
        )


def encode_response(request_header: RequestHeader, response: Any) -> bytes:
    """One complete response frame (size prefix, header, kio body) as bytes."""
    _check_answers(request_header, response)
    codec = api_codec(request_header.api_key, request_header.api_version)
    return encode_payload(request_header.correlation_id, codec.response_header_version,
                          codec.write_response, response)


def encode_payload(
    correlation_id: int, response_header_version: int, write: Callable[[Any, Any], None], entity: Any
) -> bytes:
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(response_header_bytes(correlation_id, response_header_version))
    write(out, entity)
    frame = out.getbuffer()
    SIZE_PREFIX.pack_into(frame, 0, frame.nbytes - 4)
    del frame
    return out.getvalue()


def encode_request(correlation_id: int, client_id: str | None, request: Any) -> bytes:
    """One complete request frame for the kio request entity `request`, or
    for a body encoded already (`EncodedRequest`)."""
    codec = api_codec(request.__api_key__, request.__version__)
    encoded = type(request) is EncodedRequest
    if not encoded and type(request) is not codec.request_type:
        raise LocalProtocolError(f"{type(request).__name__} is not a kio request entity")
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_REQUEST_FIXED.pack(codec.api_key, codec.api_version, correlation_id))
    if client_id is None:
        out.write(_INT16.pack(-1))
    else:
        raw = client_id.encode()
        out.write(_INT16.pack(len(raw)))
        out.write(raw)
    if codec.request_header_version >= 2:
        out.write(_EMPTY_TAGGED_FIELDS)
    if encoded:
        out.write(request.body)
    else:
        codec.write_request(out, request)
    frame = out.getbuffer()
    SIZE_PREFIX.pack_into(frame, 0, frame.nbytes - 4)
    del frame
    return out.getvalue()


def decode_response(frame: memoryview, codec: ApiCodec, expected_correlation_id: int) -> Any:
    """The kio response entity in `frame`, which must answer `expected_correlation_id`."""
    what = f"{api_name(codec.api_key)} v{codec.api_version} response"
    try:
        (correlation_id,) = _INT32.unpack_from(frame, 0)
    except struct.error:
        raise RemoteProtocolError(f"{what}: frame too short for a response header") from None
    if correlation_id != expected_correlation_id:
        raise RemoteProtocolError(
            f"{what}: correlation id {correlation_id}, expected "
            f"{expected_correlation_id}; responses must come in request order"
        )
    try:
        pos = 4
        if codec.response_header_version >= 1:
            pos = skip_tagged_fields(frame, pos)
        if codec.kio_reads_response:
            check_lengths(codec.response_type, frame, pos)
        body, size = codec.read_response(frame, pos)
    except Exception as exc:
        raise RemoteProtocolError(f"{what}: does not decode: {type(exc).__name__}: {exc}") from None
    if pos + size != frame.nbytes:
        raise RemoteProtocolError(f"{what}: {frame.nbytes - pos - size} bytes left over after the body")
    return body
