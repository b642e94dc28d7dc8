"""CreateTopics, DeleteTopics and CreatePartitions.

Theory of operation
-------------------
Each topic in a request is decided on its own and gets its own error code,
as in Kafka; the records of the successful ones go into one result.

* **Create** (KIP-631 `TopicRecord` + `PartitionRecord`s + `ConfigRecord`s).
  The name must be Kafka-legal ([a-zA-Z0-9._-], 1..249 characters, not "."
  or ".."); -1 partitions / replication factor mean `num.partitions` /
  `default.replication.factor`; the replication factor may not exceed the
  usable (unfenced, not shutting down) brokers; configs are validated key by
  key. Without a manual assignment, `placement.place_partitions` spreads
  leaders and replicas; with one, each partition's ISR is its usable
  replicas and its leader the first of them. A new partition starts at
  leader epoch 0 and partition epoch 0.
* **Delete** by name or by id: one `RemoveTopicRecord`; replaying it drops
  the partitions and the topic's configs, and brokers delete the replicas.
* **CreatePartitions** can only grow a topic. New partitions get the
  replication factor of partition 0 unless assigned manually.

Topic ids come from the injected `random.Random`, so a seeded controller is
reproducible. A request may create at most `MAX_PARTITIONS_PER_REQUEST`
partitions (Kafka's bound on one metadata batch): POLICY_VIOLATION beyond.
"""

from __future__ import annotations

import dataclasses
import random
import re
import uuid
from collections import Counter
from collections.abc import Sequence

from kio.schema.create_partitions.v3 import request as cp_req
from kio.schema.create_partitions.v3 import response as cp_resp
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.create_topics.v7 import response as ct_resp
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.delete_topics.v6 import response as dt_resp
from kio.schema.errors import ErrorCode

from common.errors import RaftkaError
from quorum.controller.config import ControllerConfig
from quorum.controller.config_control import topic_config_entries
from quorum.controller.placement import BrokerLoad, place_partitions
from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import (
    ConfigRecord,
    ConfigResourceType,
    PartitionRecord,
    Record,
    RemoveTopicRecord,
    TopicRecord,
)
from quorum.metadata.topic_configs import topic_config_error

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITIONS_PER_REQUEST = 10_000
ZERO_UUID = uuid.UUID(int=0)
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


class _Refusal(RaftkaError):
    """A per-topic error code and message; caught in this module and never raised further."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def topic_name_error(name: str) -> str | None:
    """None if `name` is a legal Kafka topic name, else why not."""
    if not name:
        return "Topic name is illegal, it can't be empty."
    if name in (".", ".."):
        return 'Topic name cannot be "." or "..".'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters."
    if not _LEGAL_NAME.match(name):
        return f'Topic name "{name}" is illegal, it contains a character other than ASCII alphanumerics, ".", "_" and "-".'
    return None


class _BrokerLimit:
    """`max.partitions.per.broker` over one request: the replicas each
    broker holds in the image plus those the request's accepted topics add."""

    def __init__(self, limit: int, image: MetadataImage) -> None:
        self.on = limit > 0
        self._limit = limit
        self._image = image
        self._added: Counter[int] = Counter()

    def check(self, layout: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], validate_only: bool) -> None:
        """Refuse `layout` if it puts a broker over the limit; else count it
        (a validation counts for nothing)."""
        if not self.on:
            return
        adding = Counter(b for replicas, _isr in layout for b in replicas)
        for broker, n in sorted(adding.items()):
            total = self._image.replica_count(broker) + self._added[broker] + n
            if total > self._limit:
                raise _Refusal(
                    ErrorCode.policy_violation,
                    f"Broker {broker} would hold {total} partition replicas, more than "
                    f"max.partitions.per.broker={self._limit} allows (it holds "
                    f"{self._image.replica_count(broker) + self._added[broker]}). Create fewer partitions, "
                    "add brokers, or raise max.partitions.per.broker.")
        if not validate_only:
            self._added.update(adding)


