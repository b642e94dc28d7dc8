"""DescribeConfigs answered by the broker; AlterConfigs as IncrementalAlterConfigs.

Theory of operation
-------------------
DescribeConfigs for topics and brokers is answered from this broker's
metadata image and its own properties, as Kafka's brokers do: a client
sends a broker resource to that broker (only it knows its properties
file), and any broker can describe a topic or the cluster-wide broker
default (resource name ""). Other resource types go to the controller.

A broker key's value and source follow KIP-226's precedence
(`quorum.metadata.broker_configs`): DYNAMIC_BROKER_CONFIG, then
DYNAMIC_DEFAULT_BROKER_CONFIG, then STATIC_BROKER_CONFIG, then
DEFAULT_CONFIG. A topic key not set on the topic takes the value of its
broker synonym (`log.retention.hours` for `retention.ms`, converted to
milliseconds) with that synonym's source, else Kafka's default.
Describing the default resource "" lists only the dynamic defaults set,
as Kafka does.

AlterConfigs (the legacy, non-incremental API) replaces a resource's
whole dynamic config: the broker turns it into an IncrementalAlterConfigs
that SETs every given key and DELETEs every other key set today, and
forwards that to the controller.
"""

from __future__ import annotations

import datetime
import logging

import trio

from kio.schema.describe_configs.v4 import response as dc_resp
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac_req

from broker.api.kio_util import build, convert, response_class, response_module
from broker.shell.controller_channel import ControllerUnavailableError
from common.wire import ConnectionFailedError
from quorum.metadata.broker_configs import (
    DEFAULT_SOURCE,
    DYNAMIC_BROKER_CONFIGS,
    DYNAMIC_BROKER_SOURCE,
    DYNAMIC_DEFAULT_BROKER_SOURCE,
    STATIC_BROKER_SOURCE,
    broker_value,
    default_value,
)
from quorum.metadata.image import ConfigResource
from quorum.metadata.records import ConfigResourceType
from quorum.metadata.topic_configs import TOPIC_CONFIGS, ConfigType

TOPIC_SOURCE = 1
_NO_THROTTLE = datetime.timedelta(0)
_SET, _DELETE = 0, 1
#: How long an answered change waits to show in this broker's image.
_SETTLE_S = 5.0
#: Static keys whose values must not be shown (Kafka marks them sensitive).
_SENSITIVE = ("password", "secret", "sasl.jaas.config", "ssl.keystore.key")

_log = logging.getLogger("broker.configs")


def _levels(broker, image) -> list[tuple[int, dict[str, str]]]:
    """The broker-level config maps, highest precedence first, with their sources."""
    return [
        (DYNAMIC_BROKER_SOURCE, dict(image.configs.get(ConfigResource(ConfigResourceType.BROKER,
                                                                      str(broker.node_id)), {}))),
        (DYNAMIC_DEFAULT_BROKER_SOURCE, dict(image.configs.get(ConfigResource(ConfigResourceType.BROKER, ""), {}))),
        (STATIC_BROKER_SOURCE, dict(broker.config.properties)),
    ]


def _entry(name, value, source, read_only, synonyms, config_type, doc, want_synonyms, want_doc):
    sensitive = any(s in name for s in _SENSITIVE)
    return dc_resp.DescribeConfigsResourceResult(
        name=name, value=None if sensitive else value, read_only=read_only, config_source=source,
        is_sensitive=sensitive, synonyms=tuple(synonyms) if want_synonyms else (),
        config_type=config_type, documentation=doc if want_doc else None)


def broker_entries(broker, image, keys, want_synonyms, want_doc) -> list[dc_resp.DescribeConfigsResourceResult]:
    levels = _levels(broker, image)
    names = sorted(set(DYNAMIC_BROKER_CONFIGS) | set(broker.config.properties))
    out = []
    for name in (keys if keys is not None else names):
        d = DYNAMIC_BROKER_CONFIGS.get(name)
        found = [(src, values[name]) for src, values in levels if name in values]
        if d is None and not found:
            continue  # as Kafka: an unknown key asked for is left out
        default = default_value(name)
        synonyms = [dc_resp.DescribeConfigsSynonym(name=name, value=v, source=src) for src, v in found]
        if default is not None:
            synonyms.append(dc_resp.DescribeConfigsSynonym(name=name, value=default, source=DEFAULT_SOURCE))
        source, value = found[0] if found else (DEFAULT_SOURCE, default)
        out.append(_entry(name, value, source, d is None, synonyms,
                          int(d.type) if d is not None else int(ConfigType.STRING),
                          d.doc if d is not None else None, want_synonyms, want_doc))
    return out


def default_broker_entries(image, keys, want_synonyms, want_doc) -> list[dc_resp.DescribeConfigsResourceResult]:
    values = dict(image.configs.get(ConfigResource(ConfigResourceType.BROKER, ""), {}))
    out = []
    for name in sorted(values) if keys is None else [k for k in keys if k in values]:
        d = DYNAMIC_BROKER_CONFIGS.get(name)
        syn = [dc_resp.DescribeConfigsSynonym(name=name, value=values[name], source=DYNAMIC_DEFAULT_BROKER_SOURCE)]
        out.append(_entry(name, values[name], DYNAMIC_DEFAULT_BROKER_SOURCE, False, syn,
                          int(d.type) if d is not None else int(ConfigType.STRING),
                          d.doc if d is not None else None, want_synonyms, want_doc))
    return out


