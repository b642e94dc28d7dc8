"""A ZooKeeper-mode broker's metadata: controller requests and ZooKeeper state as a `MetadataImage`.

Theory of operation
-------------------
raftka's broker consumes one thing: a `quorum.metadata.MetadataImage` and
the delta from its previous image (`broker.on_metadata_update`). In KRaft
mode the image comes from the metadata log. In ZooKeeper mode it comes from
the controller's UpdateMetadata / LeaderAndIsr / StopReplica requests, so
`ZkMetadataCache` turns each accepted request into metadata *records* and
replays them onto the image. The broker then runs unchanged, apart from its
metadata source.

How requests map to records:

* UpdateMetadata lists every live broker: a new or changed one becomes a
  RegisterBroker (unfenced), a registered broker missing from the list is
  fenced (BrokerRegistrationChange), as a dead broker drops out of a Kafka
  metadata cache. Each partition state becomes a full Partition record.
  A topic whose partitions come with leader -2 (`LeaderDuringDelete`) is
  removed; a topic seen with a new topic id was re-created.
* LeaderAndIsr carries this broker's partitions: each accepted state
  becomes a Partition record (creating the Topic first if needed).
* StopReplica with delete removes the topic (this controller only deletes
  replicas when their topic is deleted; reassignment is not implemented).
  Without delete it changes nothing: leadership moves come by LeaderAndIsr.

The leader epoch is the ZooKeeper state's; the partition epoch is the state
znode's zkVersion, as Kafka sends it. Each record gets the next offset of a
local counter and the controller epoch as its epoch.

Fencing, as a ZooKeeper-mode Kafka broker does it: a request from a
controller epoch below the newest seen is refused whole with
STALE_CONTROLLER_EPOCH; one addressed to an older registration of this
broker (broker epoch below ours) with STALE_BROKER_EPOCH; a LeaderAndIsr
partition state older than what we have (lower leader epoch, or the same
leader epoch and a lower-or-equal partition epoch) with
STALE_CONTROLLER_EPOCH for that partition.

`zk_state_to_records`/`zk_state_to_image` build the same records straight
from ZooKeeper's state (a controller's snapshot), for `raftka migrate` and
for tests that compare both paths.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from kio.schema.errors import ErrorCode

from quorum.metadata.image import LoggedRecord, MetadataImage, PartitionRegistration
from quorum.metadata.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    ConfigResourceType,
    Endpoint,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from quorum.metadata.snapshot import image_from_records
from quorum.zookeeper import messages as m
from quorum.zookeeper.znodes import LEADER_DURING_DELETE, BrokerInfo, NamedPartition, PartitionState, TopicAssignment

_log = logging.getLogger("quorum.zookeeper.broker_metadata")


def incarnation_id(broker_id: int) -> uuid.UUID:
    """ZooKeeper mode has no incarnation ids; each broker gets a fixed stand-in."""
    return uuid.UUID(int=broker_id & (2**128 - 1))


def _partition_ok(replicas, isr, leader) -> bool:
    return (bool(replicas) and len(set(replicas)) == len(replicas) and set(isr) <= set(replicas)
            and (leader == NO_LEADER or leader in isr))


def zk_state_to_records(brokers: Mapping[int, BrokerInfo], topics: Mapping[str, TopicAssignment],
                        states: Mapping[NamedPartition, PartitionState],
                        topic_configs: Mapping[str, Mapping[str, str]] | None = None) -> list[Record]:
    """Snapshot records describing ZooKeeper's state (brokers with their czxid as epoch)."""
    out: list[Record] = []
    for b, info in sorted(brokers.items()):
        out.append(RegisterBrokerRecord(broker_id=b, incarnation_id=incarnation_id(b), endpoints=info.endpoints,
                                        rack=info.rack, fenced=False, broker_epoch=max(info.broker_epoch, 0)))
    for name, a in sorted(topics.items()):
        assert a.topic_id is not None, f"topic {name!r} has no topic id"
        out.append(TopicRecord(name=name, topic_id=a.topic_id))
        for p, replicas in sorted(a.partitions.items()):
            s = states.get(NamedPartition(name, p))
            if s is None:  # never initialized: offline
                s = PartitionState(NO_LEADER, 0, replicas, 0, 0)
            if not _partition_ok(replicas, s.isr, s.leader):
                _log.warning("skipping inconsistent state of %s-%d: replicas %s, %s", name, p, replicas, s)
                continue
            out.append(PartitionRecord(topic_id=a.topic_id, partition=p, replicas=replicas, isr=s.isr,
                                       leader=s.leader, leader_epoch=s.leader_epoch,
                                       partition_epoch=max(s.zk_version, 0),
                                       adding_replicas=a.adding_replicas.get(p, ()),
                                       removing_replicas=a.removing_replicas.get(p, ())))
    for name, config in sorted((topic_configs or {}).items()):
        if name in topics:
            out += [ConfigRecord(ConfigResourceType.TOPIC, name, k, v) for k, v in sorted(config.items())]
    return out


