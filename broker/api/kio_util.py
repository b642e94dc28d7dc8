"""Building kio entities of any version, and moving them between versions (pure).

Kafka's message schemas keep a field's name across versions; a version adds
or drops fields. So a cold-path response can be written once, as keyword
arguments, and `build` keeps the ones the requested version has. `convert`
rebuilds an entity as another version of the same message, recursively:
the broker forwards a client's CreateTopics v4 to the controller as the
version the controller speaks, and turns the answer back into v4.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from types import ModuleType
from typing import Any

from common.wire import RequestHeader, api_codec


def build(cls: type, **fields: Any) -> Any:
    """`cls(**fields)` without the fields `cls` does not have."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in fields.items() if k in names})


def response_module(header: RequestHeader) -> ModuleType:
    """The kio module of the response to this request's API and version."""
    return sys.modules[api_codec(header.api_key, header.api_version).response_type.__module__]


def response_class(header: RequestHeader) -> type:
    return api_codec(header.api_key, header.api_version).response_type


def convert(entity: Any, target: type) -> Any:
    """`entity` rebuilt as the kio class `target` (another version of the
    same message or nested struct): shared fields are carried over
    (converted recursively), fields `target` lacks are dropped, fields
    `entity` lacks take `target`'s defaults."""
    hints = _hints(target)
    kwargs = {}
    for f in dataclasses.fields(target):
        if not hasattr(entity, f.name):
            continue
        kwargs[f.name] = _convert_value(getattr(entity, f.name), hints[f.name])
    return target(**kwargs)


def _convert_value(value: Any, hint: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert_value(value, options[0]) if len(options) == 1 else value
    if origin is tuple:
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(_convert_value(v, item) for v in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and dataclasses.is_dataclass(value):
        return convert(value, hint)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))