def topic_entries(broker, image, topic, keys, want_synonyms, want_doc) -> list[dc_resp.DescribeConfigsResourceResult]:
    explicit = dict(image.topic_config(topic))
    levels = _levels(broker, image)
    out = []
    for name in (keys if keys is not None else sorted(TOPIC_CONFIGS)):
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            continue
        synonyms = []
        if name in explicit:
            synonyms.append(dc_resp.DescribeConfigsSynonym(name=name, value=explicit[name], source=TOPIC_SOURCE))
        for src, values in levels:
            found = broker_value(name, values)
            if found is not None:
                synonyms.append(dc_resp.DescribeConfigsSynonym(name=found[0], value=values[found[0]], source=src))
        synonyms.append(dc_resp.DescribeConfigsSynonym(name=name, value=d.default, source=DEFAULT_SOURCE))
        if name in explicit:
            value, source = explicit[name], TOPIC_SOURCE
        else:
            value, source = d.default, DEFAULT_SOURCE
            for src, values in levels:
                found = broker_value(name, values)
                if found is not None:
                    value, source = found[1], src
                    break
        out.append(_entry(name, value, source, False, synonyms, int(d.type), d.doc, want_synonyms, want_doc))
    return out


def _describe_one(broker, r, want_synonyms, want_doc):
    image = broker.image
    keys = list(r.configuration_keys) if r.configuration_keys else None
    if int(r.resource_type) == ConfigResourceType.TOPIC:
        if image.topic(r.resource_name) is None:
            return ErrorCode.unknown_topic_or_partition, f"Topic '{r.resource_name}' does not exist.", []
        return ErrorCode.none, None, topic_entries(broker, image, r.resource_name, keys, want_synonyms, want_doc)
    if r.resource_name == "":
        return ErrorCode.none, None, default_broker_entries(image, keys, want_synonyms, want_doc)
    if r.resource_name != str(broker.node_id):
        return (ErrorCode.invalid_request, f"Unexpected broker id, expected {broker.node_id} or empty string, "
                f"but received {r.resource_name}: send DescribeConfigs for a broker to that broker", [])
    return ErrorCode.none, None, broker_entries(broker, image, keys, want_synonyms, want_doc)


def is_local(resource) -> bool:
    return int(resource.resource_type) in (ConfigResourceType.TOPIC, ConfigResourceType.BROKER)


def describe_locally(broker, request) -> dc_resp.DescribeConfigsResponse:
    """The v4 answer for the topic and broker resources of `request.body`."""
    body = request.body
    want_synonyms = bool(getattr(body, "include_synonyms", False))
    want_doc = bool(getattr(body, "include_documentation", False))
    results = []
    for r in body.resources or ():
        error, message, entries = _describe_one(broker, r, want_synonyms, want_doc)
        results.append(dc_resp.DescribeConfigsResult(
            error_code=error, error_message=message, resource_type=r.resource_type,
            resource_name=r.resource_name, configs=tuple(entries)))
    return dc_resp.DescribeConfigsResponse(throttle_time=_NO_THROTTLE, results=tuple(results))


async def handle_alter_configs(broker, ctx, request):
    """AlterConfigs v0-v2: the module doc."""
    body = request.body
    resources = []
    for r in body.resources:
        given = {c.name: c.value for c in r.configs}
        current = broker.image.configs.get(ConfigResource(int(r.resource_type), r.resource_name), {})
        ops = [iac_req.AlterableConfig(name=k, config_operation=_SET, value=v) for k, v in given.items()]
        ops += [iac_req.AlterableConfig(name=k, config_operation=_DELETE, value=None)
                for k in sorted(current) if k not in given]
        resources.append(iac_req.AlterConfigsResource(resource_type=r.resource_type,
                                                      resource_name=r.resource_name, configs=tuple(ops)))
    mod = response_module(request.header)
    incremental = iac_req.IncrementalAlterConfigsRequest(resources=tuple(resources),
                                                         validate_only=body.validate_only)
    try:
        answer = await broker.controller.send(incremental)
    except (ControllerUnavailableError, ConnectionFailedError) as exc:
        _log.warning("no answer from the controller: %s", exc)
        return build(mod.AlterConfigsResponse, throttle_time=_NO_THROTTLE, responses=tuple(
            build(mod.AlterConfigsResourceResponse, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer", resource_type=r.resource_type,
                  resource_name=r.resource_name) for r in body.resources))
    if not body.validate_only:
        ok = {(int(r.resource_type), r.resource_name) for r in answer.responses if r.error_code == ErrorCode.none}
        wanted = {(int(r.resource_type), r.resource_name): {c.name: c.value for c in r.configs}
                  for r in body.resources}

        def shown(image) -> bool:
            return all(dict(image.configs.get(ConfigResource(*key), {})) == wanted[key] for key in ok)

        # A client that reads its change back next must find it here.
        await broker.wait_for_image(shown, trio.current_time() + _SETTLE_S)
    return convert(answer, response_class(request.header))

