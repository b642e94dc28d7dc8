"""DescribeConfigs and IncrementalAlterConfigs for topic configs.

Theory of operation
-------------------
A topic's dynamic configs are `ConfigRecord`s in the metadata log; a key
that was never set reads as Kafka's default (`topic_configs.TOPIC_CONFIGS`).

* DescribeConfigs lists every known key (or the requested ones) with its
  value and where it comes from: TOPIC_CONFIG (1) when set on the topic,
  DEFAULT_CONFIG (5) otherwise, with synonyms when asked (KIP-226).
* IncrementalAlterConfigs (KIP-339) applies SET, DELETE, APPEND and
  SUBTRACT per key. APPEND/SUBTRACT work on list keys only
  (`cleanup.policy`). Every resulting value is validated before any record
  is written; one bad key fails the whole resource and writes nothing for it.

Broker resources (KIP-226): IncrementalAlterConfigs on (BROKER, "<id>")
or on the cluster-wide default (BROKER, "") writes `ConfigRecord`s for the
keys brokers apply without a restart (`broker_configs.DYNAMIC_BROKER_CONFIGS`);
any other key is refused with INVALID_CONFIG, as Kafka refuses a key it
cannot reconfigure. DescribeConfigs on a broker is answered by that broker
(it alone knows its properties file); this controller answers
INVALID_REQUEST for broker resources sent to it directly.
"""

from __future__ import annotations

from collections import Counter

from kio.schema.describe_configs.v4 import request as dc_req
from kio.schema.describe_configs.v4 import response as dc_resp
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac_req
from kio.schema.incremental_alter_configs.v1 import response as iac_resp

from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.broker_configs import DYNAMIC_BROKER_CONFIGS, broker_config_error
from quorum.metadata.image import ConfigResource, MetadataImage
from quorum.metadata.records import ConfigRecord, ConfigResourceType, Record
from quorum.metadata.topic_configs import TOPIC_CONFIGS, ConfigType, split_list, topic_config_error

TOPIC_CONFIG_SOURCE = 1
DEFAULT_CONFIG_SOURCE = 5

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

_BROKER_REFUSAL = ("describe a broker's configs on that broker (its properties file is there), "
                   "not on the controller")


def topic_config_entries(explicit: dict[str, str], keys: list[str] | None = None,
                         synonyms: bool = False, documentation: bool = False) -> list[dc_resp.DescribeConfigsResourceResult]:
    """DescribeConfigs entries for a topic whose explicitly set configs are `explicit`."""
    out = []
    for name in (keys if keys is not None else sorted(TOPIC_CONFIGS)):
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            continue  # as Kafka: an unknown key asked for is left out
        is_set = name in explicit
        source = TOPIC_CONFIG_SOURCE if is_set else DEFAULT_CONFIG_SOURCE
        syn = []
        if synonyms:
            if is_set:
                syn.append(dc_resp.DescribeConfigsSynonym(name=name, value=explicit[name], source=TOPIC_CONFIG_SOURCE))
            syn.append(dc_resp.DescribeConfigsSynonym(name=name, value=d.default, source=DEFAULT_CONFIG_SOURCE))
        out.append(dc_resp.DescribeConfigsResourceResult(
            name=name, value=explicit.get(name, d.default), read_only=False, config_source=source,
            is_sensitive=False, synonyms=tuple(syn), config_type=int(d.type),
            documentation=d.doc if documentation else None))
    return out