def _broker_loads(image: MetadataImage) -> list[BrokerLoad]:
    return [BrokerLoad(b.broker_id, b.rack, image.replica_count(b.broker_id), image.preferred_leader_count(b.broker_id))
            for b in image.usable_brokers()]


def _manual_partition(image: MetadataImage, index: int, replicas: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(replicas, isr) of a manually assigned partition, or _Refusal."""
    replicas = tuple(int(b) for b in replicas)
    if not replicas:
        raise _Refusal(ErrorCode.invalid_replica_assignment, f"The manual partition assignment for partition {index} is empty.")
    if len(set(replicas)) != len(replicas):
        raise _Refusal(ErrorCode.invalid_replica_assignment,
                       f"The manual partition assignment for partition {index} contains a broker twice: {list(replicas)}.")
    unknown = [b for b in replicas if b not in image.brokers]
    if unknown:
        raise _Refusal(ErrorCode.invalid_replica_assignment,
                       f"The manual partition assignment for partition {index} names broker {unknown[0]}, which is not registered.")
    isr = tuple(b for b in replicas if image.is_usable(b))
    if not isr:
        raise _Refusal(ErrorCode.invalid_replica_assignment,
                       f"All brokers specified in the manual partition assignment for partition {index} "
                       f"are fenced or in controlled shutdown.")
    return replicas, isr


def _check_replication_factor(rf: int, usable: int) -> None:
    if rf < 1:
        raise _Refusal(ErrorCode.invalid_replication_factor,
                       "Replication factor must be larger than 0, or -1 to use the default value.")
    if rf > usable:
        raise _Refusal(ErrorCode.invalid_replication_factor,
                       f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} "
                       f"cannot be reached because only {usable} broker(s) are registered and unfenced.")


def _partition_records(topic_id: uuid.UUID, first_index: int,
                       layout: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[Record]:
    return [PartitionRecord(topic_id=topic_id, partition=first_index + i, replicas=replicas, isr=isr, leader=isr[0])
            for i, (replicas, isr) in enumerate(layout)]


class TopicControlManager:
    """Topic creation and deletion; holds the seeded `Random` for topic ids."""

    def __init__(self, config: ControllerConfig, rng: random.Random) -> None:
        self._config = config
        self._rng = rng

    def _new_topic_id(self, image: MetadataImage, taken: set[uuid.UUID]) -> uuid.UUID:
        while True:
            topic_id = uuid.UUID(int=self._rng.getrandbits(128), version=4)
            if topic_id not in image.topics_by_id and topic_id not in taken:
                return topic_id

    # --- CreateTopics -----------------------------------------------------------

    def create_topics(self, request: ct_req.CreateTopicsRequest, image: MetadataImage,
                      now_ms: int) -> ControllerResult[ct_resp.CreateTopicsResponse]:
        counts = Counter(t.name for t in request.topics)
        loads = _broker_loads(image)
        records: list[Record] = []
        results = []
        taken: set[uuid.UUID] = set()
        budget = MAX_PARTITIONS_PER_REQUEST
        limit = _BrokerLimit(self._config.max_partitions_per_broker, image)
        for t in request.topics:
            try:
                if counts[t.name] > 1:
                    raise _Refusal(ErrorCode.invalid_request, "Found multiple entries for this topic.")
                topic_records, result = self._create_one(t, image, loads, taken, budget, request.validate_only,
                                                         limit)
            except _Refusal as r:
                results.append(ct_resp.CreatableTopicResult(
                    name=t.name, topic_id=ZERO_UUID, error_code=r.error, error_message=r.message,
                    num_partitions=-1, replication_factor=-1, configs=None))
                continue
            budget -= result.num_partitions
            records += topic_records
            results.append(result)
        return ControllerResult(tuple(records), ct_resp.CreateTopicsResponse(throttle_time=NO_THROTTLE,
                                                                             topics=tuple(results)))

    def _create_one(self, t: ct_req.CreatableTopic, image: MetadataImage, loads: list[BrokerLoad],
                    taken: set[uuid.UUID], budget: int, validate_only: bool,
                    limit: _BrokerLimit) -> tuple[list[Record], ct_resp.CreatableTopicResult]:
        problem = topic_name_error(t.name)
        if problem:
            raise _Refusal(ErrorCode.invalid_topic_exception, problem)
        if image.topic(t.name) is not None:
            raise _Refusal(ErrorCode.topic_already_exists, f"Topic '{t.name}' already exists.")
        configs: dict[str, str] = {}
        for c in t.configs:
            if c.name in configs:
                raise _Refusal(ErrorCode.invalid_config, f"Config {c.name} is given more than once.")
            problem = topic_config_error(c.name, c.value)
            if problem:
                raise _Refusal(ErrorCode.invalid_config, problem)
            configs[c.name] = c.value  # type: ignore[assignment]  # validated non-null above
        if t.assignments:
            if t.num_partitions != -1 or t.replication_factor != -1:
                raise _Refusal(ErrorCode.invalid_request,
                               "Both numPartitions or replicationFactor and replicasAssignments were set. "
                               "Both cannot be used at the same time.")
            if len(t.assignments) > budget:
                raise _Refusal(ErrorCode.policy_violation, "Excessively large number of partitions per request.")
            by_index = {int(a.partition_index): a.broker_ids for a in t.assignments}
            if sorted(by_index) != list(range(len(t.assignments))):
                raise _Refusal(ErrorCode.invalid_replica_assignment,
                               "Partitions of a manual assignment must be numbered 0, 1, 2... without gaps or repeats.")
            layout = [_manual_partition(image, i, by_index[i]) for i in range(len(by_index))]
        else:
            partitions = self._config.num_partitions if t.num_partitions == -1 else int(t.num_partitions)
            if partitions < 1:
                raise _Refusal(ErrorCode.invalid_partitions, "Number of partitions was set to an invalid non-positive value.")
            rf = self._config.default_replication_factor if t.replication_factor == -1 else int(t.replication_factor)
            _check_replication_factor(rf, len(loads))
            if partitions > budget:
                raise _Refusal(ErrorCode.policy_violation, "Excessively large number of partitions per request.")
            # A validation, or a topic refused for the per-broker limit, must
            # not count toward the placement of the topics after it.
            scratch = [dataclasses.replace(b) for b in loads] if validate_only or limit.on else loads
            layout = [(r, r) for r in place_partitions(scratch, partitions, rf)]
            limit.check(layout, validate_only)
            if scratch is not loads and not validate_only:
                loads[:] = scratch
        if t.assignments:
            limit.check(layout, validate_only)
        topic_id = ZERO_UUID if validate_only else self._new_topic_id(image, taken)
        taken.add(topic_id)
        result = ct_resp.CreatableTopicResult(
            name=t.name, topic_id=topic_id, error_code=ErrorCode.none, error_message=None,
            num_partitions=len(layout), replication_factor=len(layout[0][0]),
            configs=tuple(ct_resp.CreatableTopicConfigs(name=e.name, value=e.value, read_only=e.read_only,
                                                         config_source=e.config_source, is_sensitive=e.is_sensitive)
                          for e in topic_config_entries(configs)))
        if validate_only:
            return [], result
        records: list[Record] = [TopicRecord(name=t.name, topic_id=topic_id)]
        records += [ConfigRecord(ConfigResourceType.TOPIC, t.name, k, v) for k, v in sorted(configs.items())]
        records += _partition_records(topic_id, 0, layout)
        return records, result

    # --- DeleteTopics -------------------------------------------------------------

    def delete_topics(self, request: dt_req.DeleteTopicsRequest, image: MetadataImage,
                      now_ms: int) -> ControllerResult[dt_resp.DeleteTopicsResponse]:
        resolved = []
        for s in request.topics:
            if s.name:
                topic = image.topic(s.name)
                error = ErrorCode.unknown_topic_or_partition if topic is None else ErrorCode.none
            elif s.topic_id is not None and s.topic_id != ZERO_UUID:
                topic = image.topics_by_id.get(s.topic_id)
                error = ErrorCode.unknown_topic_id if topic is None else ErrorCode.none
            else:
                topic, error = None, ErrorCode.invalid_request
            resolved.append((s, topic, error))
        counts = Counter(topic.topic_id for _, topic, _ in resolved if topic is not None)
        records: list[Record] = []
        results = []
        for s, topic, error in resolved:
            message = None
            if topic is not None and counts[topic.topic_id] > 1:
                error, message = ErrorCode.invalid_request, "Duplicate topic in request."
            elif error == ErrorCode.invalid_request:
                message = "Name the topic to delete, or give its id."
            if error == ErrorCode.none and topic is not None:
                records.append(RemoveTopicRecord(topic_id=topic.topic_id))
            results.append(dt_resp.DeletableTopicResult(
                name=topic.name if topic is not None else s.name,
                topic_id=topic.topic_id if topic is not None else (s.topic_id or ZERO_UUID),
                error_code=error, error_message=message))
        return ControllerResult(tuple(records), dt_resp.DeleteTopicsResponse(throttle_time=NO_THROTTLE,
                                                                             responses=tuple(results)))

    # --- CreatePartitions ------------------------------------------------------------

    def create_partitions(self, request: cp_req.CreatePartitionsRequest, image: MetadataImage,
                          now_ms: int) -> ControllerResult[cp_resp.CreatePartitionsResponse]:
        counts = Counter(t.name for t in request.topics)
        loads = _broker_loads(image)
        records: list[Record] = []
        results = []
        budget = MAX_PARTITIONS_PER_REQUEST
        limit = _BrokerLimit(self._config.max_partitions_per_broker, image)
        for t in request.topics:
            try:
                if counts[t.name] > 1:
                    raise _Refusal(ErrorCode.invalid_request, "Found multiple entries for this topic.")
                new_records = self._grow_one(t, image, loads, budget, limit, request.validate_only)
            except _Refusal as r:
                results.append(cp_resp.CreatePartitionsTopicResult(name=t.name, error_code=r.error,
                                                                   error_message=r.message))
                continue
            budget -= len(new_records)
            if not request.validate_only:
                records += new_records
            results.append(cp_resp.CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.none,
                                                               error_message=None))
        return ControllerResult(tuple(records), cp_resp.CreatePartitionsResponse(throttle_time=NO_THROTTLE,
                                                                                 results=tuple(results)))

    def _grow_one(self, t: cp_req.CreatePartitionsTopic, image: MetadataImage, loads: list[BrokerLoad],
                  budget: int, limit: _BrokerLimit, validate_only: bool) -> list[Record]:
        topic = image.topic(t.name)
        if topic is None:
            raise _Refusal(ErrorCode.unknown_topic_or_partition, f"Topic '{t.name}' does not exist.")
        current = len(topic.partitions)
        if t.count < current:
            raise _Refusal(ErrorCode.invalid_partitions,
                           f"Topic currently has {current} partitions, which is higher than the requested {t.count}.")
        if t.count == current:
            raise _Refusal(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
        additional = int(t.count) - current
        if additional > budget:
            raise _Refusal(ErrorCode.policy_violation, "Excessively large number of partitions per request.")
        if t.assignments is not None:
            if len(t.assignments) != additional:
                raise _Refusal(ErrorCode.invalid_replica_assignment,
                               f"Attempted to add {additional} additional partition(s), but only "
                               f"{len(t.assignments)} assignment(s) were specified.")
            layout = [_manual_partition(image, current + i, a.broker_ids) for i, a in enumerate(t.assignments)]
        else:
            rf = len(topic.partitions[0].replicas)
            _check_replication_factor(rf, len(loads))
            scratch = [dataclasses.replace(b) for b in loads] if limit.on else loads
            layout = [(r, r) for r in place_partitions(scratch, additional, rf)]
            limit.check(layout, validate_only)
            if scratch is not loads:
                loads[:] = scratch
            return _partition_records(topic.topic_id, current, layout)
        limit.check(layout, validate_only)
        return _partition_records(topic.topic_id, current, layout)