def zk_state_to_image(brokers: Mapping[int, BrokerInfo], topics: Mapping[str, TopicAssignment],
                      states: Mapping[NamedPartition, PartitionState],
                      topic_configs: Mapping[str, Mapping[str, str]] | None = None, *, controller_epoch: int = 0,
                      offset: int = 0) -> MetadataImage:
    return image_from_records(zk_state_to_records(brokers, topics, states, topic_configs), offset, controller_epoch)


class ZkMetadataCache:
    """One broker's image, fed by the ZooKeeper-mode controller's requests.

    Each `handle_*` applies a request (if not stale), updates `image`, and
    returns the response to send back. Publish `image` to the broker after
    each call that changed it (`image.offset` moved).
    """

    def __init__(self, broker_id: int, image: MetadataImage | None = None) -> None:
        self.broker_id = broker_id
        self.image = image or MetadataImage()
        #: the newest controller epoch seen; older requests are refused
        self.controller_epoch = -1
        self.controller_id = -1
        #: this broker's own epoch (czxid of its registration); set when it registers
        self.broker_epoch = -1

    # --- request fencing -------------------------------------------------------------

    def _refusal(self, controller_id: int, controller_epoch: int, broker_epoch: int) -> ErrorCode | None:
        if controller_epoch < self.controller_epoch:
            return ErrorCode.stale_controller_epoch
        if broker_epoch != -1 and broker_epoch < self.broker_epoch:
            return ErrorCode.stale_broker_epoch
        self.controller_epoch, self.controller_id = controller_epoch, controller_id
        return None

    def _apply(self, records: list[Record]) -> None:
        if not records:
            return
        start = self.image.offset + 1
        self.image = self.image.apply(LoggedRecord(start + i, self.controller_epoch, r) for i, r in enumerate(records))

    def _topic_records(self, name: str, topic_id: uuid.UUID, records: list[Record], pending: dict) -> None:
        """Records that make topic `name` exist with id `topic_id` (recreating it if the id changed)."""
        current = pending.get(name, self.image.topic_ids_by_name.get(name))
        if current == topic_id:
            return
        if current is not None:
            records.append(RemoveTopicRecord(current))
        records.append(TopicRecord(name=name, topic_id=topic_id))
        pending[name] = topic_id

    def _partition_record(self, topic_id, p, replicas, isr, leader, leader_epoch, zk_version, adding=(),
                          removing=()) -> PartitionRecord | None:
        if not _partition_ok(replicas, isr, leader):
            _log.warning("broker %d: ignoring inconsistent partition state %s-%d replicas=%s isr=%s leader=%d",
                         self.broker_id, topic_id, p, replicas, isr, leader)
            return None
        return PartitionRecord(topic_id=topic_id, partition=p, replicas=tuple(replicas), isr=tuple(isr),
                               leader=leader, leader_epoch=leader_epoch, partition_epoch=max(zk_version, 0),
                               adding_replicas=tuple(adding), removing_replicas=tuple(removing))

    # --- UpdateMetadata -------------------------------------------------------------------

    def handle_update_metadata(self, req: m.UpdateMetadataRequest) -> m.UpdateMetadataResponse:
        error = self._refusal(req.controller_id, req.controller_epoch, req.broker_epoch)
        if error is not None:
            return m.UpdateMetadataResponse(error_code=error)
        records: list[Record] = []
        live = {}
        for b in req.live_brokers:
            live[b.id] = (tuple(Endpoint(e.listener, e.host, e.port, e.security_protocol) for e in b.endpoints),
                          b.rack)
        for b, (endpoints, rack) in sorted(live.items()):
            reg = self.image.brokers.get(b)
            if reg is None or reg.fenced or reg.endpoints != endpoints or reg.rack != rack:
                records.append(RegisterBrokerRecord(broker_id=b, incarnation_id=incarnation_id(b),
                                                    endpoints=endpoints, rack=rack, fenced=False))
        for b, reg in sorted(self.image.brokers.items()):
            if b not in live and not reg.fenced:
                records.append(BrokerRegistrationChangeRecord(broker_id=b, broker_epoch=reg.epoch, fenced=True))
        pending: dict[str, uuid.UUID | None] = {}
        for t in req.topic_states:
            if any(ps.leader == LEADER_DURING_DELETE for ps in t.partition_states):
                current = pending.get(t.topic_name, self.image.topic_ids_by_name.get(t.topic_name))
                if current is not None:
                    records.append(RemoveTopicRecord(current))
                    pending[t.topic_name] = None
                continue
            self._topic_records(t.topic_name, t.topic_id, records, pending)
            for ps in t.partition_states:
                r = self._partition_record(t.topic_id, ps.partition_index, ps.replicas, ps.isr, ps.leader,
                                           ps.leader_epoch, ps.zk_version)
                if r is not None and not self._same(t.topic_id, r):
                    records.append(r)
        self._apply(records)
        return m.UpdateMetadataResponse(error_code=ErrorCode.none)

    def _same(self, topic_id: uuid.UUID, r: PartitionRecord) -> bool:
        current = self.image.partition(topic_id, r.partition)
        return current is not None and current == PartitionRegistration.from_record(r)

    # --- LeaderAndIsr ----------------------------------------------------------------------

    def handle_leader_and_isr(self, req: m.LeaderAndIsrRequest) -> m.LeaderAndIsrResponse:
        error = self._refusal(req.controller_id, req.controller_epoch, req.broker_epoch)
        if error is not None:
            return m.LeaderAndIsrResponse(error_code=error, topics=())
        records: list[Record] = []
        pending: dict[str, uuid.UUID | None] = {}
        topics_out = []
        for t in req.topic_states:
            errors = []
            for ps in t.partition_states:
                code = ErrorCode.none
                current = (self.image.partition(t.topic_id, ps.partition_index)
                           if self.image.topic_ids_by_name.get(t.topic_name) == t.topic_id else None)
                if self.broker_id not in ps.replicas:
                    code = ErrorCode.unknown_topic_or_partition
                elif current is not None and (ps.leader_epoch, ps.partition_epoch) < (
                        current.leader_epoch, current.partition_epoch):
                    code = ErrorCode.stale_controller_epoch
                else:
                    r = self._partition_record(t.topic_id, ps.partition_index, ps.replicas, ps.isr, ps.leader,
                                               ps.leader_epoch, ps.partition_epoch, ps.adding_replicas,
                                               ps.removing_replicas)
                    if r is None:
                        code = ErrorCode.invalid_request
                    elif not self._same(t.topic_id, r):
                        self._topic_records(t.topic_name, t.topic_id, records, pending)
                        records.append(r)
                errors.append(m.LeaderAndIsrPartitionError(partition_index=ps.partition_index, error_code=code))
            topics_out.append(m.LeaderAndIsrTopicError(topic_id=t.topic_id, partition_errors=tuple(errors)))
        self._apply(records)
        return m.LeaderAndIsrResponse(error_code=ErrorCode.none, topics=tuple(topics_out))

    # --- StopReplica ------------------------------------------------------------------------

    def handle_stop_replica(self, req: m.StopReplicaRequest) -> m.StopReplicaResponse:
        error = self._refusal(req.controller_id, req.controller_epoch, req.broker_epoch)
        if error is not None:
            return m.StopReplicaResponse(error_code=error, partition_errors=())
        records: list[Record] = []
        out = []
        for t in req.topic_states:
            if any(ps.delete_partition for ps in t.partition_states):
                topic_id = self.image.topic_ids_by_name.get(t.topic_name)
                if topic_id is not None:
                    records.append(RemoveTopicRecord(topic_id))
            out += [m.StopReplicaPartitionError(topic_name=t.topic_name, partition_index=ps.partition_index,
                                                error_code=ErrorCode.none) for ps in t.partition_states]
        self._apply(records)
        return m.StopReplicaResponse(error_code=ErrorCode.none, partition_errors=tuple(out))

    # --- topic configs -----------------------------------------------------------------------

    def apply_topic_configs(self, configs: Mapping[str, Mapping[str, str]]) -> None:
        """Replace the configs of these topics with what `/config/topics/<t>` holds.

        Controller requests carry no configs: a ZooKeeper-mode broker reads them
        itself, for each new topic and after each `/config/changes` notification.
        Topics not in the image are skipped (deleted meanwhile)."""
        records: list[Record] = []
        for name, config in sorted(configs.items()):
            if name not in self.image.topic_ids_by_name:
                continue
            current = self.image.topic_config(name)
            records += [ConfigRecord(ConfigResourceType.TOPIC, name, k, None) for k in sorted(current)
                        if k not in config]
            records += [ConfigRecord(ConfigResourceType.TOPIC, name, k, v) for k, v in sorted(config.items())
                        if current.get(k) != v]
        self._apply(records)

    def handle(self, request: m.ControllerRequest) -> m.ControllerResponse:
        """Dispatch any controller request."""
        if isinstance(request, m.LeaderAndIsrRequest):
            return self.handle_leader_and_isr(request)
        if isinstance(request, m.UpdateMetadataRequest):
            return self.handle_update_metadata(request)
        assert isinstance(request, m.StopReplicaRequest), type(request)
        return self.handle_stop_replica(request)
