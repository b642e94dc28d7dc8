"""AlterPartition (ISR changes from partition leaders) and ElectLeaders.

Theory of operation
-------------------
**AlterPartition** (KIP-497, KIP-841, KIP-903). A partition leader asks to
shrink or expand its ISR. The controller accepts the change only from the
current leader at the current leader epoch and partition epoch, so a
request computed from stale state can never overwrite a newer decision:

  1. a leader epoch above ours means we are behind: NOT_CONTROLLER;
     a partition epoch above ours likewise;
  2. a leader epoch below ours: FENCED_LEADER_EPOCH (the sender was deposed);
  3. a sender that is not the leader: INVALID_REQUEST;
  4. a partition epoch below ours: INVALID_UPDATE_VERSION (the leader must
     refresh its state from the metadata log and retry);
  5. the new ISR must be distinct replicas and contain the leader:
     INVALID_REQUEST;
  6. every ISR member must be registered, unfenced, not in controlled
     shutdown and, when the request names one, at the broker epoch we know:
     INELIGIBLE_REPLICA (KIP-841; KIP-903 for the epoch).

An accepted change is one PartitionChange record; the response carries the
state after it (partition epoch + 1). An ISR expansion that brings the
last adding replica of a reassignment in sync is followed by the record
completing the reassignment (KIP-455, `reassignment.complete_if_done`). The sender's own broker epoch is
checked first (STALE_BROKER_EPOCH for the whole request).

**ElectLeaders** (KIP-460). PREFERRED moves leadership to the first replica
when it is live and in the ISR; UNCLEAN elects a leader for a partition
that has none, from the ISR if possible, else from any live replica.
"""

from __future__ import annotations

import uuid

from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.alter_partition.v3 import response as ap_resp
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.elect_leaders.v2 import response as el_resp
from kio.schema.errors import ErrorCode

from quorum.controller.config import ControllerConfig
from quorum.controller.elections import partition_change
from quorum.controller.reassignment import complete_if_done
from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.image import MetadataImage, PartitionRegistration
from quorum.metadata.records import NO_LEADER, PartitionChangeRecord, Record

PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


