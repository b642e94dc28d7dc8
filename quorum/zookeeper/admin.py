"""Topic administration in ZooKeeper mode (Kafka's `AdminZkClient`): znodes, not requests.

In ZooKeeper mode a broker that receives CreateTopics or DeleteTopics does
not ask the controller; it writes znodes and the controller reacts to its
watches:

* **create**: `/config/topics/<t>` first (so the controller and brokers
  never see a topic without its config), then `/brokers/topics/<t>` with
  the replica assignment and a fresh topic id. The controller's
  `/brokers/topics` watch initializes the partitions.
* **add partitions**: rewrite `/brokers/topics/<t>` with the new partitions,
  conditional on its zkVersion; the controller's data watch on it fires.
* **delete**: `/admin/delete_topics/<t>`. The controller deletes the rest.
* **alter config**: rewrite `/config/topics/<t>` and leave a sequential
  `/config/changes/config_change_` naming it.

Replica assignment is Kafka's `AdminUtils.assignReplicasToBrokers` without
racks: partition p's first replica is broker `(start + p) % n` in id order,
followers follow at a shift that grows every n partitions. Kafka picks
`start` at random; here it is a hash of the topic name, so the placement is
reproducible while topics still spread over the brokers.

All functions block (kazoo); trio code calls them through `trio.to_thread`.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from quorum.zookeeper import znodes as z
from quorum.zookeeper.errors import ZooKeeperModeError
from quorum.zookeeper.znodes import TopicAssignment


class TopicAdminError(ZooKeeperModeError):
    """A topic operation was refused; the message says why (name, existence, replication)."""


def assign_replicas(broker_ids: Sequence[int], num_partitions: int, replication_factor: int,
                    topic: str) -> dict[int, tuple[int, ...]]:
    """Kafka's rack-unaware replica assignment, started at a hash of `topic`."""
    brokers = sorted(broker_ids)
    n = len(brokers)
    if not 1 <= replication_factor <= n:
        raise TopicAdminError(f"replication factor {replication_factor} needs between 1 and {n} live brokers")
    if num_partitions < 1:
        raise TopicAdminError(f"a topic needs at least one partition, not {num_partitions}")
    start = zlib.crc32(topic.encode()) % n
    shift = start
    out = {}
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n] if n > 1 else brokers[first])
        out[p] = tuple(replicas)
    return out


def create_topic(zk: KazooClient, name: str, partitions: Mapping[int, Sequence[int]],
                 config: Mapping[str, str] | None = None, topic_id: uuid.UUID | None = None) -> TopicAssignment:
    """Write a new topic's config and assignment. TopicAdminError if it exists or is invalid."""
    if not z.is_legal_topic_name(name):
        raise TopicAdminError(f"illegal topic name {name!r}: use 1-249 of [a-zA-Z0-9._-]")
    if sorted(partitions) != list(range(len(partitions))) or not all(
            r and len(set(r)) == len(r) for r in partitions.values()):
        raise TopicAdminError(f"topic {name!r}: partitions must be 0..n-1, each with distinct replicas")
    if zk.exists(z.topic_path(name)) is not None:
        raise TopicAdminError(f"topic {name!r} already exists")
    assignment = TopicAssignment({p: tuple(r) for p, r in partitions.items()}, topic_id or uuid.uuid4())
    config_data = z.encode_entity_config(config or {})
    try:
        zk.create(z.topic_config_path(name), config_data, makepath=True)
    except NodeExistsError:  # left behind by an interrupted create or delete
        zk.set(z.topic_config_path(name), config_data)
    try:
        zk.create(z.topic_path(name), z.encode_topic_assignment(assignment), makepath=True)
    except NodeExistsError:
        raise TopicAdminError(f"topic {name!r} already exists") from None
    return assignment


def add_partitions(zk: KazooClient, name: str, topic_id: uuid.UUID,
                   partitions: Mapping[int, Sequence[int]]) -> TopicAssignment:
    """Add `partitions` (numbered right after the existing ones) to topic `name`'s assignment,
    conditional on the zkVersion read. TopicAdminError if the topic is gone, was re-created,
    or changed meanwhile."""
    try:
        data, stat = zk.get(z.topic_path(name))
    except NoNodeError:
        raise TopicAdminError(f"topic {name!r} does not exist") from None
    current = z.decode_topic_assignment(name, data)
    if current.topic_id != topic_id:
        raise TopicAdminError(f"topic {name!r} was re-created meanwhile; retry")
    if sorted(partitions) != list(range(len(current.partitions), len(current.partitions) + len(partitions))):
        raise TopicAdminError(f"topic {name!r} has {len(current.partitions)} partitions now; retry")
    grown = TopicAssignment({**current.partitions, **{p: tuple(r) for p, r in partitions.items()}},
                            current.topic_id, current.adding_replicas, current.removing_replicas)
    try:
        zk.set(z.topic_path(name), z.encode_topic_assignment(grown), version=stat.version)
    except (BadVersionError, NoNodeError):
        raise TopicAdminError(f"topic {name!r} changed while partitions were added; retry") from None
    return grown


def delete_topic(zk: KazooClient, name: str) -> None:
    """Ask the controller to delete `name`. TopicAdminError if there is no such topic."""
    if not z.is_legal_topic_name(name) or zk.exists(z.topic_path(name)) is None:
        raise TopicAdminError(f"topic {name!r} does not exist")
    try:
        zk.create(z.delete_topic_path(name), b"", makepath=True)
    except NodeExistsError:
        pass  # already marked


def set_topic_config(zk: KazooClient, name: str, config: Mapping[str, str]) -> None:
    """Replace a topic's config overrides and notify brokers and the controller."""
    if not z.is_legal_topic_name(name) or zk.exists(z.topic_path(name)) is None:
        raise TopicAdminError(f"topic {name!r} does not exist")
    data = z.encode_entity_config(config)
    try:
        zk.set(z.topic_config_path(name), data)
    except NoNodeError:
        zk.create(z.topic_config_path(name), data, makepath=True)
    zk.create(f"{z.CONFIG_CHANGES_PATH}/{z.CONFIG_CHANGE_PREFIX}", z.encode_config_change(f"topics/{name}"),
              sequence=True, makepath=True)
