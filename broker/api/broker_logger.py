"""The BROKER_LOGGER config resource (type 8): a broker's log levels, as Kafka serves them.

DescribeConfigs on `(BROKER_LOGGER, "<broker id>")` lists every logger of
the process (and `root`) with its effective level; IncrementalAlterConfigs
SETs a logger's level or DELETEs it (the logger inherits its parent's
again) at once, on this broker only, until it restarts (then `log.level`
and `log.level.<logger>` of its config apply again), as Kafka's
Log4jController does. Kafka's errors: another broker's id, APPEND or
SUBTRACT, or removing the root's level is INVALID_REQUEST; an unknown
level or logger is INVALID_CONFIG.

`install(handlers, node_id)` wraps the broker's DescribeConfigs and
IncrementalAlterConfigs handlers: BROKER_LOGGER resources are answered
here, the others go to the wrapped handler (the controller's configs),
and the answers come back in the request's order.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from broker.api.kio_util import build, response_module
from common.logs import LEVEL_CHOICES, ROOT_LOGGER, _LEVELS, logger_exists, logger_levels, set_logger_level

_log = logging.getLogger("broker.logger_config")

BROKER_LOGGER = 8
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
#: Kafka's ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG.
DYNAMIC_BROKER_LOGGER_CONFIG = 6
#: ConfigType STRING (DescribeConfigs v3+).
STRING = 2
_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3


def install(handlers: dict, node_id: int) -> None:
    """Answer BROKER_LOGGER resources of DescribeConfigs and IncrementalAlterConfigs here."""
    for api_key, own in ((DESCRIBE_CONFIGS, _describe), (INCREMENTAL_ALTER_CONFIGS, _alter)):
        if api_key in handlers:
            handlers[api_key] = _split(handlers[api_key], own, node_id)


def _split(inner, own, node_id: int):
    async def handle(broker, ctx, request):
        resources = request.body.resources or ()
        if not any(int(r.resource_type) == BROKER_LOGGER for r in resources):
            return await inner(broker, ctx, request)
        mod = response_module(request.header)
        mine = {i: own(mod, request, r, node_id) for i, r in enumerate(resources)
                if int(r.resource_type) == BROKER_LOGGER}
        others = [r for r in resources if int(r.resource_type) != BROKER_LOGGER]
        answered = []
        if others:
            body = dataclasses.replace(request.body, resources=tuple(others))
            response = await inner(broker, ctx, request._replace(body=body))
            answered = list(response.results if hasattr(response, "results") else response.responses)
        else:
            response = None
        merged = []
        rest = iter(answered)
        for i in range(len(resources)):
            merged.append(mine[i] if i in mine else next(rest))
        if request.header.api_key == DESCRIBE_CONFIGS:
            if response is None:
                return build(mod.DescribeConfigsResponse, throttle_time=_no_throttle(mod), results=tuple(merged))
            return dataclasses.replace(response, results=tuple(merged))
        if response is None:
            return build(mod.IncrementalAlterConfigsResponse, throttle_time=_no_throttle(mod),
                         responses=tuple(merged))
        return dataclasses.replace(response, responses=tuple(merged))

    return handle


def _no_throttle(mod):
    return datetime.timedelta(0)


def _wrong_broker(resource, node_id: int) -> str | None:
    if resource.resource_name != str(node_id):
        return (f"unexpected broker id {resource.resource_name!r}: this is broker {node_id}; send a "
                "BROKER_LOGGER request to the broker whose levels it names")
    return None


def _describe(mod, request, resource, node_id: int):
    wrong = _wrong_broker(resource, node_id)
    if wrong is not None:
        return build(mod.DescribeConfigsResult, error_code=ErrorCode.invalid_request, error_message=wrong,
                     resource_type=resource.resource_type, resource_name=resource.resource_name, configs=())
    levels = logger_levels()
    keys = resource.configuration_keys
    names = list(levels) if keys is None else [k for k in keys if k in levels]
    configs = tuple(build(mod.DescribeConfigsResourceResult, name=name, value=levels[name], read_only=False,
                          is_default=False, config_source=i8(DYNAMIC_BROKER_LOGGER_CONFIG), is_sensitive=False,
                          synonyms=(), config_type=i8(STRING), documentation=None) for name in names)
    return build(mod.DescribeConfigsResult, error_code=ErrorCode.none, error_message=None,
                 resource_type=resource.resource_type, resource_name=resource.resource_name, configs=configs)


def _alter(mod, request, resource, node_id: int):
    def answer(error: ErrorCode, message: str | None = None):
        return build(mod.AlterConfigsResourceResponse, error_code=error, error_message=message,
                     resource_type=resource.resource_type, resource_name=resource.resource_name)

    wrong = _wrong_broker(resource, node_id)
    if wrong is not None:
        return answer(ErrorCode.invalid_request, wrong)
    changes = []
    for config in resource.configs:
        op = int(config.config_operation)
        if op in (_APPEND, _SUBTRACT):
            return answer(ErrorCode.invalid_request, f"{'APPEND' if op == _APPEND else 'SUBTRACT'} is not an "
                          f"operation on a logger's level ({config.name}); use SET or DELETE")
        if op not in (_SET, _DELETE):
            return answer(ErrorCode.invalid_request, f"unknown config operation {op} on logger {config.name}")
        if not logger_exists(config.name):
            return answer(ErrorCode.invalid_config, f"logger {config.name} does not exist on broker {node_id}; "
                          "DescribeConfigs on BROKER_LOGGER lists the loggers")
        if op == _DELETE:
            if config.name == ROOT_LOGGER:
                return answer(ErrorCode.invalid_request, "removing the level of the root logger is not allowed; "
                              "SET it instead")
            changes.append((config.name, None))
            continue
        level = _LEVELS.get((config.value or "").strip().upper())
        if level is None:
            return answer(ErrorCode.invalid_config, f"{config.value!r} is not a log level for {config.name}; use "
                          f"{LEVEL_CHOICES}")
        changes.append((config.name, level))
    if not request.body.validate_only:
        for name, level in changes:
            set_logger_level(name, level)
            _log.info("logger %s: level %s (IncrementalAlterConfigs)", name,
                      "inherited" if level is None else logging.getLevelName(level))
    return answer(ErrorCode.none)