class ReplicationControlManager:
    """Stateless: every decision is a function of the request and the image."""

    def __init__(self, config: ControllerConfig) -> None:
        self._config = config

    # --- AlterPartition -------------------------------------------------------

    def alter_partition(self, request: ap_req.AlterPartitionRequest, image: MetadataImage,
                        now_ms: int) -> ControllerResult[ap_resp.AlterPartitionResponse]:
        sender = image.brokers.get(request.broker_id)
        if sender is None or (request.broker_epoch != -1 and sender.epoch != request.broker_epoch):
            return ControllerResult((), ap_resp.AlterPartitionResponse(
                throttle_time=NO_THROTTLE, error_code=ErrorCode.stale_broker_epoch, topics=()))
        records: list[Record] = []
        topics_out = []
        seen: set[tuple[uuid.UUID | None, int]] = set()
        for t in request.topics:
            topic = image.topics_by_id.get(t.topic_id) if t.topic_id is not None else None
            parts_out = []
            for pd in t.partitions:
                key = (t.topic_id, pd.partition_index)
                current = topic.partitions.get(pd.partition_index) if topic is not None else None
                if topic is None:
                    error = ErrorCode.unknown_topic_id
                elif key in seen:
                    error = ErrorCode.invalid_request
                else:
                    error = self._validate(request.broker_id, current, pd, image)
                seen.add(key)
                if error != ErrorCode.none or current is None or topic is None:
                    parts_out.append(_partition_error(pd.partition_index, error))
                    continue
                new_isr = tuple(b.broker_id for b in pd.new_isr_with_epochs)
                after = current
                if new_isr != current.isr:
                    change = PartitionChangeRecord(topic_id=topic.topic_id, partition=pd.partition_index, isr=new_isr)
                    records.append(change)
                    after = current.merge(change)
                    done = complete_if_done(topic.topic_id, pd.partition_index, after, image.is_usable)
                    if done is not None:
                        records.append(done)
                        after = after.merge(done)
                parts_out.append(_partition_state(pd.partition_index, after))
            topics_out.append(ap_resp.TopicData(topic_id=t.topic_id, partitions=tuple(parts_out)))
        return ControllerResult(tuple(records), ap_resp.AlterPartitionResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, topics=tuple(topics_out)))

    @staticmethod
    def _validate(sender: int, current: PartitionRegistration | None, pd: ap_req.PartitionData,
                  image: MetadataImage) -> ErrorCode:
        if current is None:
            return ErrorCode.unknown_topic_or_partition
        if pd.leader_epoch > current.leader_epoch or pd.partition_epoch > current.partition_epoch:
            return ErrorCode.not_controller
        if pd.leader_epoch < current.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        if sender != current.leader:
            return ErrorCode.invalid_request
        if pd.partition_epoch < current.partition_epoch:
            return ErrorCode.invalid_update_version
        new_isr = [b.broker_id for b in pd.new_isr_with_epochs]
        if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(current.replicas):
            return ErrorCode.invalid_request
        if current.leader not in new_isr:
            return ErrorCode.invalid_request
        for member in pd.new_isr_with_epochs:
            reg = image.brokers.get(member.broker_id)
            if reg is None or not reg.usable or (member.broker_epoch != -1 and member.broker_epoch != reg.epoch):
                return ErrorCode.ineligible_replica
        return ErrorCode.none

    # --- ElectLeaders ---------------------------------------------------------------

    def elect_leaders(self, request: el_req.ElectLeadersRequest, image: MetadataImage,
                      now_ms: int) -> ControllerResult[el_resp.ElectLeadersResponse]:
        election = int(request.election_type)
        if election not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
            return ControllerResult((), el_resp.ElectLeadersResponse(
                throttle_time=NO_THROTTLE, error_code=ErrorCode.invalid_request, replica_election_results=()))
        everything = request.topic_partitions is None
        if request.topic_partitions is None:
            wanted = [(name, sorted(image.topics_by_id[tid].partitions))
                      for name, tid in sorted(image.topic_ids_by_name.items())]
        else:
            wanted = [(tp.topic, list(tp.partitions)) for tp in request.topic_partitions]
        records: list[Record] = []
        done: set[tuple[str, int]] = set()
        results = []
        for name, partitions in wanted:
            part_results = []
            for index in partitions:
                if (name, index) in done:
                    continue
                done.add((name, index))
                error, message, change = self._elect_one(image, name, index, election)
                if change is not None:
                    records.append(change)
                if everything and error == ErrorCode.election_not_needed:
                    continue  # as Kafka: "elect everything" reports only what it attempted
                part_results.append(el_resp.PartitionResult(partition_id=index, error_code=error, error_message=message))
            if part_results or not everything:
                results.append(el_resp.ReplicaElectionResult(topic=name, partition_result=tuple(part_results)))
        return ControllerResult(tuple(records), el_resp.ElectLeadersResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, replica_election_results=tuple(results)))

    @staticmethod
    def _elect_one(image: MetadataImage, name: str, index: int,
                   election: int) -> tuple[ErrorCode, str | None, PartitionChangeRecord | None]:
        topic = image.topic(name)
        current = topic.partitions.get(index) if topic is not None else None
        if topic is None or current is None:
            return ErrorCode.unknown_topic_or_partition, f"{name}-{index} does not exist", None
        if election == PREFERRED_ELECTION:
            preferred = current.replicas[0]
            if current.leader == preferred:
                return ErrorCode.election_not_needed, None, None
            if preferred not in current.isr or not image.is_usable(preferred):
                return (ErrorCode.preferred_leader_not_available,
                        f"preferred leader {preferred} of {name}-{index} is not live and in the ISR", None)
            change = partition_change(topic.topic_id, index, current, is_live=image.is_usable,
                                      unclean=False, preferred=True)
            return ErrorCode.none, None, change
        if current.leader != NO_LEADER and image.is_usable(current.leader):
            return ErrorCode.election_not_needed, None, None
        change = partition_change(topic.topic_id, index, current, is_live=image.is_usable, unclean=True)
        if change is None or change.leader in (None, NO_LEADER):
            return (ErrorCode.eligible_leaders_not_available,
                    f"no live replica of {name}-{index} can lead", None)
        return ErrorCode.none, None, change


def _partition_error(index: int, error: ErrorCode) -> ap_resp.PartitionData:
    return ap_resp.PartitionData(partition_index=index, error_code=error, leader_id=NO_LEADER,
                                 leader_epoch=-1, isr=(), partition_epoch=-1)


def _partition_state(index: int, p: PartitionRegistration) -> ap_resp.PartitionData:
    return ap_resp.PartitionData(partition_index=index, error_code=ErrorCode.none, leader_id=p.leader,
                                 leader_epoch=p.leader_epoch, isr=p.isr, partition_epoch=p.partition_epoch)
