"""OffsetCommit and OffsetFetch v10 (Kafka 4.1): topics named by id.

The group coordinator keeps offsets by topic name, as `__consumer_offsets`
stores them. A v10 request is answered by turning it into its v9 twin (ids
to names from the broker's metadata image), letting the coordinator answer
that, and turning the answer back (names to ids). A topic id the broker
does not know is answered with UNKNOWN_TOPIC_ID on each of its partitions,
as Kafka does, and never reaches the coordinator.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
TOPIC_ID_VERSION = 10


def _module(key: int, version: int, kind: str) -> Any:
    api = "offset_commit" if key == OFFSET_COMMIT else "offset_fetch"
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def _convert(obj: Any, mod: Any, name_of: Any, id_of: Any) -> Any:
    """`obj` as the same-named entity of `mod`, `name` and `topic_id` swapped."""
    if isinstance(obj, tuple):
        return tuple(_convert(o, mod, name_of, id_of) for o in obj)
    if not dataclasses.is_dataclass(obj):
        return obj
    cls = getattr(mod, type(obj).__name__)
    values = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name == "topic_id":
            values["name"] = name_of(value)
        elif f.name == "name" and "topic_id" in cls.__dataclass_fields__:
            values["topic_id"] = id_of(value)
        else:
            values[f.name] = _convert(value, mod, name_of, id_of)
    return cls(**values)


def serve(broker: Any, ctx: Any, request: Any, inner: Any) -> Any:
    """Answer a v10 `request` with `inner(ctx, twin)`, the broker's way of
    answering its v9 twin (authorization included)."""
    key, version = request.header.api_key, request.header.api_version
    by_id = broker.image.topics_by_id
    names = {tid: t.name for tid, t in by_id.items()}
    ids = {name: tid for tid, name in names.items()}
    body = request.body
    unknown: dict[str, list[tuple[uuid.UUID, tuple[int, ...]]]] = {}

    def known(group_id: str, topics: Any) -> Any:
        if topics is None:
            return None
        for t in topics:
            if t.topic_id not in names:
                parts = t.partitions if key == OFFSET_COMMIT else t.partition_indexes
                unknown.setdefault(group_id, []).append(
                    (t.topic_id, tuple(p.partition_index if key == OFFSET_COMMIT else p for p in parts)))
        return tuple(t for t in topics if t.topic_id in names)

    if key == OFFSET_COMMIT:
        body = dataclasses.replace(body, topics=known(body.group_id, body.topics))
    else:
        body = dataclasses.replace(body, groups=tuple(
            dataclasses.replace(g, topics=known(g.group_id, g.topics)) for g in body.groups))
    older = _convert(body, _module(key, TOPIC_ID_VERSION - 1, "request"), names.get, ids.get)
    twin = request._replace(header=request.header._replace(api_version=TOPIC_ID_VERSION - 1), body=older)
    ctx.stand_in(request, twin)
    answer = inner(ctx, twin)
    return _finish(ctx, twin, answer, key, version, names.get, ids.get, unknown)


async def _finish(ctx, twin, answer, key, version, name_of, id_of, unknown):
    try:
        if inspect.isawaitable(answer):
            answer = await answer
    finally:
        ctx.end_stand_in(twin)
    mod = _module(key, version, "response")
    response = _convert(answer, mod, name_of, id_of)
    if key == OFFSET_COMMIT:
        refused = tuple(mod.OffsetCommitResponseTopic(topic_id=tid, partitions=tuple(
            mod.OffsetCommitResponsePartition(partition_index=p, error_code=ErrorCode.unknown_topic_id)
            for p in parts)) for tid, parts in unknown.get(twin.body.group_id, ()))
        return dataclasses.replace(response, topics=tuple(response.topics) + refused)

    def refused_topics(group_id: str) -> tuple:
        return tuple(mod.OffsetFetchResponseTopics(topic_id=tid, partitions=tuple(
            mod.OffsetFetchResponsePartitions(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                              metadata=None, error_code=ErrorCode.unknown_topic_id)
            for p in parts)) for tid, parts in unknown.get(group_id, ()))

    return dataclasses.replace(response, groups=tuple(
        dataclasses.replace(g, topics=tuple(g.topics) + refused_topics(g.group_id)) for g in response.groups))
