"""Access control entries and Kafka's StandardAuthorizer rules (KIP-801), pure.

An ACL binding says: `principal` from `host` is ALLOWed or DENYed
`operation` on resources of `resource_type` whose name is `resource_name`
(LITERAL; `*` is every resource of the type) or starts with it (PREFIXED).

`authorize` answers one (principal, host, operation, resource) question:
- a super user (`super.users`) may do everything;
- a matching DENY wins over any ALLOW;
- an ALLOW of the operation matches; so does an ALLOW of ALL, and for
  DESCRIBE an ALLOW of READ, WRITE, DELETE or ALTER, and for
  DESCRIBE_CONFIGS an ALLOW of ALTER_CONFIGS (Kafka's implied operations);
- with no ACL at all on the resource, `allow.everyone.if.no.acl.found`
  decides (default false).

Codes are Kafka's (AclResourceType, PatternType, AclOperation, AclPermissionType).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

from common.errors import ConfigError


class ResourceType(enum.IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"
CLUSTER_NAME = "kafka-cluster"
_IMPLIES = {
    Operation.DESCRIBE: {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER},
    Operation.DESCRIBE_CONFIGS: {Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS},
}


@dataclasses.dataclass(frozen=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def covers(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.LITERAL:
            return self.resource_name in (name, WILDCARD)
        return self.pattern_type == PatternType.PREFIXED and name.startswith(self.resource_name)

    def __str__(self) -> str:
        return (f"{self.permission.name} {self.principal} from {self.host} {self.operation.name} on "
                f"{self.resource_type.name} {self.pattern_type.name.lower()} {self.resource_name!r}")


@dataclasses.dataclass(frozen=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls match (Kafka's AclBindingFilter): None or ANY match everything."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and acl.resource_type != self.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is not None and not (
                    acl.resource_name == self.resource_name
                    or (acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD)
                    or (acl.pattern_type == PatternType.PREFIXED and self.resource_name.startswith(acl.resource_name))):
                return False
        else:
            if self.pattern_type != PatternType.ANY and acl.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and acl.resource_name != self.resource_name:
                return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation != Operation.ANY and acl.operation != self.operation:
            return False
        return self.permission == Permission.ANY or acl.permission == self.permission


@dataclasses.dataclass(frozen=True)
class AuthorizerConfig:
    """`authorizer.class.name` set (any of Kafka's authorizer class names), `super.users`,
    `allow.everyone.if.no.acl.found`."""

    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


def authorize(config: AuthorizerConfig, acls: Iterable[AclBinding], principal: str, host: str,
              operation: Operation, resource_type: ResourceType, name: str) -> bool:
    """Whether `principal` from `host` may do `operation` on the resource (module doc)."""
    if not config.enabled or principal in config.super_users:
        return True
    wanted = _IMPLIES.get(operation, {operation})
    found = allowed = False
    for acl in acls:
        if not acl.covers(resource_type, name):
            continue
        found = True
        if acl.principal not in (principal, "User:*") or acl.host not in (host, WILDCARD):
            continue
        if acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL):
            return False
        if acl.permission == Permission.ALLOW and (acl.operation == Operation.ALL or acl.operation in wanted):
            allowed = True
    if allowed:
        return True
    return not found and config.allow_everyone_if_no_acl_found


#: Kafka's authorizer class names; raftka's built-in authorizer stands for each.
AUTHORIZER_CLASSES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
)


def authorizer_config(props: Mapping[str, str]) -> AuthorizerConfig:
    """`authorizer.class.name` (one of Kafka's names turns authorization on),
    `super.users` (`User:a;User:b`), `allow.everyone.if.no.acl.found`."""
    name = props.get("authorizer.class.name", "").strip()
    if name and name not in AUTHORIZER_CLASSES:
        raise ConfigError(f"authorizer.class.name={name}: raftka's ACL authorizer stands for "
                          f"{', '.join(AUTHORIZER_CLASSES)}; set one of them, or leave the key unset for no "
                          "authorization")
    super_users = frozenset(u.strip() for u in props.get("super.users", "").split(";") if u.strip())
    for user in super_users:
        if ":" not in user:
            raise ConfigError(f"super.users: {user!r} is not a principal like User:admin (separate them with ';')")
    allow = props.get("allow.everyone.if.no.acl.found", "false").strip().lower()
    if allow not in ("true", "false"):
        raise ConfigError(f"allow.everyone.if.no.acl.found={allow!r} must be true or false")
    return AuthorizerConfig(bool(name), super_users, allow == "true")
