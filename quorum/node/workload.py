"""Metadata write workloads for tests and benchmarks: real controller requests.

Topic writes need a usable broker (a replication factor of 1 needs one
unfenced broker), so `BrokerStandIn` registers a broker id with the active
controller and heartbeats for it, as a broker's lifecycle manager does
(KIP-631), without hosting any data. It re-registers when a new active
controller no longer knows its epoch.

Requests are the controller's own versions (`quorum.controller.SUPPORTED_REQUESTS`):
- `create_topics_request(names, partitions)`: 1 TopicRecord + 1 PartitionRecord per partition;
- `alter_config_request(topic, key, value)`: 1 ConfigRecord.
"""

from __future__ import annotations

import datetime
import logging
import uuid

import trio
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1 import request as iac_req

from quorum.metadata.records import ConfigResourceType
from quorum.node.controller_client import ControllerClient, NoActiveControllerError
from common.errors import RaftkaError

SET = 0
_log = logging.getLogger("quorum.node.workload")


def create_topics_request(names: list[str], partitions: int = 1) -> ct_req.CreateTopicsRequest:
    return ct_req.CreateTopicsRequest(
        topics=tuple(ct_req.CreatableTopic(name=n, num_partitions=partitions, replication_factor=1,
                                           assignments=(), configs=()) for n in names),
        timeout=datetime.timedelta(seconds=30), validate_only=False)


def alter_config_request(topics: list[str], key: str, value: str) -> iac_req.IncrementalAlterConfigsRequest:
    return iac_req.IncrementalAlterConfigsRequest(resources=tuple(
        iac_req.AlterConfigsResource(resource_type=int(ConfigResourceType.TOPIC), resource_name=t, configs=(
            iac_req.AlterableConfig(name=key, config_operation=SET, value=value),)) for t in topics),
        validate_only=False)


class BrokerStandIn:
    """Keeps `broker_id` registered and unfenced at the active controller."""

    def __init__(self, client: ControllerClient, cluster_id: str, broker_id: int = 100,
                 heartbeat_interval_s: float = 0.5) -> None:
        self.client = client
        self.cluster_id = cluster_id
        self.broker_id = broker_id
        self.heartbeat_interval_s = heartbeat_interval_s
        self.incarnation_id = uuid.uuid4()
        self.epoch: int | None = None
        self.unfenced = trio.Event()

    async def register(self) -> None:
        _, answer = await self.client.send(BrokerRegistrationRequest(
            broker_id=self.broker_id, cluster_id=self.cluster_id, incarnation_id=self.incarnation_id,
            listeners=(Listener(name="PLAINTEXT", host="127.0.0.1", port=1, security_protocol=0),),
            features=(), rack=None))
        if answer.error_code != ErrorCode.none:
            raise RaftkaError(f"BrokerRegistration of {self.broker_id}: {ErrorCode(answer.error_code).name}")
        self.epoch = int(answer.broker_epoch)

    async def heartbeat(self) -> None:
        if self.epoch is None:
            await self.register()
        assert self.epoch is not None
        _, answer = await self.client.send(BrokerHeartbeatRequest(
            broker_id=self.broker_id, broker_epoch=self.epoch, current_metadata_offset=2**62,
            want_fence=False, want_shut_down=False))
        if answer.error_code in (ErrorCode.stale_broker_epoch, ErrorCode.broker_id_not_registered):
            self.epoch = None
        elif answer.error_code == ErrorCode.none and not answer.is_fenced:
            self.unfenced.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, wait until unfenced, then heartbeat until cancelled."""
        started = False
        while True:
            try:
                await self.heartbeat()
            except (NoActiveControllerError, RaftkaError) as exc:
                _log.info("broker stand-in %d: %s", self.broker_id, exc)
            if self.unfenced.is_set() and not started:
                started = True
                task_status.started()
            await trio.sleep(self.heartbeat_interval_s if started else 0.05)
