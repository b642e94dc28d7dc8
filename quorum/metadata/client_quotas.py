"""Client quotas (KIP-13, KIP-124, KIP-546): the keys, the entities, and
which quota applies to a (user, client id).

An entity is ((type, name), ...) sorted by type, type "client-id" or "user",
name None for that type's default. A (user, client id) takes each key from
the first entity that sets it, in KIP-55's order:

    user+client-id, user+default client-id, user, default user+client-id,
    default user+default client-id, default user, client-id, default client-id
"""

from __future__ import annotations

import ipaddress

from quorum.metadata.pmap import PMap

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (CLIENT_ID, USER, IP)
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
#: New connections per second from one IP address (KIP-612), on an `ip` entity only.
CONNECTION_CREATION_RATE = "connection_creation_rate"
CLIENT_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
QUOTA_KEYS = (*CLIENT_KEYS, CONNECTION_CREATION_RATE)

Entity = tuple[tuple[str, "str | None"], ...]


def entity_of(parts) -> Entity:
    """The canonical entity (sorted by type) of ((type, name), ...)."""
    return tuple(sorted(parts))


def entity_problem(entity: Entity) -> str | None:
    """Why `entity` is not a valid quota entity, or None."""
    types = [t for t, _ in entity]
    if not types:
        return "a quota entity needs a user, a client-id or both"
    if len(set(types)) != len(types):
        return f"entity type repeated in {entity}: give each of user and client-id at most once"
    unknown = [t for t in types if t not in ENTITY_TYPES]
    if unknown:
        return f"entity type {unknown[0]!r} is not supported: use 'user', 'client-id' or 'ip'"
    if IP in types:
        if len(types) > 1:
            return "an 'ip' quota entity stands alone: it cannot be combined with a user or client-id"
        (_, name), = entity
        if name is not None:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                return f"{name!r} is not an IP address: give one such as 192.0.2.7 or 2001:db8::7"
    return None


def value_problem(key: str, value: float, entity: Entity | None = None) -> str | None:
    if key not in QUOTA_KEYS:
        return f"quota key {key!r} is unknown: use one of {', '.join(QUOTA_KEYS)}"
    if entity is not None:
        on_ip = any(t == IP for t, _ in entity)
        if on_ip and key != CONNECTION_CREATION_RATE:
            return f"quota key {key!r} cannot be set on an 'ip' entity: only {CONNECTION_CREATION_RATE}"
        if not on_ip and key == CONNECTION_CREATION_RATE:
            return f"{CONNECTION_CREATION_RATE} is set on an 'ip' entity (an address or the default ip)"
    if not value > 0:
        return f"quota {key}={value} must be above 0 (remove the quota to lift it)"
    return None


def candidates(user: str | None, client_id: str) -> tuple[Entity, ...]:
    """The entities that may give a (user, client id) its quotas, most specific first."""
    c = client_id
    if user is None:
        return (((CLIENT_ID, c),), ((CLIENT_ID, None),))
    u = user
    return (
        ((CLIENT_ID, c), (USER, u)), ((CLIENT_ID, None), (USER, u)), ((USER, u),),
        ((CLIENT_ID, c), (USER, None)), ((CLIENT_ID, None), (USER, None)), ((USER, None),),
        ((CLIENT_ID, c),), ((CLIENT_ID, None),),
    )


def ip_quota(quotas: PMap, address: str) -> float | None:
    """The connection_creation_rate of `address`: its own, else the default ip's."""
    for entity in (((IP, address),), ((IP, None),)):
        values = quotas.get(entity)
        if values is not None and CONNECTION_CREATION_RATE in values:
            return values[CONNECTION_CREATION_RATE]
    return None


def resolve(quotas: PMap, user: str | None, client_id: str, key: str) -> tuple[float | None, Entity | None]:
    """The quota `key` that applies to (user, client id), and the entity that sets it."""
    for entity in candidates(user, client_id):
        values = quotas.get(entity)
        if values is not None:
            v = values.get(key)
            if v is not None:
                return v, entity
    return None, None
