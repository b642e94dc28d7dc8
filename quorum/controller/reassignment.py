"""Partition reassignment: AlterPartitionReassignments and ListPartitionReassignments (KIP-455).

Theory of operation
-------------------
A reassignment moves a partition from its *original* replicas to a *target*
list without ever having fewer copies than before. It runs in two metadata
steps, both `PartitionChange` records:

1. **Start** (`start_reassignment`). `adding = target - original`,
   `removing = original - target`, and the replica list becomes
   `target + removing` (target first, so its first broker is already the
   preferred leader). The ISR is unchanged. Brokers in `adding` see
   themselves in the replica list, create the log and fetch from the
   leader like any follower; the leader adds them to the ISR through
   AlterPartition once they have caught up.
2. **Complete** (`complete_if_done`, checked on every AlterPartition the
   controller accepts, when a reassignment starts and when a broker
   returns and partitions get a leader again). Once every `adding`
   broker is in the ISR and the ISR keeps a member of the target: the
   replica list becomes `target`, the ISR `ISR & target`, `adding` and
   `removing` are cleared and the leader is moved into the target if it
   is being removed. The record always names a leader, so the leader
   epoch is bumped: the removed replicas' fetches are fenced. Brokers no
   longer in the replica list stop the replica and delete its log
   (`quorum.metadata.delta`, StopReplica semantics).

A new reassignment of a partition that is being reassigned is planned from
its original replicas (`replicas - adding`), as Kafka does, in one record;
one whose target equals the original replicas cancels. **Cancel** (null
replicas, `revert_reassignment`) goes back to the original replicas:
`adding` leave the replica list and the ISR, and a leader among them is
replaced. Unlike Kafka, a change that would leave no in-sync replica (a
cancel after every original fell out of sync, a new target without any
ISR member) is refused rather than made with an unclean election: it
would drop acknowledged records without anyone asking for that.

Per-partition errors are Kafka's: UNKNOWN_TOPIC_OR_PARTITION,
INVALID_REPLICA_ASSIGNMENT (empty, duplicate or unregistered brokers),
NO_REASSIGNMENT_IN_PROGRESS (cancel with nothing to cancel).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from kio.schema.alter_partition_reassignments.v0 import request as apr_req
from kio.schema.alter_partition_reassignments.v0 import response as apr_resp
from kio.schema.errors import ErrorCode
from kio.schema.list_partition_reassignments.v0 import request as lpr_req
from kio.schema.list_partition_reassignments.v0 import response as lpr_resp

from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.image import MetadataImage, PartitionRegistration
from quorum.metadata.records import NO_LEADER, PartitionChangeRecord, Record

IsLive = Callable[[int], bool]


def reassigning(p: PartitionRegistration) -> bool:
    return bool(p.adding_replicas or p.removing_replicas)


def original_replicas(p: PartitionRegistration) -> tuple[int, ...]:
    """The replica list before the reassignment under way (the current one if none is)."""
    return tuple(r for r in p.replicas if r not in p.adding_replicas)


def target_replicas(p: PartitionRegistration) -> tuple[int, ...]:
    return tuple(r for r in p.replicas if r not in p.removing_replicas)


def _leader_among(candidates: tuple[int, ...], isr: tuple[int, ...], is_live: IsLive, current: int) -> int:
    """`current` if it may stay, else the first candidate that is live and in `isr` (NO_LEADER if none)."""
    if current in candidates and current in isr and is_live(current):
        return current
    return next((r for r in candidates if r in isr and is_live(r)), NO_LEADER)


def complete_if_done(topic_id: uuid.UUID, partition: int, current: PartitionRegistration,
                     is_live: IsLive) -> PartitionChangeRecord | None:
    """The record finishing `current`'s reassignment, or None while it must wait (KIP-455)."""
    if not reassigning(current):
        return None
    target = target_replicas(current)
    if not set(current.adding_replicas) <= set(current.isr):
        return None
    isr = tuple(r for r in current.isr if r in target)
    if not isr:
        return None
    leader = _leader_among(target, isr, is_live, current.leader)
    if leader == NO_LEADER:
        return None  # no live target member in the ISR yet: finishing now would take the partition offline
    return PartitionChangeRecord(topic_id=topic_id, partition=partition, replicas=target, isr=isr, leader=leader,
                                 adding_replicas=(), removing_replicas=())


def revert_reassignment(topic_id: uuid.UUID, partition: int, current: PartitionRegistration,
                        is_live: IsLive) -> tuple[list[PartitionChangeRecord], str | None]:
    """The record cancelling `current`'s reassignment (back to the original replicas), or why not."""
    assert reassigning(current)
    original = original_replicas(current)
    isr = tuple(r for r in current.isr if r in original)
    if not isr:
        # Kafka reverts anyway and elects uncleanly; that can silently drop
        # acknowledged records, so raftka refuses until an original catches up.
        return [], (f"no original replica {list(original)} is in sync (ISR {list(current.isr)}): cancelling now "
                    f"would lose acknowledged records; wait until one has caught up, or reassign to replicas that "
                    f"include an in-sync one")
    leader = _leader_among(original, isr, is_live, current.leader)
    return [PartitionChangeRecord(topic_id=topic_id, partition=partition, replicas=original, isr=isr, leader=leader,
                                  adding_replicas=(), removing_replicas=())], None


