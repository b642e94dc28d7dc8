"""Metadata and DescribeCluster, answered from this broker's `MetadataImage`.

Metadata lists the live brokers (registered and unfenced, with their
endpoint on this listener), and for each requested topic its partitions
with leader, leader epoch, replicas, ISR and offline replicas (replicas on
brokers that are not live, or in a log dir their broker reports offline:
KIP-858's directory assignment). A partition without a live leader says
LEADER_NOT_AVAILABLE. The controller id clients see is this broker's own
id: in KRaft, admin requests go to any broker, which forwards them.

Auto-creation is off by default. With `auto.create.topics.enable=true`
and the request allowing it (v4+ `allow_auto_topic_creation`), missing
topics with legal names are created through the controller with
`num.partitions` and `default.replication.factor`; the answer waits up to
a second for them to reach this broker's image (Kafka answers
LEADER_NOT_AVAILABLE at once and lets the client retry; waiting briefly
spares clients a round of metadata backoff), and says LEADER_NOT_AVAILABLE
if they have not.
"""

from __future__ import annotations

import datetime
import logging
import re

import trio
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from broker.shell.controller_channel import ControllerUnavailableError
from broker.core.group import OFFSETS_TOPIC_NAME
from broker.api.kio_util import build, response_module
from broker.api.metadata_codec import NO_OPERATIONS
from quorum.metadata import MetadataImage
from common.security.acl import Operation, ResourceType
from common.wire import ConnectionFailedError

_NO_THROTTLE = datetime.timedelta(0)
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC_NAME})
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME_LENGTH = 249
BROKER_ENDPOINT_TYPE = 1

_log = logging.getLogger("broker.metadata")


def topic_name_error(name: str | None) -> str | None:
    """Why `name` is not a legal topic name (Kafka's `Topic.validate`), or None."""
    if not name:
        return "the topic name is empty"
    if name in (".", ".."):
        return f"topic name {name!r} is illegal"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters"
    if not _LEGAL_TOPIC.fullmatch(name):
        return f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'"
    return None


def live_brokers(broker, image: MetadataImage, listener_name: str = "",
                 include_fenced: bool = False) -> list[tuple[int, str, int, str | None]]:
    """(id, host, port, rack) of the unfenced brokers (also the fenced ones
    when asked) with an endpoint on `listener_name` (the listener the client
    connected on: a client on the SSL listener is sent to the SSL
    endpoints), by default the first listener."""
    listener_name = listener_name or broker.config.listener_name
    out = []
    for b in image.brokers.values():
        if b.fenced and not include_fenced:
            continue
        for endpoint in b.endpoints:
            if endpoint.name == listener_name:
                out.append((b.broker_id, endpoint.host, endpoint.port, b.rack))
                break
    return sorted(set(out))


async def handle_metadata(broker, ctx, request):
    """Encoded by `broker.api.metadata_codec`, which keeps each topic's bytes
    while the image does not change it."""
    body = request.body
    header = request.header
    if body.topics is None:
        names = sorted(broker.image.topic_ids_by_name)
    else:
        names = [_requested_name(broker.image, t) for t in body.topics]
    denied: set[str] = set()
    authorizer = broker.authorizer
    if authorizer.enabled:
        # DESCRIBE on each topic: the full list leaves out the others
        # (Kafka's rule), a named one is answered TOPIC_AUTHORIZATION_FAILED.
        if body.topics is None:
            names = [n for n in names if authorizer.allowed_quietly(ctx, Operation.DESCRIBE, ResourceType.TOPIC, n)]
        else:
            denied = authorizer.denied_topics(ctx, (n for n in names if n is not None), Operation.DESCRIBE)
    allow_auto = getattr(body, "allow_auto_topic_creation", True)
    if broker.config.auto_create_topics_enable and allow_auto and body.topics is not None:
        missing = [n for n in names if n is not None and n not in denied and broker.image.topic(n) is None
                   and topic_name_error(n) is None and authorizer.can_create(ctx, n)]
        if missing:
            await _auto_create(broker, missing)
    image = broker.image
    auto_created = broker.config.auto_create_topics_enable and allow_auto
    answers = [(name, ErrorCode.topic_authorization_failed if name in denied else
                _topic_error(image, name, auto_created)) for name in names]
    # `__consumer_offsets` is internal, as in Kafka: pattern subscriptions skip it.
    return broker.metadata_encoder.encode(header.correlation_id, header.api_version, image,
                                          live_brokers(broker, image, ctx.listener_name), broker.config.cluster_id,
                                          broker.node_id, answers, INTERNAL_TOPICS)


