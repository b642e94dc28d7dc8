"""The quorum controller's decisions: one front door over the managers (KIP-631).

Theory of operation
-------------------
The Raft leader of the metadata quorum is the *active controller*. It turns
requests into metadata records; it never changes state any other way. A
`QuorumController` is that decision logic without I/O:

    handle(request, image, now_ms) -> ControllerResult(records, response)
    tick(image, now_ms)            -> records (session expiry, leader rebalance)

The driver that owns it (the trio shell) must:

1. Create a new `QuorumController(image, now_ms, config, rng)` each time
   this node becomes the active controller (after its log has caught up),
   and drop it when it stops being active. The soft state -- last
   heartbeat per broker -- lives in it and is rebuilt then.
2. Pass the *working image*: the committed image plus every record this
   controller has appended but not yet seen committed, applied at the
   offsets they were appended at. Decisions build on one another (two
   CreateTopics for one name, two AllocateProducerIds), so each must see
   the records of the ones before it.
3. Append a result's `records` as one batch, apply them to the working
   image, and send `result.respond(base_offset)` once the log is committed
   through that batch -- or, for a result without records, through the
   last record appended before it.
4. Call `tick(image, now_ms)` at `next_deadline_ms(image)` (or
   periodically) and append what it returns the same way.

If leadership is lost with records uncommitted, the driver discards the
working image and this object, and answers pending requests NOT_CONTROLLER.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
from kio.schema.alter_partition.v3 import AlterPartitionRequest
from kio.schema.alter_partition_reassignments.v0 import AlterPartitionReassignmentsRequest
from kio.schema.assign_replicas_to_dirs.v0.request import AssignReplicasToDirsRequest
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.create_partitions.v3 import CreatePartitionsRequest
from kio.schema.create_topics.v7 import CreateTopicsRequest
from kio.schema.delete_topics.v6 import DeleteTopicsRequest
from kio.schema.describe_configs.v4 import DescribeConfigsRequest
from kio.schema.elect_leaders.v2 import ElectLeadersRequest
from kio.schema.incremental_alter_configs.v1 import IncrementalAlterConfigsRequest
from kio.schema.list_partition_reassignments.v0 import ListPartitionReassignmentsRequest
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest

from quorum.controller.cluster_control import ClusterControlManager
from quorum.controller.config import ControllerConfig
from quorum.controller.config_control import ConfigControlManager
from quorum.controller.errors import ControllerUsageError
from quorum.controller.leader_balance import imbalanced_preferred_elections
from quorum.controller.producer_ids import ProducerIdControlManager
from quorum.controller.reassignment import ReassignmentControlManager
from quorum.controller.replication_control import ReplicationControlManager
from quorum.controller.result import ControllerResult
from quorum.controller.security_control import SecurityControlManager
from quorum.controller.topic_control import TopicControlManager
from kio.schema.alter_user_scram_credentials.v0.request import AlterUserScramCredentialsRequest
from kio.schema.create_acls.v3.request import CreateAclsRequest
from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest
from quorum.controller.quota_control import QuotaControlManager
from kio.schema.delete_acls.v3.request import DeleteAclsRequest
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import Record

SUPPORTED_REQUESTS: tuple[type, ...] = (
    AlterClientQuotasRequest,         # v1
    BrokerRegistrationRequest,        # v4
    BrokerHeartbeatRequest,           # v2
    UnregisterBrokerRequest,          # v0
    AlterPartitionRequest,            # v3
    AssignReplicasToDirsRequest,      # v0
    AllocateProducerIdsRequest,       # v0
    CreateTopicsRequest,              # v7
    DeleteTopicsRequest,              # v6
    CreatePartitionsRequest,          # v3
    DescribeConfigsRequest,           # v4
    IncrementalAlterConfigsRequest,   # v1
    ElectLeadersRequest,              # v2
    AlterPartitionReassignmentsRequest,  # v0
    ListPartitionReassignmentsRequest,   # v0
    AlterUserScramCredentialsRequest,    # v0
    CreateAclsRequest,                   # v3
    DeleteAclsRequest,                   # v3
)
"""The kio request classes `handle` accepts (the newest versions kio 0.6 has);
the wire layer converts older client versions to these."""


class QuorumController:
    """Decisions of the active controller; holds its soft state. See the module docstring for the driver contract."""

    def __init__(self, image: MetadataImage, now_ms: int, config: ControllerConfig | None = None,
                 rng: random.Random | None = None) -> None:
        if rng is None:
            raise ControllerUsageError(
                "QuorumController needs rng=random.Random(seed) for topic ids: seed it from os.urandom in the "
                "driver, or with a fixed seed in tests")
        self.config = config or ControllerConfig()
        self.cluster = ClusterControlManager(self.config, image, now_ms)
        self.replication = ReplicationControlManager(self.config)
        self.topics = TopicControlManager(self.config, rng)
        self.configs = ConfigControlManager()
        self.producer_ids = ProducerIdControlManager(self.config)
        self.reassignments = ReassignmentControlManager()
        self.security = SecurityControlManager(rng)
        self.quotas = QuotaControlManager()
        # Soft state: the first automatic leader rebalance is one interval
        # after activation, as Kafka schedules it.
        self._next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        self._handlers: dict[type, Callable[[Any, MetadataImage, int], ControllerResult[Any]]] = {
            BrokerRegistrationRequest: self.cluster.register,
            BrokerHeartbeatRequest: self.cluster.heartbeat,
            UnregisterBrokerRequest: self.cluster.unregister,
            AlterPartitionRequest: self.replication.alter_partition,
            AssignReplicasToDirsRequest: self.cluster.assign_replicas_to_dirs,
            ElectLeadersRequest: self.replication.elect_leaders,
            AllocateProducerIdsRequest: self.producer_ids.allocate_producer_ids,
            CreateTopicsRequest: self.topics.create_topics,
            DeleteTopicsRequest: self.topics.delete_topics,
            CreatePartitionsRequest: self.topics.create_partitions,
            DescribeConfigsRequest: self.configs.describe_configs,
            IncrementalAlterConfigsRequest: self.configs.incremental_alter_configs,
            AlterPartitionReassignmentsRequest: self.reassignments.alter_partition_reassignments,
            ListPartitionReassignmentsRequest: self.reassignments.list_partition_reassignments,
            AlterUserScramCredentialsRequest: self.security.alter_user_scram_credentials,
            CreateAclsRequest: self.security.create_acls,
            DeleteAclsRequest: self.security.delete_acls,
            AlterClientQuotasRequest: self.quotas.alter_client_quotas,
        }
        assert set(self._handlers) == set(SUPPORTED_REQUESTS)

    def handle(self, request: Any, image: MetadataImage, now_ms: int) -> ControllerResult[Any]:
        """Decide `request` against the working `image`; see `ControllerResult` for what to do with it."""
        handler = self._handlers.get(type(request))
        if handler is None:
            raise ControllerUsageError(
                f"QuorumController.handle got a {type(request).__module__}.{type(request).__name__}; it takes "
                f"only {', '.join(f'{t.__module__}.{t.__name__}' for t in SUPPORTED_REQUESTS)} -- convert other "
                f"versions in the wire layer")
        return handler(request, image, now_ms)

    def tick(self, image: MetadataImage, now_ms: int) -> list[Record]:
        """Records that fence brokers whose session expired (and move their
        partitions); else, when the check is due, records moving leadership
        back to preferred replicas (`leader_balance`)."""
        records = self.cluster.tick(image, now_ms)
        if records or not self.config.auto_leader_rebalance_enable or now_ms < self._next_rebalance_ms:
            # Fencing first: a rebalance decided on this image would not see it.
            return records
        self._next_rebalance_ms = now_ms + self.config.leader_imbalance_check_interval_ms
        return list(imbalanced_preferred_elections(image, self.config))

    def next_deadline_ms(self, image: MetadataImage) -> int | None:
        """The earliest time `tick` may have something to do (None: nothing to watch)."""
        deadline = self.cluster.next_deadline_ms(image)
        if self.config.auto_leader_rebalance_enable:
            deadline = self._next_rebalance_ms if deadline is None else min(deadline, self._next_rebalance_ms)
        return deadline
