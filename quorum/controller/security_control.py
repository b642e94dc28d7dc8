"""SCRAM credentials (KIP-554) and ACLs (KIP-801) in the metadata log: the
controller's decisions for AlterUserScramCredentials, CreateAcls and
DeleteAcls. Pure: request and working image in, records and response out."""

from __future__ import annotations

import random
import uuid
from typing import Any

from kio.schema.alter_user_scram_credentials.v0 import response as ausc_resp
from kio.schema.create_acls.v3 import response as ca_resp
from kio.schema.delete_acls.v3 import response as da_resp
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from common.security.acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from common.security.sasl import SCRAM_MAX_ITERATIONS, SCRAM_MECHANISMS, SCRAM_MIN_ITERATIONS, ScramCredential
from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import (
    AccessControlEntryRecord,
    Record,
    RemoveAccessControlEntryRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)

_SCRAM_NAMES = {code: name for name, code in SCRAM_MECHANISMS.items()}


class SecurityControlManager:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    # --- SCRAM credentials -------------------------------------------------

    def alter_user_scram_credentials(self, request: Any, image: MetadataImage,
                                     _now_ms: int) -> ControllerResult[Any]:
        records: list[Record] = []
        errors: dict[str, tuple[ErrorCode, str | None]] = {}
        touched: dict[str, int] = {}
        for op in (*request.deletions, *request.upsertions):
            touched[op.name] = touched.get(op.name, 0) + 1
        # Kafka refuses two changes of one user's mechanism in one request.
        seen: set[tuple[str, int]] = set()
        duplicates = set()
        for op in (*request.deletions, *request.upsertions):
            key = (op.name, int(op.mechanism))
            if key in seen:
                duplicates.add(op.name)
            seen.add(key)
        for name in duplicates:
            errors[name] = (ErrorCode.duplicate_resource, "a user's mechanism may be changed once per request")
        for op in request.deletions:
            if op.name in errors:
                continue
            mechanism = _SCRAM_NAMES.get(int(op.mechanism))
            if mechanism is None:
                errors[op.name] = (ErrorCode.unsupported_sasl_mechanism, f"unknown SCRAM mechanism {op.mechanism}")
            elif (mechanism, op.name) not in image.scram_credentials:
                errors[op.name] = (ErrorCode.resource_not_found,
                                   f"user {op.name} has no {mechanism} credential to delete")
            else:
                records.append(RemoveUserScramCredentialRecord(name=op.name, mechanism=int(op.mechanism)))
        for op in request.upsertions:
            if op.name in errors:
                continue
            mechanism = _SCRAM_NAMES.get(int(op.mechanism))
            if not op.name:
                errors[op.name] = (ErrorCode.unacceptable_credential, "the user name is empty")
            elif mechanism is None:
                errors[op.name] = (ErrorCode.unsupported_sasl_mechanism, f"unknown SCRAM mechanism {op.mechanism}")
            elif not SCRAM_MIN_ITERATIONS <= op.iterations <= SCRAM_MAX_ITERATIONS:
                errors[op.name] = (ErrorCode.unacceptable_credential,
                                   f"iterations={op.iterations}: use {SCRAM_MIN_ITERATIONS}-{SCRAM_MAX_ITERATIONS}")
            elif not op.salt or not op.salted_password:
                errors[op.name] = (ErrorCode.unacceptable_credential, "the salt and salted password must be given")
            else:
                c = ScramCredential.from_salted_password(mechanism, bytes(op.salted_password), bytes(op.salt),
                                                         int(op.iterations))
                records.append(UserScramCredentialRecord(
                    name=op.name, mechanism=int(op.mechanism), salt=c.salt, stored_key=c.stored_key,
                    server_key=c.server_key, iterations=c.iterations))
        records = [r for r in records if r.name not in errors]
        results = tuple(ausc_resp.AlterUserScramCredentialsResult(
            user=name, error_code=errors.get(name, (ErrorCode.none, None))[0],
            error_message=errors.get(name, (ErrorCode.none, None))[1]) for name in touched)
        return ControllerResult(tuple(records), ausc_resp.AlterUserScramCredentialsResponse(
            throttle_time=NO_THROTTLE, results=results))

    # --- ACLs ----------------------------------------------------------------

    def create_acls(self, request: Any, image: MetadataImage, _now_ms: int) -> ControllerResult[Any]:
        records: list[Record] = []
        results = []
        existing = set(image.acls.values())
        for creation in request.creations:
            try:
                acl = acl_of(creation)
            except ValueError as exc:
                results.append(ca_resp.AclCreationResult(error_code=ErrorCode.invalid_request, error_message=str(exc)))
                continue
            if acl not in existing:
                existing.add(acl)
                records.append(AccessControlEntryRecord(
                    id=uuid.UUID(int=self._rng.getrandbits(128), version=4), resource_type=int(acl.resource_type),
                    resource_name=acl.resource_name, pattern_type=int(acl.pattern_type), principal=acl.principal,
                    host=acl.host, operation=int(acl.operation), permission_type=int(acl.permission)))
            results.append(ca_resp.AclCreationResult(error_code=ErrorCode.none, error_message=None))
        return ControllerResult(tuple(records), ca_resp.CreateAclsResponse(throttle_time=NO_THROTTLE,
                                                                           results=tuple(results)))

    def delete_acls(self, request: Any, image: MetadataImage, _now_ms: int) -> ControllerResult[Any]:
        records: list[Record] = []
        removed: set[uuid.UUID] = set()
        filter_results = []
        for f in request.filters:
            try:
                acl_filter = filter_of(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                                       f.principal_filter, f.host_filter, f.operation, f.permission_type)
            except ValueError as exc:
                filter_results.append(da_resp.DeleteAclsFilterResult(
                    error_code=ErrorCode.invalid_request, error_message=str(exc), matching_acls=()))
                continue
            matching = []
            for acl_id, acl in sorted(image.acls.items(), key=lambda kv: str(kv[0])):
                if acl_filter.matches(acl):
                    matching.append(da_resp.DeleteAclsMatchingAcl(
                        error_code=ErrorCode.none, error_message=None, resource_type=i8(acl.resource_type),
                        resource_name=acl.resource_name, pattern_type=i8(acl.pattern_type),
                        principal=acl.principal, host=acl.host, operation=i8(acl.operation),
                        permission_type=i8(acl.permission)))
                    if acl_id not in removed:
                        removed.add(acl_id)
                        records.append(RemoveAccessControlEntryRecord(id=acl_id))
            filter_results.append(da_resp.DeleteAclsFilterResult(
                error_code=ErrorCode.none, error_message=None, matching_acls=tuple(matching)))
        return ControllerResult(tuple(records), da_resp.DeleteAclsResponse(
            throttle_time=NO_THROTTLE, filter_results=tuple(filter_results)))