def _requested_name(image: MetadataImage, t) -> str | None:
    name = getattr(t, "name", None)
    topic_id = getattr(t, "topic_id", None)
    if name is None and topic_id is not None:
        topic = image.topics_by_id.get(topic_id)
        return None if topic is None else topic.name
    return name


def _topic_error(image: MetadataImage, name: str | None, auto_created: bool) -> ErrorCode | None:
    """None for a topic the image has (answered from it); else the error its answer carries."""
    if name is not None and image.topic(name) is not None:
        return None
    if name is not None and topic_name_error(name) is not None:
        return ErrorCode.invalid_topic_exception
    if auto_created:
        return ErrorCode.leader_not_available
    return ErrorCode.unknown_topic_or_partition


async def _auto_create(broker, names: list[str]) -> None:
    config = broker.config
    request = ct_req.CreateTopicsRequest(
        topics=tuple(ct_req.CreatableTopic(name=n, num_partitions=config.num_partitions,
                                           replication_factor=config.default_replication_factor,
                                           assignments=(), configs=()) for n in names),
        timeout=datetime.timedelta(milliseconds=config.metadata_wait_ms),
        validate_only=False,
    )
    try:
        response = await broker.controller.send(request)
    except (ControllerUnavailableError, ConnectionFailedError) as exc:
        _log.warning("auto-creating %s: no answer from the controller: %s", names, exc)
        return
    created = {t.name for t in response.topics if t.error_code in (ErrorCode.none, ErrorCode.topic_already_exists)}
    if created:
        _log.info("auto-created topics %s", sorted(created))
        deadline = trio.current_time() + config.metadata_wait_ms / 1000
        await broker.wait_for_image(lambda image: all(image.topic(n) is not None for n in created), deadline)


async def handle_describe_cluster(broker, ctx, request):
    body = request.body
    mod = response_module(request.header)
    image = broker.image
    endpoint_type = getattr(body, "endpoint_type", BROKER_ENDPOINT_TYPE)
    if endpoint_type != BROKER_ENDPOINT_TYPE:
        return build(mod.DescribeClusterResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.mismatched_endpoint_type,
                     error_message="this is a broker listener: ask a controller for controller endpoints",
                     endpoint_type=endpoint_type, cluster_id=broker.config.cluster_id, controller_id=-1,
                     brokers=(), cluster_authorized_operations=NO_OPERATIONS)
    # v2 (KIP-1073): fenced brokers too when asked, each marked.
    include_fenced = bool(getattr(body, "include_fenced_brokers", False))
    brokers = tuple(build(mod.DescribeClusterBroker, broker_id=i, host=h, port=p, rack=r,
                          is_fenced=image.brokers[i].fenced)
                    for i, h, p, r in live_brokers(broker, image, ctx.listener_name, include_fenced))
    return build(mod.DescribeClusterResponse, throttle_time=_NO_THROTTLE, error_code=ErrorCode.none,
                 error_message=None, endpoint_type=BROKER_ENDPOINT_TYPE, cluster_id=broker.config.cluster_id,
                 controller_id=broker.node_id, brokers=brokers, cluster_authorized_operations=NO_OPERATIONS)
