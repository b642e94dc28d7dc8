"""Broker registration, heartbeats, fencing and controlled shutdown (KIP-631).

Theory of operation
-------------------
A broker's lifecycle, as the image records it (`fenced`,
`in_controlled_shutdown`) and as heartbeats move it:

    (none)    => FENCED       BrokerRegistration; a new RegisterBroker
                              record whose offset is the broker epoch
    FENCED    => UNFENCED     heartbeat with current_metadata_offset >= the
                              broker epoch (caught up) and not want_fence;
                              offline partitions it hosts elect leaders
    UNFENCED  => FENCED       missed heartbeats for broker.session.timeout.ms
                              (`tick`), or want_fence: it leaves every ISR and
                              its partitions elect new leaders
    UNFENCED  => SHUTTING     heartbeat with want_shut_down: leadership moves
                 DOWN         away and it leaves the ISRs first (KIP-631
                              controlled shutdown)
    SHUTTING  => FENCED       the next heartbeat once it leads nothing:
      DOWN                    respond should_shut_down
    any       => (none)       UnregisterBroker

Offline log dirs (KIP-858). A broker whose log dir failed lists the dir's
id in every heartbeat (`offline_log_dirs`); a change of that list is
written to the image (`BrokerRegistrationChangeRecord.offline_log_dirs`;
a new registration starts with none). The broker sends
AssignReplicasToDirs naming the partitions that were in the dir: each
replica's dir is written to its partition (`directories`, as Kafka's
PartitionChangeRecord carries it), and replicas assigned to a dir the
broker reports offline leave their ISRs and, where the broker led,
leadership moves to another in-sync replica, as Kafka's controller does.
Metadata answers list a replica in an offline dir among the partition's
offline replicas (`PartitionRegistration.offline_replicas`). The broker
sends the assignment again until its image shows the replicas assigned
and out of the ISRs, so a new active controller (which learns the offline
dirs for its decisions from the next heartbeat) finishes the work.

No metadata batch carries more than MAX_CHANGES_PER_BATCH partition
changes (as no CreateTopics creates more partitions): a broker leaving
100,000 partitions in one batch made a request larger than a metadata
batch may be, and every broker replays a batch whole before acting on its
first record. A controlled shutdown gets the next changes at each of its
heartbeats (100 ms apart while it waits); the leaders a returning broker's
unfencing elects past the first batch come in the ticks after it
(`tick`), as the moves off a fenced broker do (`LeaderMoves`). Kafka's
controller, too, appends a large non-atomic result as several batches.

The image is the durable part. The soft part -- when each broker last
heartbeated -- lives only in this manager on the active controller and is
rebuilt when a controller becomes active: every registered broker gets a
fresh session then, as Kafka grants after a failover.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from kio.schema.assign_replicas_to_dirs.v0 import request as ard_req
from kio.schema.assign_replicas_to_dirs.v0 import response as ard_resp
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest, BrokerRegistrationResponse
from kio.schema.errors import ErrorCode
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest, UnregisterBrokerResponse

from quorum.controller.config import ControllerConfig
from quorum.controller.elections import (
    LeaderMoves,
    changes_for_leaving_brokers,
    changes_for_offline_replicas,
    changes_for_returning_broker,
)
from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.controller.topic_control import MAX_PARTITIONS_PER_REQUEST
from quorum.metadata.image import BrokerRegistration, MetadataImage, TopicPartition
from quorum.metadata.records import (
    UNASSIGNED_DIR,
    BrokerRegistrationChangeRecord,
    Endpoint,
    PartitionChangeRecord,
    Record,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)


MAX_CHANGES_PER_BATCH = MAX_PARTITIONS_PER_REQUEST

_log = logging.getLogger("quorum.controller")


def _directories(current, replicas: tuple[int, ...] | None, broker_id: int,
                 directory: uuid.UUID) -> tuple[uuid.UUID, ...]:
    """The `directories` of a change to `current` that gives `replicas`
    (None: unchanged) with `broker_id`'s replica in `directory`."""
    dirs = current.with_directory(broker_id, directory)
    if replicas is None:
        return dirs
    by_replica = dict(zip(current.replicas, dirs))
    return tuple(by_replica.get(r, UNASSIGNED_DIR) for r in replicas)


def _heartbeat_response(error: ErrorCode, *, caught_up: bool = False, fenced: bool = True,
                        shut_down: bool = False) -> BrokerHeartbeatResponse:
    return BrokerHeartbeatResponse(throttle_time=NO_THROTTLE, error_code=error, is_caught_up=caught_up,
                                   is_fenced=fenced, should_shut_down=shut_down)