class ConfigControlManager:
    """Stateless: topic config reads and writes against the image."""

    def describe_configs(self, request: dc_req.DescribeConfigsRequest, image: MetadataImage,
                         now_ms: int) -> ControllerResult[dc_resp.DescribeConfigsResponse]:
        results = []
        for r in request.resources or ():  # a null array (kio None) describes nothing
            error, message, entries = ErrorCode.none, None, []
            if r.resource_type != ConfigResourceType.TOPIC:
                error, message = ErrorCode.invalid_request, _BROKER_REFUSAL
            elif image.topic(r.resource_name) is None:
                error, message = ErrorCode.unknown_topic_or_partition, f"Topic '{r.resource_name}' does not exist."
            else:
                # Null (and kio's default, empty) means every key, as clients use it.
                keys = list(r.configuration_keys) if r.configuration_keys else None
                entries = topic_config_entries(dict(image.topic_config(r.resource_name).items()), keys,
                                               request.include_synonyms, request.include_documentation)
            results.append(dc_resp.DescribeConfigsResult(
                error_code=error, error_message=message, resource_type=r.resource_type,
                resource_name=r.resource_name, configs=tuple(entries)))
        return ControllerResult((), dc_resp.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=tuple(results)))

    def incremental_alter_configs(self, request: iac_req.IncrementalAlterConfigsRequest, image: MetadataImage,
                                  now_ms: int) -> ControllerResult[iac_resp.IncrementalAlterConfigsResponse]:
        records: list[Record] = []
        responses = []
        seen: set[tuple[int, str]] = set()
        repeated = {key for key in ((int(r.resource_type), r.resource_name) for r in request.resources)
                    if key in seen or seen.add(key)}
        for r in request.resources:
            if repeated and (int(r.resource_type), r.resource_name) in repeated:
                error, message, changes = ErrorCode.invalid_request, "resource listed more than once", []
            else:
                error, message, changes = self._alter_one(r, image)
            if error == ErrorCode.none and not request.validate_only:
                records += changes
            responses.append(iac_resp.AlterConfigsResourceResponse(
                error_code=error, error_message=message, resource_type=r.resource_type,
                resource_name=r.resource_name))
        return ControllerResult(tuple(records), iac_resp.IncrementalAlterConfigsResponse(
            throttle_time=NO_THROTTLE, responses=tuple(responses)))

    @staticmethod
    def _alter_one(r: iac_req.AlterConfigsResource,
                   image: MetadataImage) -> tuple[ErrorCode, str | None, list[Record]]:
        if r.resource_type == ConfigResourceType.BROKER:
            return ConfigControlManager._alter_broker(r, image)
        if r.resource_type != ConfigResourceType.TOPIC:
            return ErrorCode.invalid_request, f"config resource type {int(r.resource_type)} is not supported", []
        if image.topic_ids_by_name.get(r.resource_name) is None:
            return ErrorCode.unknown_topic_or_partition, f"Topic '{r.resource_name}' does not exist.", []
        if len(r.configs) > 1:
            dupes = [k for k, n in Counter(c.name for c in r.configs).items() if n > 1]
            if dupes:
                return ErrorCode.invalid_request, f"config {dupes[0]} is altered more than once in one request", []
        out: list[Record] = []
        for c in r.configs:
            d = TOPIC_CONFIGS.get(c.name)
            if d is None:
                return ErrorCode.invalid_config, f"Unknown topic config name: {c.name}", []
            op = int(c.config_operation)
            if op == DELETE:
                out.append(ConfigRecord(ConfigResourceType.TOPIC, r.resource_name, c.name, None))
                continue
            if op not in (SET, APPEND, SUBTRACT):
                return ErrorCode.invalid_request, f"unknown config operation {op} for {c.name}", []
            if c.value is None:
                return ErrorCode.invalid_request, f"Null value not supported for : {c.name}", []
            value = c.value
            if op in (APPEND, SUBTRACT):
                if d.type != ConfigType.LIST:
                    verb = "append" if op == APPEND else "subtract"
                    return ErrorCode.invalid_config, f"Config value {verb} is not allowed for config key: {c.name}", []
                items = split_list(image.topic_config(r.resource_name).get(c.name, d.default))
                given = split_list(value)
                if op == APPEND:
                    items += [i for i in given if i not in items]
                else:
                    items = [i for i in items if i not in given]
                value = ",".join(items)
            problem = topic_config_error(c.name, value)
            if problem is not None:
                return ErrorCode.invalid_config, problem, []
            out.append(ConfigRecord(ConfigResourceType.TOPIC, r.resource_name, c.name, value))
        return ErrorCode.none, None, out

    @staticmethod
    def _alter_broker(r: iac_req.AlterConfigsResource,
                      image: MetadataImage) -> tuple[ErrorCode, str | None, list[Record]]:
        name = r.resource_name
        if name != "" and not name.isdigit():
            return (ErrorCode.invalid_request, f"broker resource name {name!r} is not a broker id: use a "
                    "node id, or the empty string for the default of every broker", [])
        current = image.configs.get(ConfigResource(ConfigResourceType.BROKER, name), {})
        out: list[Record] = []
        for c in r.configs:
            op = int(c.config_operation)
            problem = broker_config_error(c.name, "" if op == DELETE else c.value)
            if problem is not None and not (op == DELETE and c.name in DYNAMIC_BROKER_CONFIGS):
                return ErrorCode.invalid_config, problem, []
            if op == DELETE:
                out.append(ConfigRecord(ConfigResourceType.BROKER, name, c.name, None))
                continue
            if op not in (SET, APPEND, SUBTRACT):
                return ErrorCode.invalid_request, f"unknown config operation {op} for {c.name}", []
            if c.value is None:
                return ErrorCode.invalid_request, f"Null value not supported for : {c.name}", []
            value = c.value
            if op in (APPEND, SUBTRACT):
                d = DYNAMIC_BROKER_CONFIGS[c.name]
                if d.type != ConfigType.LIST:
                    verb = "append" if op == APPEND else "subtract"
                    return ErrorCode.invalid_config, f"Config value {verb} is not allowed for config key: {c.name}", []
                items = split_list(current.get(c.name, d.default))
                given = split_list(value)
                items = items + [i for i in given if i not in items] if op == APPEND else \
                    [i for i in items if i not in given]
                value = ",".join(items)
                problem = broker_config_error(c.name, value)
                if problem is not None:
                    return ErrorCode.invalid_config, problem, []
            out.append(ConfigRecord(ConfigResourceType.BROKER, name, c.name, value))
        return ErrorCode.none, None, out
