"""A tiny in-memory driver for QuorumController tests.

It does what the real driver does, minus the network and Raft: append a
result's records to a log at the next offsets, apply them to the working
image, and call `respond(base_offset)`. Every record also round-trips
through the CBOR codec, so the tests exercise the bytes the log would hold.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from kio.schema.alter_partition.v3 import request as ap_req
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig, QuorumController
from quorum.metadata import LoggedRecord, MetadataImage, decode_record, encode_record
from quorum.metadata.image import PartitionRegistration


class Cluster:
    def __init__(self, config: ControllerConfig | None = None, seed: int = 0) -> None:
        self.image = MetadataImage()
        self.now_ms = 0
        self.config = config or ControllerConfig()
        self.controller = QuorumController(self.image, self.now_ms, self.config, random.Random(seed))
        self.log: list[Any] = []
        self.incarnations: dict[int, uuid.UUID] = {}

    # --- the driver loop ---------------------------------------------------

    def append(self, records) -> int:
        base = self.image.offset + 1
        decoded = [decode_record(encode_record(r)) for r in records]
        assert decoded == list(records)
        self.image = self.image.apply([LoggedRecord(base + i, 1, r) for i, r in enumerate(decoded)])
        self.log += decoded
        return base

    def send(self, request: Any) -> Any:
        result = self.controller.handle(request, self.image, self.now_ms)
        base = self.append(result.records) if result.records else None
        return result.respond(base)

    def tick(self, now_ms: int) -> list:
        self.now_ms = now_ms
        records = self.controller.tick(self.image, now_ms)
        self.append(records)
        return records

    def failover(self, seed: int = 1) -> None:
        """A new active controller: fresh soft state over the same image."""
        self.controller = QuorumController(self.image, self.now_ms, self.config, random.Random(seed))

    # --- brokers -------------------------------------------------------------

    def register(self, broker_id: int, rack: str | None = None, incarnation: uuid.UUID | None = None,
                 port: int | None = None) -> Any:
        incarnation = incarnation or uuid.uuid4()
        self.incarnations[broker_id] = incarnation
        return self.send(BrokerRegistrationRequest(
            broker_id=broker_id, cluster_id="c", incarnation_id=incarnation,
            listeners=(Listener(name="PLAINTEXT", host="127.0.0.1", port=port or 9092 + broker_id,
                                security_protocol=0),),
            features=(), rack=rack))

    def heartbeat(self, broker_id: int, *, epoch: int | None = None, offset: int | None = None,
                  want_fence: bool = False, want_shut_down: bool = False) -> Any:
        reg = self.image.brokers.get(broker_id)
        return self.send(BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=epoch if epoch is not None else (reg.epoch if reg else -1),
            current_metadata_offset=self.image.offset if offset is None else offset,
            want_fence=want_fence, want_shut_down=want_shut_down))

    def start_brokers(self, *ids: int, racks: dict[int, str] | None = None) -> None:
        for b in ids:
            assert self.register(b, rack=(racks or {}).get(b)).error_code == ErrorCode.none
        for b in ids:
            r = self.heartbeat(b)
            assert r.error_code == ErrorCode.none and not r.is_fenced, r

    # --- topics -------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, rf: int = 1, configs: dict[str, str] | None = None,
                     assignments: dict[int, list[int]] | None = None, validate_only: bool = False) -> Any:
        topic = ct_req.CreatableTopic(
            name=name, num_partitions=-1 if assignments else partitions, replication_factor=-1 if assignments else rf,
            assignments=tuple(ct_req.CreatableReplicaAssignment(partition_index=i, broker_ids=tuple(b))
                              for i, b in (assignments or {}).items()),
            configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()))
        response = self.send(ct_req.CreateTopicsRequest(topics=(topic,), validate_only=validate_only))
        return response.topics[0]

    def partition(self, name: str, index: int = 0) -> PartitionRegistration:
        topic = self.image.topic(name)
        assert topic is not None, name
        return topic.partitions[index]

    def alter_isr(self, name: str, index: int, isr: list[int], *, sender: int | None = None,
                  leader_epoch: int | None = None, partition_epoch: int | None = None,
                  isr_epochs: dict[int, int] | None = None) -> Any:
        p = self.partition(name, index)
        sender = p.leader if sender is None else sender
        topic = self.image.topic(name)
        request = ap_req.AlterPartitionRequest(
            broker_id=sender, broker_epoch=self.image.brokers[sender].epoch,
            topics=(ap_req.TopicData(topic_id=topic.topic_id, partitions=(ap_req.PartitionData(
                partition_index=index,
                leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
                new_isr_with_epochs=tuple(ap_req.BrokerState(broker_id=b, broker_epoch=(isr_epochs or {}).get(b, -1))
                                          for b in isr),
                partition_epoch=p.partition_epoch if partition_epoch is None else partition_epoch),)),))
        return self.send(request)