class ClusterControlManager:
    """Registrations and liveness of brokers; holds the heartbeat soft state."""

    def __init__(self, config: ControllerConfig, image: MetadataImage, now_ms: int) -> None:
        self._config = config
        self._last_heartbeat_ms: dict[int, int] = {b: now_ms for b in image.brokers}
        # Brokers this manager has fenced whose fencing the image does not show yet.
        self._fencing: set[int] = set()
        # Their partitions, moved a batch per tick (and a fenced broker's
        # leftovers when a controller failover came halfway).
        self._moves = LeaderMoves(image)
        # Unfenced brokers whose offline partitions may still need a leader
        # elected (more than one batch's worth when unfenced).
        self._elections_owed: set[int] = set()
        #: The log dirs each broker's heartbeats report offline (module doc).
        self._offline_dirs: dict[int, frozenset[uuid.UUID]] = {}

    def has_valid_session(self, broker_id: int, now_ms: int) -> bool:
        last = self._last_heartbeat_ms.get(broker_id)
        return last is not None and now_ms - last <= self._config.broker_session_timeout_ms

    def _touch(self, broker_id: int, now_ms: int) -> None:
        self._last_heartbeat_ms[broker_id] = now_ms
        self._fencing.discard(broker_id)

    # --- BrokerRegistration ---------------------------------------------------

    def register(self, request: BrokerRegistrationRequest, image: MetadataImage,
                 now_ms: int) -> ControllerResult[BrokerRegistrationResponse]:
        """Register a broker. The response's broker epoch is filled by `ControllerResult.respond`."""

        def refuse(error: ErrorCode) -> ControllerResult[BrokerRegistrationResponse]:
            return ControllerResult((), BrokerRegistrationResponse(throttle_time=NO_THROTTLE, error_code=error))

        if self._config.cluster_id is not None and request.cluster_id != self._config.cluster_id:
            return refuse(ErrorCode.inconsistent_cluster_id)
        if request.incarnation_id is None:
            return refuse(ErrorCode.invalid_request)
        broker_id = request.broker_id
        endpoints = tuple(Endpoint(l.name, l.host, int(l.port), int(l.security_protocol)) for l in request.listeners)
        existing = image.brokers.get(broker_id)
        if existing is not None:
            if existing.incarnation_id == request.incarnation_id:
                if existing.endpoints == endpoints and existing.rack == request.rack:
                    # The same process asking again (its response was lost): same epoch, no record.
                    self._touch(broker_id, now_ms)
                    return ControllerResult((), BrokerRegistrationResponse(
                        throttle_time=NO_THROTTLE, error_code=ErrorCode.none, broker_epoch=existing.epoch))
            elif not existing.fenced and self.has_valid_session(broker_id, now_ms):
                # Another live process claims this id: two brokers with one id
                # would split-brain every partition they host.
                return refuse(ErrorCode.duplicate_broker_registration)
        records: list[Record] = [RegisterBrokerRecord(
            broker_id=broker_id, incarnation_id=request.incarnation_id, endpoints=endpoints,
            rack=request.rack, fenced=True)]
        self._offline_dirs.pop(broker_id, None)  # a new process reports its own
        if existing is not None:
            # The previous incarnation may still lead or sit in ISRs; a
            # restarted process may have lost unflushed data, so it leaves
            # them, a batch now and the rest in the ticks after (`LeaderMoves`).
            self._elections_owed.discard(broker_id)
            self._moves.add(image, (broker_id,))
            records += self._moves.take(image, self._config, MAX_CHANGES_PER_BATCH, fencing=(broker_id,))
        self._touch(broker_id, now_ms)
        return ControllerResult(
            tuple(records),
            BrokerRegistrationResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode.none),
            broker_epoch_record_index=0,
        )

    # --- BrokerHeartbeat --------------------------------------------------------

    def heartbeat(self, request: BrokerHeartbeatRequest, image: MetadataImage,
                  now_ms: int) -> ControllerResult[BrokerHeartbeatResponse]:
        broker_id = request.broker_id
        reg = image.brokers.get(broker_id)
        if reg is None:
            return ControllerResult((), _heartbeat_response(ErrorCode.broker_id_not_registered))
        if request.broker_epoch != reg.epoch:
            return ControllerResult((), _heartbeat_response(ErrorCode.stale_broker_epoch))
        self._touch(broker_id, now_ms)
        offline = frozenset(d for d in request.offline_log_dirs if d is not None)
        if offline != self._offline_dirs.get(broker_id, frozenset()):
            _log.warning("broker %d reports %d offline log dir(s)%s", broker_id, len(offline),
                         f": {', '.join(sorted(str(d) for d in offline))}" if offline else "")
            self._offline_dirs[broker_id] = offline
        result = self._heartbeat(request, image, reg)
        if offline == reg.offline_log_dirs:
            return result
        dirs = BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=reg.epoch,
                                              offline_log_dirs=tuple(sorted(offline)))
        return ControllerResult((dirs, *result.records), result.response)

    def _heartbeat(self, request: BrokerHeartbeatRequest, image: MetadataImage,
                   reg: BrokerRegistration) -> ControllerResult[BrokerHeartbeatResponse]:
        """The lifecycle step of a heartbeat (module doc's table)."""
        broker_id = request.broker_id
        caught_up = request.current_metadata_offset >= reg.epoch
        ok = ErrorCode.none

        def change(**fields: bool) -> BrokerRegistrationChangeRecord:
            return BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=reg.epoch, **fields)

        if reg.fenced:
            if request.want_shut_down or reg.in_controlled_shutdown:
                return ControllerResult((), _heartbeat_response(ok, caught_up=caught_up, shut_down=True))
            if request.want_fence or not caught_up:
                return ControllerResult((), _heartbeat_response(ok, caught_up=caught_up))
            elections = changes_for_returning_broker(image, broker_id, self._config, MAX_CHANGES_PER_BATCH)
            if len(elections) >= MAX_CHANGES_PER_BATCH:
                self._elections_owed.add(broker_id)
            records = [change(fenced=False), *elections]
            return ControllerResult(tuple(records), _heartbeat_response(ok, caught_up=True, fenced=False))

        if reg.in_controlled_shutdown:
            moves = changes_for_leaving_brokers(image, (broker_id,), self._config, MAX_CHANGES_PER_BATCH)
            if moves:
                return ControllerResult(tuple(moves), _heartbeat_response(ok, caught_up=caught_up, fenced=False))
            # It leads nothing and has left every ISR it could: let it go.
            return ControllerResult((change(fenced=True),),
                                    _heartbeat_response(ok, caught_up=caught_up, shut_down=True))
        if request.want_shut_down:
            records = [change(in_controlled_shutdown=True),
                       *changes_for_leaving_brokers(image, (broker_id,), self._config, MAX_CHANGES_PER_BATCH)]
            return ControllerResult(tuple(records), _heartbeat_response(ok, caught_up=caught_up, fenced=False))
        if request.want_fence:
            self._elections_owed.discard(broker_id)
            self._moves.add(image, (broker_id,))
            records = [change(fenced=True),
                       *self._moves.take(image, self._config, MAX_CHANGES_PER_BATCH, fencing=(broker_id,))]
            return ControllerResult(tuple(records), _heartbeat_response(ok, caught_up=caught_up))
        return ControllerResult((), _heartbeat_response(ok, caught_up=caught_up, fenced=False))

    # --- AssignReplicasToDirs ---------------------------------------------------

    def assign_replicas_to_dirs(self, request: ard_req.AssignReplicasToDirsRequest, image: MetadataImage,
                                now_ms: int) -> ControllerResult[ard_resp.AssignReplicasToDirsResponse]:
        """Replicas assigned to a dir the broker reports offline leave their
        ISRs and leaderships (module doc); at most MAX_CHANGES_PER_BATCH
        changes per request (the broker sends again for the rest)."""
        broker_id = request.broker_id
        reg = image.brokers.get(broker_id)
        error = ErrorCode.none
        if reg is None:
            error = ErrorCode.broker_id_not_registered
        elif request.broker_epoch != reg.epoch:
            error = ErrorCode.stale_broker_epoch
        if error is not ErrorCode.none:
            return ControllerResult((), ard_resp.AssignReplicasToDirsResponse(
                throttle_time=NO_THROTTLE, error_code=error, directories=()))
        offline = self._offline_dirs.get(broker_id, frozenset())
        lost: list[TopicPartition] = []
        #: Replicas whose dir in the image is not the one assigned now.
        assigned: dict[TopicPartition, uuid.UUID] = {}
        answer = []
        for d in request.directories:
            topics = []
            for t in d.topics:
                parts = []
                for p in t.partitions:
                    topic = image.topics_by_id.get(t.topic_id)
                    current = None if topic is None else topic.partitions.get(int(p.partition_index))
                    known = current is not None
                    tp = TopicPartition(t.topic_id, int(p.partition_index))
                    if known and d.id_ in offline:
                        lost.append(tp)
                    if known and broker_id in current.replicas and current.directory(broker_id) != d.id_:
                        assigned[tp] = d.id_
                    parts.append(ard_resp.PartitionData(
                        partition_index=p.partition_index,
                        error_code=ErrorCode.none if known else ErrorCode.unknown_topic_or_partition))
                topics.append(ard_resp.TopicData(topic_id=t.topic_id, partitions=tuple(parts)))
            answer.append(ard_resp.DirectoryData(id_=d.id_, topics=tuple(topics)))
        moves = changes_for_offline_replicas(image, broker_id, lost, self._config, MAX_CHANGES_PER_BATCH)
        if moves:
            _log.info("broker %d: %d replica(s) in an offline log dir leave their ISRs (%d partition change(s))",
                      broker_id, len(lost), len(moves))
        records: list[Record] = []
        for change in moves:
            tp = TopicPartition(change.topic_id, change.partition)
            directory = assigned.pop(tp, None)
            if directory is not None:
                # The dir goes in the same record as the ISR change (as Kafka's).
                change = dataclasses.replace(change, directories=_directories(
                    image.topics_by_id[tp.topic_id].partitions[tp.partition], change.replicas, broker_id,
                    directory))
            records.append(change)
        for tp, directory in assigned.items():
            if len(records) >= MAX_CHANGES_PER_BATCH:
                break  # the broker sends the rest again
            current = image.topics_by_id[tp.topic_id].partitions[tp.partition]
            records.append(PartitionChangeRecord(topic_id=tp.topic_id, partition=tp.partition,
                                                 directories=current.with_directory(broker_id, directory)))
        return ControllerResult(tuple(records), ard_resp.AssignReplicasToDirsResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, directories=tuple(answer)))

    # --- UnregisterBroker -------------------------------------------------------

    def unregister(self, request: UnregisterBrokerRequest, image: MetadataImage,
                   now_ms: int) -> ControllerResult[UnregisterBrokerResponse]:
        reg = image.brokers.get(request.broker_id)
        if reg is None:
            return ControllerResult((), UnregisterBrokerResponse(
                throttle_time=NO_THROTTLE, error_code=ErrorCode.broker_id_not_registered,
                error_message=f"broker {request.broker_id} is not registered"))
        records: list[Record] = list(changes_for_leaving_brokers(image, (reg.broker_id,), self._config))
        records.append(UnregisterBrokerRecord(broker_id=reg.broker_id, broker_epoch=reg.epoch))
        self._last_heartbeat_ms.pop(reg.broker_id, None)
        self._fencing.discard(reg.broker_id)
        return ControllerResult(tuple(records), UnregisterBrokerResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None))

    # --- session expiry -----------------------------------------------------------

    def tick(self, image: MetadataImage, now_ms: int) -> list[Record]:
        """Fence every unfenced broker whose last heartbeat is older than the
        session timeout, with the first `fence_moves_per_batch` moves of
        its partitions; else the next moves still owed (`LeaderMoves`)."""
        for gone in self._last_heartbeat_ms.keys() - image.brokers.keys():
            del self._last_heartbeat_ms[gone]
        stale = []
        for broker_id, reg in image.brokers.items():
            if reg.fenced:
                self._fencing.discard(broker_id)
                continue
            if broker_id in self._fencing:
                continue
            last = self._last_heartbeat_ms.setdefault(broker_id, now_ms)
            if now_ms - last > self._config.broker_session_timeout_ms:
                stale.append(reg)
        limit = self._config.fence_moves_per_batch
        if not stale:
            if self._moves:
                return self._moves.take(image, self._config, limit)
            return self._owed_elections(image)
        stale.sort(key=lambda r: r.broker_id)
        records: list[Record] = [BrokerRegistrationChangeRecord(broker_id=r.broker_id, broker_epoch=r.epoch, fenced=True)
                                 for r in stale]
        ids = [r.broker_id for r in stale]
        self._moves.add(image, ids)
        records += self._moves.take(image, self._config, limit, fencing=ids)
        self._fencing.update(ids)
        return records

    def _owed_elections(self, image: MetadataImage) -> list[Record]:
        """The next batch of leaders elected on a returning broker (module doc)."""
        while self._elections_owed:
            broker_id = min(self._elections_owed)
            if not image.is_usable(broker_id):
                self._elections_owed.discard(broker_id)
                continue
            elections = changes_for_returning_broker(image, broker_id, self._config, MAX_CHANGES_PER_BATCH)
            if len(elections) < MAX_CHANGES_PER_BATCH:
                self._elections_owed.discard(broker_id)
            if elections:
                return list(elections)
        return []

    @property
    def moves_owed(self) -> int:
        """Partitions of fenced brokers that later ticks still have to look at (`LeaderMoves`)."""
        return len(self._moves)

    def next_deadline_ms(self, image: MetadataImage) -> int | None:
        """When `tick` may next fence someone or move partitions (None: no unfenced broker to watch)."""
        if self._moves or self._elections_owed:
            return 0
        deadlines = [self._last_heartbeat_ms[b] + self._config.broker_session_timeout_ms + 1
                     for b, reg in image.brokers.items()
                     if not reg.fenced and b not in self._fencing and b in self._last_heartbeat_ms]
        return min(deadlines, default=None)