def start_reassignment(topic_id: uuid.UUID, partition: int, current: PartitionRegistration,
                       target: tuple[int, ...], is_live: IsLive) -> tuple[list[PartitionChangeRecord], str | None]:
    """Records moving `current` towards `target` (none: nothing to do), or why it cannot.

    A reassignment under way is replaced: the new one is planned from the
    original replicas, in one record, without passing through a state
    where the ISR might have no member left."""
    original = original_replicas(current)
    if target == original:
        return revert_reassignment(topic_id, partition, current, is_live) if reassigning(current) else ([], None)
    removing = tuple(r for r in original if r not in target)
    adding = tuple(r for r in target if r not in original)
    replicas = target + removing
    isr = tuple(r for r in current.isr if r in replicas)
    if not isr:
        return [], (f"none of the in-sync replicas {list(current.isr)} would stay among {list(replicas)}: "
                    f"the records only they hold would be lost; keep one of them in the target, or wait")
    leader = _leader_among(replicas, isr, is_live, current.leader)
    start = PartitionChangeRecord(
        topic_id=topic_id, partition=partition, replicas=replicas, isr=None if isr == current.isr else isr,
        leader=None if leader == current.leader else leader, adding_replicas=adding, removing_replicas=removing)
    records = [start]
    done = complete_if_done(topic_id, partition, current.merge(start), is_live)
    if done is not None:
        records.append(done)
    return records, None


def _assignment_error(image: MetadataImage, target: tuple[int, ...]) -> str | None:
    if not target:
        return "The replica list of a reassignment may not be empty."
    if len(set(target)) != len(target):
        return f"The replica list {list(target)} names a broker twice."
    unknown = [b for b in target if b not in image.brokers]
    if unknown:
        return f"Broker {unknown[0]} of the replica list {list(target)} is not registered."
    return None


class ReassignmentControlManager:
    """Stateless: the reassignment state is `adding_replicas`/`removing_replicas` in the image."""

    def alter_partition_reassignments(
        self, request: apr_req.AlterPartitionReassignmentsRequest, image: MetadataImage, now_ms: int,
    ) -> ControllerResult[apr_resp.AlterPartitionReassignmentsResponse]:
        records: list[Record] = []
        seen: set[tuple[str, int]] = set()
        topics_out = []
        for t in request.topics:
            parts_out = []
            for rp in t.partitions:
                key = (t.name, int(rp.partition_index))
                if key in seen:
                    error, message, changes = (ErrorCode.invalid_request,
                                               f"{t.name}-{key[1]} appears twice in the request.", [])
                else:
                    error, message, changes = self._reassign_one(image, t.name, key[1], rp.replicas)
                seen.add(key)
                records += changes
                parts_out.append(apr_resp.ReassignablePartitionResponse(
                    partition_index=rp.partition_index, error_code=error, error_message=message))
            topics_out.append(apr_resp.ReassignableTopicResponse(name=t.name, partitions=tuple(parts_out)))
        return ControllerResult(tuple(records), apr_resp.AlterPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None, responses=tuple(topics_out)))

    @staticmethod
    def _reassign_one(image: MetadataImage, name: str, index: int,
                      replicas: tuple[int, ...] | None) -> tuple[ErrorCode, str | None, list[PartitionChangeRecord]]:
        topic = image.topic(name)
        current = topic.partitions.get(index) if topic is not None else None
        if topic is None or current is None:
            return ErrorCode.unknown_topic_or_partition, f"{name}-{index} does not exist.", []
        if replicas is None:
            if not reassigning(current):
                return ErrorCode.no_reassignment_in_progress, f"{name}-{index} has no reassignment to cancel.", []
            changes, problem = revert_reassignment(topic.topic_id, index, current, image.is_usable)
        else:
            target = tuple(int(b) for b in replicas)
            problem = _assignment_error(image, target)
            if problem is not None:
                return ErrorCode.invalid_replica_assignment, problem, []
            changes, problem = start_reassignment(topic.topic_id, index, current, target, image.is_usable)
        if problem is not None:
            return ErrorCode.invalid_replica_assignment, f"{name}-{index}: {problem}", []
        return ErrorCode.none, None, changes

    def list_partition_reassignments(
        self, request: lpr_req.ListPartitionReassignmentsRequest, image: MetadataImage, now_ms: int,
    ) -> ControllerResult[lpr_resp.ListPartitionReassignmentsResponse]:
        if request.topics is None:
            wanted = [(name, None) for name in sorted(image.topic_ids_by_name)]
        else:
            wanted = [(t.name, tuple(int(i) for i in t.partition_indexes)) for t in request.topics]
        topics_out = []
        for name, indexes in wanted:
            topic = image.topic(name)
            if topic is None:
                continue  # as Kafka: unknown topics have nothing under way
            chosen = sorted(topic.partitions) if indexes is None else [i for i in indexes if i in topic.partitions]
            ongoing = [lpr_resp.OngoingPartitionReassignment(
                partition_index=i, replicas=topic.partitions[i].replicas,
                adding_replicas=topic.partitions[i].adding_replicas,
                removing_replicas=topic.partitions[i].removing_replicas)
                for i in chosen if reassigning(topic.partitions[i])]
            if ongoing:
                topics_out.append(lpr_resp.OngoingTopicReassignment(name=name, partitions=tuple(ongoing)))
        return ControllerResult((), lpr_resp.ListPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, error_message=None, topics=tuple(topics_out)))
