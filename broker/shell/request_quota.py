"""The `request_percentage` quota (KIP-124): the time a client's requests
keep this broker's event loop busy, as a percentage of one thread.

Kafka charges each request's request-handler and network-thread time to
the client's (user, client id). Here one trio thread does both, so a
request is charged the time its handler runs on that thread: the call that
answers it, and for a handler that awaits, each of its steps between
awaits (time spent waiting for replicas or the disk's thread is not the
client's). The charge goes into the same sampled rate as the byte quotas
(`broker.core.client_quotas`), in percent-seconds, so the rate reads in
percent of one thread; over the quota the response carries
throttle_time_ms and the connection reads nothing more for that time.

Follower fetches are not charged: Kafka exempts the inter-broker APIs.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import time
import types

import trio

from broker.core.client_quotas import QuotaEnforcer
from common.wire.codec import DecodedRequest, api_codec, decode_response, encode_payload

PRODUCE_KEY, FETCH_KEY = 0, 1
_THROTTLE_FIELD = "throttle_time"
#: The first Produce version whose response may end with tagged fields.
_PRODUCE_TAGGED_VERSION = 10


def charge(quotas: QuotaEnforcer, ctx, request: DecodedRequest, seconds: float) -> int:
    """Charge `seconds` of loop time to the request's client; the throttle in ms it earned."""
    return quotas.record(ctx.principal, request.header.client_id, seconds * 100.0, trio.current_time())


def exempt(request: DecodedRequest) -> bool:
    """Requests no request quota holds: a follower's fetch (Kafka's ClusterAction APIs)."""
    if request.header.api_key != FETCH_KEY or request.body is None:
        return False
    body = request.body
    state = getattr(body, "replica_state", None)
    replica_id = state.replica_id if state is not None else getattr(body, "replica_id", -1)
    return replica_id >= 0


@types.coroutine
def timed(coro, spent: list[float]):
    """Run `coro` as it is, adding the time of each of its steps (the code
    between two awaits) to `spent[0]`."""
    send, throw = coro.send, coro.throw
    value, error = None, None
    while True:
        started = time.perf_counter()
        try:
            yielded = throw(error) if error is not None else send(value)
        except StopIteration as stop:
            spent[0] += time.perf_counter() - started
            return stop.value
        except BaseException:
            spent[0] += time.perf_counter() - started
            raise
        spent[0] += time.perf_counter() - started
        try:
            value, error = (yield yielded), None
        except BaseException as exc:  # a cancellation, delivered into the handler
            value, error = None, exc


def with_throttle(request: DecodedRequest, response, throttle_ms: int):
    """`response` with throttle_time_ms at least `throttle_ms`, where its
    shape allows (a kio response, or a hand-built frame of an API whose
    throttle time is the first or, for Produce, the last field)."""
    if response is None:
        return None
    if hasattr(response, "__api_key__"):
        if not hasattr(response, _THROTTLE_FIELD):
            return response
        current = getattr(response, _THROTTLE_FIELD)
        wanted = datetime.timedelta(milliseconds=throttle_ms)
        return dataclasses.replace(response, **{_THROTTLE_FIELD: max(current, wanted)})
    parts = response if isinstance(response, list) else [response]
    first = parts[0] if parts else None
    if not isinstance(first, (bytes, bytearray)):
        return response
    header = request.header
    fields = _field_names(header.api_key, header.api_version)
    if header.api_key == PRODUCE_KEY and header.api_version >= _PRODUCE_TAGGED_VERSION and len(parts) == 1:
        # From v10 the body may end with tagged fields of any length (the
        # leaders' endpoints, KIP-951) after throttle_time_ms: read it whole.
        codec = api_codec(header.api_key, header.api_version)
        body = decode_response(memoryview(first)[4:], codec, header.correlation_id)
        if body.throttle_time >= datetime.timedelta(milliseconds=throttle_ms):
            return response
        body = dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=throttle_ms))
        return encode_payload(header.correlation_id, codec.response_header_version, codec.write_response, body)
    if fields[0] == _THROTTLE_FIELD:
        # size, correlation id, and the header's empty tag buffer in header v1.
        at = 8 + _header_tags(header.api_key, header.api_version)
        if len(first) < at + 4:
            return response
    elif header.api_key == PRODUCE_KEY and fields[-1] == _THROTTLE_FIELD and len(parts) == 1:
        # Produce's throttle time ends the body, before its tag buffer when flexible.
        at = len(first) - 4 - _header_tags(header.api_key, header.api_version)
    else:
        return response
    current = int.from_bytes(first[at:at + 4], "big", signed=True)
    if current >= throttle_ms:
        return response
    patched = bytes(first[:at]) + throttle_ms.to_bytes(4, "big") + bytes(first[at + 4:])
    return [patched, *parts[1:]] if isinstance(response, list) else patched


@functools.cache
def _field_names(api_key: int, api_version: int) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(api_codec(api_key, api_version).response_type))


@functools.cache
def _header_tags(api_key: int, api_version: int) -> int:
    return 1 if api_codec(api_key, api_version).response_header_version >= 1 else 0
