"""DescribeClientQuotas and AlterClientQuotas (KIP-546) on a broker.

AlterClientQuotas goes to the controller, which stores each change as a
`ClientQuotaRecord`; the answer waits (up to 30 s) for this broker's image to
show it, so the next request here is held to the new quota.
DescribeClientQuotas is answered from the image, as a Kafka broker does.
Altering quotas needs ALTER_CONFIGS on the cluster, describing them
DESCRIBE_CONFIGS (Kafka's rules).
"""

from __future__ import annotations

import datetime
import logging

import trio
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest
from kio.schema.errors import ErrorCode

from broker.api.kio_util import build, convert, response_class, response_module
from broker.shell.controller_channel import ask
from common.security.acl import Operation, ResourceType
from quorum.metadata.client_quotas import ENTITY_TYPES, entity_of

_NO_THROTTLE = datetime.timedelta(0)
SETTLE_S = 30.0
#: DescribeClientQuotas match types: a given name, the default entity, any named entity.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
_log = logging.getLogger("broker.quotas")


def _denied(broker, ctx, operation: Operation) -> bool:
    return not broker.authorizer.allowed(ctx, operation, ResourceType.CLUSTER, "kafka-cluster")


def _filter_problem(components) -> str | None:
    seen = set()
    for c in components:
        if c.entity_type not in ENTITY_TYPES:
            return f"entity type {c.entity_type!r} is not supported: use 'user', 'client-id' or 'ip'"
        if c.entity_type in seen:
            return f"entity type {c.entity_type!r} appears twice in the filter"
        seen.add(c.entity_type)
        if int(c.match_type) not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return f"match type {int(c.match_type)} is unknown: use 0 (exact), 1 (default) or 2 (any)"
        if int(c.match_type) == MATCH_EXACT and c.match is None:
            return "an exact match needs a name"
    return None


def _matches(entity, components, strict: bool) -> bool:
    names = dict(entity)
    for c in components:
        if c.entity_type not in names:
            return False
        name, match_type = names[c.entity_type], int(c.match_type)
        if match_type == MATCH_EXACT and name != c.match:
            return False
        if match_type == MATCH_DEFAULT and name is not None:
            return False
        if match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or len(names) == len(components)


def handle_describe_client_quotas(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)

    def error(code, message):
        return build(mod.DescribeClientQuotasResponse, throttle_time=_NO_THROTTLE, error_code=code,
                     error_message=message, entries=None)

    if _denied(broker, ctx, Operation.DESCRIBE_CONFIGS):
        return error(ErrorCode.cluster_authorization_failed, "DESCRIBE_CONFIGS on the cluster is needed")
    problem = _filter_problem(body.components)
    if problem is not None:
        return error(ErrorCode.invalid_request, problem)
    entries = []
    for entity, values in sorted(broker.image.client_quotas.items(),
                                 key=lambda kv: [(t, n or "") for t, n in kv[0]]):
        if _matches(entity, body.components, body.strict):
            entries.append(build(
                mod.EntryData,
                entity=tuple(build(mod.EntityData, entity_type=t, entity_name=n) for t, n in entity),
                values=tuple(build(mod.ValueData, key=k, value=v) for k, v in sorted(values.items()))))
    return build(mod.DescribeClientQuotasResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, entries=tuple(entries))


async def handle_alter_client_quotas(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)

    def every(code, message):
        return build(mod.AlterClientQuotasResponse, throttle_time=_NO_THROTTLE, entries=tuple(
            build(mod.EntryData, error_code=code, error_message=message, entity=tuple(
                build(mod.EntityData, entity_type=e.entity_type, entity_name=e.entity_name) for e in x.entity))
            for x in body.entries))

    if _denied(broker, ctx, Operation.ALTER_CONFIGS):
        return every(ErrorCode.cluster_authorization_failed, "ALTER_CONFIGS on the cluster is needed")
    answer = await ask(broker.controller, convert(body, AlterClientQuotasRequest))
    if answer is None:
        return every(ErrorCode.request_timed_out, "the controller did not answer; retry")
    if not body.validate_only:
        changes = []
        for entry, result in zip(body.entries, answer.entries):
            if result.error_code == ErrorCode.none:
                entity = entity_of((e.entity_type, e.entity_name) for e in entry.entity)
                changes += [(entity, op.key, None if op.remove else float(op.value)) for op in entry.ops]

        def shown(image) -> bool:
            return all(image.client_quotas.get(entity, {}).get(key) == value for entity, key, value in changes)

        await broker.wait_for_image(shown, trio.current_time() + SETTLE_S)
    return convert(answer, response_class(request.header))
