"""Where a partition's leader went, for a client told NOT_LEADER_OR_FOLLOWER
or FENCED_LEADER_EPOCH (KIP-951).

From Produce v10 and Fetch v12 (v16 for the endpoints) a partition answered
with one of those errors carries `current_leader` (the leader and epoch in
this broker's metadata image), and the response carries the endpoint of
each leader it names on the listener the request came in on, so the client
sends its next request there without a Metadata round first.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

#: The partition errors whose answer names the current leader.
LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)


def current_leader(image, topic_id: uuid.UUID | None, partition: int) -> tuple[int, int] | None:
    """(leader id, leader epoch) of the partition in `image`, or None when
    the image does not know the partition or it has no leader."""
    registration = image.partition(topic_id, partition) if topic_id is not None else None
    if registration is None or registration.leader < 0:
        return None
    return (registration.leader, registration.leader_epoch)


def node_endpoints(broker, node_ids) -> list[tuple[int, str, int, str | None]]:
    """(id, host, port, rack) on this broker's listener of each of `node_ids` the image knows."""
    out = []
    for node_id in node_ids:
        registration = broker.image.brokers.get(node_id)
        if registration is None:
            continue
        for endpoint in registration.endpoints:
            if endpoint.name == broker.config.listener_name:
                out.append((node_id, endpoint.host, endpoint.port, registration.rack))
                break
    return out
