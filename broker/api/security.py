"""SCRAM credentials and ACLs on a broker (KIP-554, KIP-801).

AlterUserScramCredentials, CreateAcls and DeleteAcls go to the controller,
which stores them in the metadata log; the answer waits (up to 30 s) for
this broker's image to show the change, so the next request to this broker
(a SASL login, an authorized produce) sees it. DescribeUserScramCredentials
and DescribeAcls are answered from the image. Changing credentials or ACLs
needs ALTER on the cluster, describing them DESCRIBE (Kafka's rules).
"""

from __future__ import annotations

import datetime
import logging

import trio
from kio.schema.alter_user_scram_credentials.v0.request import AlterUserScramCredentialsRequest
from kio.schema.create_acls.v3.request import CreateAclsRequest
from kio.schema.delete_acls.v3.request import DeleteAclsRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from broker.api.kio_util import build, convert, response_class, response_module
from broker.shell.controller_channel import ask
from common.security.acl import Operation, ResourceType
from common.security.sasl import SCRAM_MECHANISMS
from quorum.controller.security_control import acl_of, filter_of

_NO_THROTTLE = datetime.timedelta(0)
SETTLE_S = 30.0
_SCRAM_NAMES = {code: name for name, code in SCRAM_MECHANISMS.items()}
_log = logging.getLogger("broker.security")


def _cluster_denied(broker, ctx, operation: Operation) -> bool:
    return not broker.authorizer.allowed(ctx, operation, ResourceType.CLUSTER, "kafka-cluster")


async def handle_alter_user_scram_credentials(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    names = [op.name for op in (*body.deletions, *body.upsertions)]

    def every(error, message):
        return build(mod.AlterUserScramCredentialsResponse, throttle_time=_NO_THROTTLE, results=tuple(
            build(mod.AlterUserScramCredentialsResult, user=n, error_code=error, error_message=message)
            for n in dict.fromkeys(names)))

    if _cluster_denied(broker, ctx, Operation.ALTER):
        return every(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed to change credentials")
    answer = await ask(broker.controller, convert(request.body, AlterUserScramCredentialsRequest))
    if answer is None:
        return every(ErrorCode.request_timed_out, "the controller did not answer")
    ok = {r.user for r in answer.results if r.error_code == ErrorCode.none}
    upserted = {(_SCRAM_NAMES.get(int(op.mechanism)), op.name) for op in body.upsertions if op.name in ok}
    deleted = {(_SCRAM_NAMES.get(int(op.mechanism)), op.name) for op in body.deletions if op.name in ok}
    await broker.wait_for_image(
        lambda image: all(k in image.scram_credentials for k in upserted)
        and not any(k in image.scram_credentials for k in deleted), trio.current_time() + SETTLE_S)
    return convert(answer, response_class(request.header))


def handle_describe_user_scram_credentials(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    if _cluster_denied(broker, ctx, Operation.DESCRIBE):
        return build(mod.DescribeUserScramCredentialsResponse, throttle_time=_NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="DESCRIBE on the cluster is needed to list credentials", results=())
    by_user: dict[str, list] = {}
    for (mechanism, user), credential in broker.image.scram_credentials.items():
        by_user.setdefault(user, []).append(build(mod.CredentialInfo, mechanism=i8(SCRAM_MECHANISMS[mechanism]),
                                                  iterations=credential.iterations))
    # Null or empty: every user (Kafka's rule; librdkafka sends an empty list).
    wanted = sorted(by_user) if not body.users else [u.name for u in body.users]
    results = []
    for user in wanted:
        infos = by_user.get(user)
        results.append(build(mod.DescribeUserScramCredentialsResult, user=user,
                             error_code=ErrorCode.none if infos else ErrorCode.resource_not_found,
                             error_message=None if infos else f"user {user} has no SCRAM credential",
                             credential_infos=tuple(sorted(infos or (), key=lambda i: i.mechanism))))
    return build(mod.DescribeUserScramCredentialsResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, results=tuple(results))


async def handle_create_acls(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)

    def every(error, message):
        return build(mod.CreateAclsResponse, throttle_time=_NO_THROTTLE, results=tuple(
            build(mod.AclCreationResult, error_code=error, error_message=message) for _ in body.creations))

    if _cluster_denied(broker, ctx, Operation.ALTER):
        return every(ErrorCode.cluster_authorization_failed, "ALTER on the cluster is needed to create ACLs")
    answer = await ask(broker.controller, convert(request.body, CreateAclsRequest))
    if answer is None:
        return every(ErrorCode.request_timed_out, "the controller did not answer")
    created = []
    for creation, result in zip(convert(body, CreateAclsRequest).creations, answer.results):
        if result.error_code == ErrorCode.none:
            created.append(acl_of(creation))
    await broker.wait_for_image(lambda image: set(created) <= set(image.acls.values()),
                                trio.current_time() + SETTLE_S)
    return convert(answer, response_class(request.header))


async def handle_delete_acls(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    if _cluster_denied(broker, ctx, Operation.ALTER):
        return build(mod.DeleteAclsResponse, throttle_time=_NO_THROTTLE, filter_results=tuple(
            build(mod.DeleteAclsFilterResult, error_code=ErrorCode.cluster_authorization_failed,
                  error_message="ALTER on the cluster is needed to delete ACLs", matching_acls=())
            for _ in body.filters))
    answer = await ask(broker.controller, convert(request.body, DeleteAclsRequest))
    if answer is None:
        return build(mod.DeleteAclsResponse, throttle_time=_NO_THROTTLE, filter_results=tuple(
            build(mod.DeleteAclsFilterResult, error_code=ErrorCode.request_timed_out,
                  error_message="the controller did not answer", matching_acls=()) for _ in body.filters))
    gone = {(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host, m.operation, m.permission_type)
            for r in answer.filter_results for m in r.matching_acls}

    def settled(image) -> bool:
        return not any((a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host, a.operation,
                        a.permission) in gone for a in image.acls.values())

    await broker.wait_for_image(settled, trio.current_time() + SETTLE_S)
    return convert(answer, response_class(request.header))


def handle_describe_acls(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    if _cluster_denied(broker, ctx, Operation.DESCRIBE):
        return build(mod.DescribeAclsResponse, throttle_time=_NO_THROTTLE,
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="DESCRIBE on the cluster is needed to list ACLs", resources=())
    try:
        acl_filter = filter_of(body.resource_type_filter, body.resource_name_filter,
                               getattr(body, "pattern_type_filter", 3), body.principal_filter, body.host_filter,
                               body.operation, body.permission_type)
    except ValueError as exc:
        return build(mod.DescribeAclsResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.invalid_request,
                     error_message=str(exc), resources=())
    resources: dict[tuple[int, str, int], list] = {}
    for acl in broker.image.acls.values():
        if acl_filter.matches(acl):
            resources.setdefault((int(acl.resource_type), acl.resource_name, int(acl.pattern_type)), []).append(
                build(mod.AclDescription, principal=acl.principal, host=acl.host, operation=i8(acl.operation),
                      permission_type=i8(acl.permission)))
    return build(mod.DescribeAclsResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none, error_message=None,
                 resources=tuple(build(mod.DescribeAclsResource, resource_type=i8(t), resource_name=n,
                                       pattern_type=i8(p), acls=tuple(acls))
                                 for (t, n, p), acls in sorted(resources.items())))
