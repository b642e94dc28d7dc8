"""A ZooKeeper-mode broker's `ControllerChannel`: admin requests and ISR changes as znode writes.

Theory of operation
-------------------
A KRaft broker forwards CreateTopics, DeleteTopics, configs, AllocateProducerIds
and its leaders' AlterPartition to the active controller. A ZooKeeper-mode
Kafka broker asks nobody: it writes znodes itself (Kafka's `AdminZkClient`,
`ZkAdminManager`, `ProducerIdManager` and, before KIP-497, the leader's own
ISR write) and the controller reacts to its watches. `ZkBrokerChannel`
does the same behind the one door the broker already has (`broker.
controller.send(request)`), so the broker's handlers run unchanged:

* **CreateTopics / DeleteTopics**: the KRaft controller's own decision
  (`quorum.controller.topic_control`) runs on this broker's image, which
  holds the live brokers and topics; its records become `admin.create_topic`
  (config, then assignment with the topic id) or `admin.delete_topic`.
  A topic another broker created meanwhile is refused by ZooKeeper
  (TOPIC_ALREADY_EXISTS).
* **DescribeConfigs / IncrementalAlterConfigs**: decided on the image (its
  topic configs come from `/config/topics`, see `broker.shell.zk_link`); a change
  rewrites `/config/topics/<t>` and leaves a `/config/changes` notification.
* **CreatePartitions**: decided on the image as well; the new partitions are
  added to `/brokers/topics/<t>` conditional on its zkVersion, and the
  controller's watch on that znode brings them online.
* **AllocateProducerIds**: the next block of `/latest_producer_id_block`,
  claimed with a conditional set (Kafka's `ZkProducerIdManager`).
* **AlterPartition**: for each partition, the leader re-reads its state
  znode and, if the leader, leader epoch and zkVersion are still the ones
  it proposed from, writes the new ISR conditional on that zkVersion
  (`broker_side.write_isr_change`), then leaves one ISR-change notification
  for the controller. The answer carries the new zkVersion as the partition
  epoch, so the leader adopts it as it adopts a KRaft controller's answer.

All znode work blocks (kazoo) and runs in a worker thread.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import trio
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kio.schema.allocate_producer_ids.v0.request import AllocateProducerIdsRequest
from kio.schema.allocate_producer_ids.v0.response import AllocateProducerIdsResponse
from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.alter_partition.v3 import response as ap_resp
from kio.schema.alter_partition_reassignments.v0 import request as apr_req
from kio.schema.alter_partition_reassignments.v0 import response as apr_resp
from kio.schema.create_partitions.v3 import request as cp_req
from kio.schema.create_partitions.v3 import response as cp_resp
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.create_topics.v7 import response as ct_resp
from kio.schema.delete_topics.v6 import request as dt_req
from kio.schema.describe_configs.v4 import request as dc_req
from kio.schema.elect_leaders.v2 import request as el_req
from kio.schema.elect_leaders.v2 import response as el_resp
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac_req
from kio.schema.list_partition_reassignments.v0 import request as lpr_req
from kio.schema.list_partition_reassignments.v0 import response as lpr_resp

from quorum.controller.config import ControllerConfig
from quorum.controller.config_control import ConfigControlManager
from quorum.controller.result import NO_THROTTLE
from quorum.controller.topic_control import ZERO_UUID, TopicControlManager
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import ConfigRecord, PartitionRecord, RemoveTopicRecord, TopicRecord
from quorum.zookeeper import admin
from quorum.zookeeper import znodes as z
from quorum.zookeeper.broker_side import notify_isr_changes, write_isr_change
from quorum.zookeeper.errors import StaleZNodeVersionError
from quorum.zookeeper.znodes import NamedPartition

#: Producer ids per block, as Kafka's `ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE`.
PRODUCER_ID_BLOCK_SIZE = 1000


class ZkBrokerChannel:
    """`broker.shell.controller_channel.ControllerChannel` for a ZooKeeper-mode broker."""

    def __init__(self, zk: KazooClient, broker_id: int, image: Callable[[], MetadataImage],
                 config: ControllerConfig, rng: random.Random | None = None) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.image = image
        self.topics = TopicControlManager(config, rng or random.Random())
        self.configs = ConfigControlManager()

    async def send(self, request: Any) -> Any:
        handler = {
            ct_req.CreateTopicsRequest: self._create_topics,
            dt_req.DeleteTopicsRequest: self._delete_topics,
            cp_req.CreatePartitionsRequest: self._create_partitions,
            dc_req.DescribeConfigsRequest: self._describe_configs,
            iac_req.IncrementalAlterConfigsRequest: self._alter_configs,
            AllocateProducerIdsRequest: self._allocate_producer_ids,
            ap_req.AlterPartitionRequest: self._alter_partition,
        }.get(type(request))
        if handler is None:
            return _not_in_zookeeper_mode(request)
        return await trio.to_thread.run_sync(functools.partial(handler, request), abandon_on_cancel=True)

    # --- topics -------------------------------------------------------------------------

    def _create_topics(self, request: ct_req.CreateTopicsRequest) -> ct_resp.CreateTopicsResponse:
        result = self.topics.create_topics(request, self.image(), 0)
        topics: dict[str, dict] = {}
        names = {}
        for r in result.records:
            if isinstance(r, TopicRecord):
                topics[r.name] = {"id": r.topic_id, "partitions": {}, "config": {}}
                names[r.topic_id] = r.name
            elif isinstance(r, PartitionRecord):
                topics[names[r.topic_id]]["partitions"][r.partition] = r.replicas
            elif isinstance(r, ConfigRecord):
                topics[r.resource_name]["config"][r.key] = r.value
        refused: dict[str, str] = {}
        for name, t in topics.items():
            try:
                admin.create_topic(self.zk, name, t["partitions"], t["config"], t["id"])
            except admin.TopicAdminError as exc:
                refused[name] = str(exc)
        response = result.response
        if not refused:
            return response
        return ct_resp.CreateTopicsResponse(throttle_time=NO_THROTTLE, topics=tuple(
            ct_resp.CreatableTopicResult(name=t.name, topic_id=ZERO_UUID, error_code=ErrorCode.topic_already_exists,
                                         error_message=refused[t.name], num_partitions=-1, replication_factor=-1,
                                         configs=None) if t.name in refused else t
            for t in response.topics))

    def _delete_topics(self, request: dt_req.DeleteTopicsRequest):
        image = self.image()
        result = self.topics.delete_topics(request, image, 0)
        for r in result.records:
            assert isinstance(r, RemoveTopicRecord), r
            try:
                admin.delete_topic(self.zk, image.topics_by_id[r.topic_id].name)
            except admin.TopicAdminError:
                pass  # already gone: the controller finished an earlier delete
        return result.response

    def _create_partitions(self, request: cp_req.CreatePartitionsRequest) -> cp_resp.CreatePartitionsResponse:
        image = self.image()
        result = self.topics.create_partitions(request, image, 0)
        added: dict[str, dict[int, tuple[int, ...]]] = {}
        for r in result.records:
            assert isinstance(r, PartitionRecord), r
            added.setdefault(image.topics_by_id[r.topic_id].name, {})[r.partition] = r.replicas
        refused = {}
        for name, partitions in added.items():
            try:
                admin.add_partitions(self.zk, name, image.topics_by_id[image.topic_ids_by_name[name]].topic_id,
                                     partitions)
            except admin.TopicAdminError as exc:
                refused[name] = str(exc)
        if not refused:
            return result.response
        return cp_resp.CreatePartitionsResponse(throttle_time=NO_THROTTLE, results=tuple(
            cp_resp.CreatePartitionsTopicResult(name=r.name, error_code=ErrorCode.invalid_partitions,
                                                error_message=refused[r.name]) if r.name in refused else r
            for r in result.response.results))

    # --- configs ------------------------------------------------------------------------

    def _describe_configs(self, request: dc_req.DescribeConfigsRequest):
        return self.configs.describe_configs(request, self.image(), 0).response

    def _alter_configs(self, request: iac_req.IncrementalAlterConfigsRequest):
        image = self.image()
        result = self.configs.incremental_alter_configs(request, image, 0)
        changed: dict[str, dict[str, str]] = {}
        for r in result.records:
            assert isinstance(r, ConfigRecord), r
            config = changed.setdefault(r.resource_name, dict(image.topic_config(r.resource_name).items()))
            if r.value is None:
                config.pop(r.key, None)
            else:
                config[r.key] = r.value
        for name, config in changed.items():
            admin.set_topic_config(self.zk, name, config)
        return result.response

    # --- producer ids --------------------------------------------------------------------

    def _allocate_producer_ids(self, request: AllocateProducerIdsRequest) -> AllocateProducerIdsResponse:
        path = z.PRODUCER_ID_BLOCK_PATH
        while True:
            try:
                data, stat = self.zk.get(path)
            except NoNodeError:
                try:
                    self.zk.create(path, b"", makepath=True)
                except NodeExistsError:
                    pass
                continue
            start = z.decode_producer_id_block(data).block_end + 1 if data else 0
            block = z.ProducerIdBlock(self.broker_id, start, start + PRODUCER_ID_BLOCK_SIZE - 1)
            try:
                self.zk.set(path, z.encode_producer_id_block(block), version=stat.version)
            except BadVersionError:
                continue  # another broker took a block meanwhile: take the next one
            return AllocateProducerIdsResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                                               producer_id_start=start, producer_id_len=PRODUCER_ID_BLOCK_SIZE)

    # --- ISR changes ------------------------------------------------------------------------

    def _alter_partition(self, request: ap_req.AlterPartitionRequest) -> ap_resp.AlterPartitionResponse:
        image = self.image()
        changed: list[NamedPartition] = []
        topics = []
        for t in request.topics:
            topic = image.topics_by_id.get(t.topic_id)
            parts = []
            for p in t.partitions:
                if topic is None:
                    parts.append(_partition_error(p.partition_index, ErrorCode.unknown_topic_id))
                    continue
                tp = NamedPartition(topic.name, p.partition_index)
                parts.append(self._alter_one(tp, p, changed))
            topics.append(ap_resp.TopicData(topic_id=t.topic_id, partitions=tuple(parts)))
        if changed:
            notify_isr_changes(self.zk, changed)
        return ap_resp.AlterPartitionResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                                              topics=tuple(topics))

    def _alter_one(self, tp: NamedPartition, p: ap_req.PartitionData,
                   changed: list[NamedPartition]) -> ap_resp.PartitionData:
        try:
            data, stat = self.zk.get(z.partition_state_path(*tp))
        except NoNodeError:
            return _partition_error(p.partition_index, ErrorCode.unknown_topic_or_partition)
        state = z.decode_partition_state(tp.topic, tp.partition, data, stat.version)
        if state.leader != self.broker_id or state.leader_epoch != p.leader_epoch:
            return _partition_error(p.partition_index, ErrorCode.fenced_leader_epoch)
        if state.zk_version != p.partition_epoch:
            return _partition_error(p.partition_index, ErrorCode.invalid_update_version)
        new_isr = tuple(b.broker_id for b in p.new_isr_with_epochs)
        if self.broker_id not in new_isr:
            return _partition_error(p.partition_index, ErrorCode.invalid_request)
        try:
            written = write_isr_change(self.zk, tp, state, new_isr)
        except (StaleZNodeVersionError, KazooException):
            return _partition_error(p.partition_index, ErrorCode.invalid_update_version)
        changed.append(tp)
        return ap_resp.PartitionData(partition_index=p.partition_index, error_code=ErrorCode.none,
                                     leader_id=written.leader, leader_epoch=written.leader_epoch,
                                     isr=written.isr, leader_recovery_state=written.leader_recovery_state,
                                     partition_epoch=written.zk_version)


def _partition_error(partition: int, error: ErrorCode) -> ap_resp.PartitionData:
    return ap_resp.PartitionData(partition_index=partition, error_code=error, leader_id=-1, leader_epoch=-1,
                                 isr=(), leader_recovery_state=0, partition_epoch=-1)


_ZK_MODE_MESSAGE = ("{api} is not supported by a ZooKeeper-mode broker; "
                    "migrate the cluster to the KRaft quorum (raftka migrate) to use it")


def _not_in_zookeeper_mode(request: Any) -> Any:
    """A clean, non-retriable INVALID_REQUEST answer for the admin requests
    only the KRaft controller decides (ElectLeaders, partition reassignment)."""
    api = type(request).__name__.removesuffix("Request")
    message = _ZK_MODE_MESSAGE.format(api=api)
    invalid = ErrorCode.invalid_request
    if isinstance(request, el_req.ElectLeadersRequest):
        return el_resp.ElectLeadersResponse(
            throttle_time=NO_THROTTLE, error_code=invalid, replica_election_results=tuple(
                el_resp.ReplicaElectionResult(topic=tp.topic, partition_result=tuple(
                    el_resp.PartitionResult(partition_id=p, error_code=invalid, error_message=message)
                    for p in tp.partitions))
                for tp in request.topic_partitions or ()))
    if isinstance(request, apr_req.AlterPartitionReassignmentsRequest):
        return apr_resp.AlterPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE, error_code=invalid, error_message=message, responses=())
    if isinstance(request, lpr_req.ListPartitionReassignmentsRequest):
        return lpr_resp.ListPartitionReassignmentsResponse(
            throttle_time=NO_THROTTLE, error_code=invalid, error_message=message, topics=())
    raise AssertionError(f"a ZooKeeper-mode broker does not send {type(request).__name__}")
