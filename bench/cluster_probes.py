"""What the fault and metadata scenarios ask a running cluster, over the Kafka protocol (common.wire).

Each call opens its own short connection with short timeouts, so a probe
aimed at a node that was just killed or paused fails fast (an exception, or
None) instead of hanging; the callers poll. A caller that polls nodes that
stay up sends the same requests on connections it keeps (`Send`: a
`common.wire.pool.ConnectionPool`'s `request` for one node, say) with the
`*_via` forms, as a Kafka client does: a new connection for every request
costs the node an accept and a connection task, and the request waits for
both.

- `topic_partitions(host, port, topics)`: per (topic, partition) the leader
  one broker's Metadata answer names (its own image's view); and
  `topic_partitions_via(send, topics)`.
- `live_brokers(host, port)`: the unfenced brokers it lists; and `live_brokers_via(send)`.
- `quorum_leader(controllers)`: (leader id, epoch) as the first controller
  that answers DescribeQuorum knows it.
- `create_topics(host, port, {topic: partitions}, ...)`: CreateTopics through a broker
  (forwarded to the active controller); the error code per topic.
- `produce_one(host, port, topic, partition, acks)`: one record in a
  Produce request; the partition's error code (0: appended, and with
  acks=-1 committed).
- `produce_many(host, port, [(topic, partition), ...], acks)`: one record
  to each of many partitions in one Produce request; the error code of
  each; and `produce_many_via(send, ...)`.
- `active_controller(cluster)`: (node id, epoch) of the active controller
  in either mode: the quorum leader (KRaft), or the broker in ZooKeeper's
  `/controller` znode with `/controller_epoch` (ZooKeeper mode).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9 import request as produce_req

from common.wire import ConnectionFailedError, RequestTimeoutError, open_connection
from common.wire.metadata_leaders import read_leaders

PROBE_TIMEOUT_MS = 2000
#: What a probe of a dead, paused or overloaded node may raise.
PROBE_ERRORS = (ConnectionFailedError, RequestTimeoutError, OSError, trio.TooSlowError)
#: Sends a kio request on a kept connection and returns the response: `send(body, timeout_ms=...)`.
Send = Callable[..., Awaitable[Any]]


async def _request(host: str, port: int, body: Any, timeout_ms: int = PROBE_TIMEOUT_MS, **kwargs: Any) -> Any:
    with trio.fail_after(timeout_ms / 1000 + 1):
        async with open_connection(host, port, connect_timeout_ms=min(timeout_ms, PROBE_TIMEOUT_MS)) as conn:
            return await conn.request(body, timeout_ms=timeout_ms, **kwargs)


async def topic_partitions(host: str, port: int, topics: list[str],
                           timeout_ms: int = PROBE_TIMEOUT_MS) -> dict[tuple[str, int], int]:
    """{(topic, partition): leader id (-1: none)} for the listed topics this broker knows."""
    return await _request(host, port, _metadata_request(topics), timeout_ms, read=read_leaders)


async def topic_partitions_via(send: Send, topics: list[str],
                               timeout_ms: int = PROBE_TIMEOUT_MS) -> dict[tuple[str, int], int]:
    """`topic_partitions` on a kept connection. The answer is read by hand
    (`common.wire.metadata_leaders`), not by kio: the failover probe reads
    up to 10,000 partitions in one answer, several answers a second, on the
    cores of the brokers it times."""
    return await send(_metadata_request(topics), timeout_ms=timeout_ms, read=read_leaders)


def _metadata_request(topics: list[str]) -> MetadataRequest:
    return MetadataRequest(topics=tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics),
                           allow_auto_topic_creation=False, include_topic_authorized_operations=False)


async def live_brokers(host: str, port: int) -> set[int]:
    return _live(await _request(host, port, _metadata_request([])))


async def live_brokers_via(send: Send, timeout_ms: int = PROBE_TIMEOUT_MS) -> set[int]:
    """`live_brokers` on a kept connection."""
    return _live(await send(_metadata_request([]), timeout_ms=timeout_ms))


def _live(response: Any) -> set[int]:
    return {int(b.node_id) for b in response.brokers}


async def quorum_leader(controllers: list[tuple[str, int]]) -> tuple[int, int] | None:
    from quorum.node.describe_quorum import describe_quorum_request, parse_describe_quorum

    for host, port in controllers:
        try:
            d = parse_describe_quorum(await _request(host, port, describe_quorum_request(2), 500))
        except PROBE_ERRORS:
            continue
        if d.leader_id >= 0:
            return d.leader_id, d.leader_epoch
    return None


def create_topics_request(partitions_by_topic: Mapping[str, int], replication_factor: int,
                          timeout_ms: int, assignments: Mapping[str, list[list[int]]] | None = None,
                          ) -> ct_req.CreateTopicsRequest:
    """CreateTopics for {topic: partitions}; a topic in `assignments` gets those replica lists instead."""
    def creatable(name: str, partitions: int) -> ct_req.CreatableTopic:
        replicas = (assignments or {}).get(name)
        if replicas is None:
            return ct_req.CreatableTopic(name=name, num_partitions=partitions, replication_factor=replication_factor,
                                         assignments=(), configs=())
        return ct_req.CreatableTopic(name=name, num_partitions=-1, replication_factor=-1, configs=(), assignments=tuple(
            ct_req.CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(r)) for i, r in enumerate(replicas)))

    return ct_req.CreateTopicsRequest(
        topics=tuple(creatable(n, p) for n, p in partitions_by_topic.items()),
        timeout=datetime.timedelta(milliseconds=timeout_ms), validate_only=False)


async def create_topics(host: str, port: int, partitions_by_topic: Mapping[str, int], *,
                        replication_factor: int = 1, timeout_ms: int = 30_000,
                        assignments: Mapping[str, list[list[int]]] | None = None) -> dict[str, int]:
    """{topic: error code} of one CreateTopics, sent to the broker at host:port."""
    request = create_topics_request(partitions_by_topic, replication_factor, timeout_ms, assignments)
    response = await _request(host, port, request, timeout_ms + 5000)
    return {str(t.name): int(t.error_code) for t in response.topics}


async def produce_one(host: str, port: int, topic: str, partition: int, *, acks: int = 1,
                      timeout_ms: int = PROBE_TIMEOUT_MS) -> int:
    """The error code of one record produced to (topic, partition) at the broker host:port."""
    from storage.batch import build_batch

    batch = build_batch([(None, b"probe", (), int(time.time() * 1000))])
    response = await _request(host, port, produce_req.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(produce_req.TopicProduceData(name=topic, partition_data=(
            produce_req.PartitionProduceData(index=partition, records=batch),)),)), timeout_ms)
    return int(response.responses[0].partition_responses[0].error_code)


async def produce_many(host: str, port: int, partitions: list[tuple[str, int]], *, acks: int = 1,
                       timeout_ms: int = PROBE_TIMEOUT_MS) -> dict[tuple[str, int], int]:
    """{(topic, partition): error code} of one Produce request holding one record for each partition."""
    return _codes(await _request(host, port, _produce_request(partitions, acks, timeout_ms), timeout_ms))


async def produce_many_via(send: Send, partitions: list[tuple[str, int]], *, acks: int = 1,
                           timeout_ms: int = PROBE_TIMEOUT_MS) -> dict[tuple[str, int], int]:
    """`produce_many` on a kept connection."""
    return _codes(await send(_produce_request(partitions, acks, timeout_ms), timeout_ms=timeout_ms))


def _produce_request(partitions: list[tuple[str, int]], acks: int, timeout_ms: int) -> produce_req.ProduceRequest:
    from storage.batch import build_batch

    batch = build_batch([(None, b"probe", (), int(time.time() * 1000))])
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return produce_req.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(produce_req.TopicProduceData(name=topic, partition_data=tuple(
            produce_req.PartitionProduceData(index=p, records=batch) for p in ps)) for topic, ps in by_topic.items()))


def _codes(response: Any) -> dict[tuple[str, int], int]:
    return {(str(t.name), int(p.index)): int(p.error_code) for t in response.responses for p in t.partition_responses}


async def active_controller(cluster: Any, exclude: int | None = None) -> tuple[int, int] | None:
    """(node id, epoch) of the active controller, or None while there is none (see the module docstring)."""
    if getattr(cluster, "mode", "kraft") != "zk":
        return await quorum_leader([(n.host, n.port) for n in cluster.controllers
                                    if n.node_id != exclude and n.is_running()])
    return await trio.to_thread.run_sync(_zk_controller, cluster.zookeeper.connect_string)


def _zk_controller(connect_string: str) -> tuple[int, int] | None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from quorum.zookeeper import znodes

    zk = KazooClient(hosts=connect_string, timeout=2.0)
    try:
        zk.start(timeout=2.0)
        try:
            controller = znodes.decode_controller(zk.get(znodes.CONTROLLER_PATH)[0])
            epoch = znodes.decode_controller_epoch(zk.get(znodes.CONTROLLER_EPOCH_PATH)[0])
        except NoNodeError:
            return None
        return controller.broker_id, epoch
    except Exception:  # noqa: BLE001 - kazoo's connection errors have no common root; a probe just fails
        return None
    finally:
        zk.stop()
        zk.close()