def acl_of(creation: Any) -> AclBinding:
    """An AclCreation as a binding; ValueError says what is wrong (Kafka's rules)."""
    resource_type = ResourceType(int(creation.resource_type))
    pattern_type = PatternType(int(creation.resource_pattern_type))
    operation = Operation(int(creation.operation))
    permission = Permission(int(creation.permission_type))
    if resource_type == ResourceType.ANY or pattern_type in (PatternType.ANY, PatternType.MATCH) \
            or operation == Operation.ANY or permission == Permission.ANY:
        raise ValueError("an ACL needs a concrete resource type, pattern type (LITERAL or PREFIXED), operation "
                         "and permission, not ANY/MATCH")
    if not creation.resource_name:
        raise ValueError("the resource name is empty")
    if ":" not in creation.principal:
        raise ValueError(f"principal {creation.principal!r} is not of the form User:<name>")
    if resource_type == ResourceType.CLUSTER and creation.resource_name != "kafka-cluster":
        raise ValueError("the CLUSTER resource is named kafka-cluster")
    return AclBinding(resource_type, creation.resource_name, pattern_type, creation.principal,
                      creation.host or "*", operation, permission)


def filter_of(resource_type: int, name: str | None, pattern_type: int, principal: str | None, host: str | None,
              operation: int, permission: int) -> AclFilter:
    return AclFilter(ResourceType(int(resource_type)), name, PatternType(int(pattern_type)), principal, host,
                     Operation(int(operation)), Permission(int(permission)))
