"""Client quotas (KIP-13, KIP-124, KIP-546): the keys, the entities, and
which quota applies to a (user, client id).

An entity is ((type, name), ...) sorted by type, type "client-id" or "user",
name None for that type's default. A (user, client id) takes each key from
the first entity that sets it, in KIP-55's order:

    user+client-id, user+default client-id, user, default user+client-id,
    default user+default client-id, default user, client-id, default client-id
"""

from __future__ import annotations

from quorum.metadata.pmap import PMap

USER, CLIENT_ID = "user", "client-id"
ENTITY_TYPES = (CLIENT_ID, USER)
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)

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
        return f"entity type {unknown[0]!r} is not supported: use 'user' or 'client-id'"
    return None


def value_problem(key: str, value: float) -> str | None:
    if key not in QUOTA_KEYS:
        return f"quota key {key!r} is unknown: use one of {', '.join(QUOTA_KEYS)}"
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


def resolve(quotas: PMap, user: str | None, client_id: str, key: str) -> tuple[float | None, Entity | None]:
    """The quota `key` that applies to (user, client id), and the entity that sets it."""
    for entity in candidates(user, client_id):
        values = quotas.get(entity)
        if values is not None:
            v = values.get(key)
            if v is not None:
                return v, entity
    return None, None
