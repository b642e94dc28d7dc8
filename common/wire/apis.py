"""Which APIs a server serves, and its ApiVersions answers (pure).

Theory of operation
-------------------
Each server (controller listener, broker listener) declares the API keys and
version ranges it serves in a `SupportedApis`. The wire server uses it to
refuse anything else (closing the connection, as Kafka does) and to answer
ApiVersions itself, so handlers never see ApiVersions requests:

- a supported ApiVersions version gets the declared list, with the features
  of KIP-584 in v3+ (`supported_features`, `finalized_features`);
- an unsupported ApiVersions version (a newer client) gets a v0 response
  with UNSUPPORTED_VERSION and our ApiVersions range, in response header v0;
  the client retries with the highest version we listed (KIP-511). Like
  Kafka we list only ApiVersions itself in that answer.
- a v3+ request whose client_software_name/version are not of the form
  KIP-511 requires gets INVALID_REQUEST, as Kafka does.

ApiVersions (key 18) is always declared; `SupportedApis()` starts with the
v0..v4 kio knows.
"""

from __future__ import annotations

import datetime
import re
import sys
from dataclasses import dataclass
from types import ModuleType

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from common.wire.codec import (
    API_VERSIONS_KEY,
    DecodedRequest,
    api_codec,
    api_name,
    encode_payload,
)
from common.wire.errors import LocalProtocolError

# KIP-511: client software names and versions are restricted to this shape.
_SOFTWARE_FIELD = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_API_VERSIONS_MAX = 4


@dataclass(frozen=True, slots=True)
class Feature:
    """A KIP-584 feature: supported range, or finalized range when finalized."""

    name: str
    min_version: int
    max_version: int


class SupportedApis:
    """The (api_key -> min..max version) a server serves.

    Declaring a range checks that kio has a schema for every version in it
    and warms the codec cache for them, so no request pays for a schema
    lookup. Declarations are made before serving; the feature fields may be
    updated at any time (e.g. when the metadata image moves).
    """

    def __init__(self) -> None:
        self._ranges: dict[int, tuple[int, int]] = {}
        self.supported_features: tuple[Feature, ...] = ()
        self.finalized_features: tuple[Feature, ...] = ()
        self.finalized_features_epoch: int = -1
        self.declare(API_VERSIONS_KEY, 0, _API_VERSIONS_MAX)

    def declare(self, api_key: int, min_version: int, max_version: int) -> SupportedApis:
        """Serve `api_key` versions min_version..max_version (inclusive)."""
        if not 0 <= min_version <= max_version:
            raise LocalProtocolError(
                f"{api_name(api_key)}: bad version range {min_version}..{max_version}"
            )
        for version in range(min_version, max_version + 1):
            api_codec(api_key, version)
        self._ranges[api_key] = (min_version, max_version)
        return self

    def supports(self, api_key: int, api_version: int) -> bool:
        version_range = self._ranges.get(api_key)
        return version_range is not None and version_range[0] <= api_version <= version_range[1]

    def version_range(self, api_key: int) -> tuple[int, int] | None:
        return self._ranges.get(api_key)

    def items(self) -> list[tuple[int, int, int]]:
        """[(api_key, min_version, max_version)] sorted by api key."""
        return [(key, lo, hi) for key, (lo, hi) in sorted(self._ranges.items())]

    def api_versions_response(self, request: DecodedRequest) -> bytes:
        """The complete response frame answering an ApiVersions request."""
        header = request.header
        assert header.api_key == API_VERSIONS_KEY
        if request.body is None:
            return self._unsupported_version_response(header.correlation_id)
        version = header.api_version
        codec = api_codec(API_VERSIONS_KEY, version)
        module = _response_module(version)
        error = ErrorCode.none
        if version >= 3 and not (
            _SOFTWARE_FIELD.fullmatch(request.body.client_software_name)
            and _SOFTWARE_FIELD.fullmatch(request.body.client_software_version)
        ):
            error = ErrorCode.invalid_request
        api_keys = tuple(
            module.ApiVersion(api_key=i16(key), min_version=i16(lo), max_version=i16(hi))
            for key, lo, hi in self.items()
        )
        fields: dict = {"error_code": error, "api_keys": api_keys}
        if version >= 1:
            fields["throttle_time"] = datetime.timedelta(0)
        if version >= 3:
            fields["supported_features"] = tuple(
                module.SupportedFeatureKey(
                    name=f.name, min_version=i16(f.min_version), max_version=i16(f.max_version)
                )
                for f in self.supported_features
            )
            fields["finalized_features_epoch"] = i64(self.finalized_features_epoch)
            fields["finalized_features"] = tuple(
                module.FinalizedFeatureKey(
                    name=f.name,
                    min_version_level=i16(f.min_version),
                    max_version_level=i16(f.max_version),
                )
                for f in self.finalized_features
            )
        response = codec.response_type(**fields)
        return encode_payload(header.correlation_id, 0, codec.write_response, response)

    def _unsupported_version_response(self, correlation_id: int) -> bytes:
        codec = api_codec(API_VERSIONS_KEY, 0)
        lo, hi = self._ranges[API_VERSIONS_KEY]
        module = _response_module(0)
        response = codec.response_type(
            error_code=ErrorCode.unsupported_version,
            api_keys=(
                module.ApiVersion(
                    api_key=i16(API_VERSIONS_KEY), min_version=i16(lo), max_version=i16(hi)
                ),
            ),
        )
        return encode_payload(correlation_id, 0, codec.write_response, response)


def _response_module(version: int) -> ModuleType:
    return sys.modules[api_codec(API_VERSIONS_KEY, version).response_type.__module__]
