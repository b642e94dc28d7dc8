"""A quorum node's metrics, read from its state when Prometheus scrapes.

- Raft (KIP-595's `kafka.server:type=raft-metrics`, on every node that
  follows `__cluster_metadata`, voter or observer): `current-leader`,
  `current-epoch`, `current-state` (as the JMX exporter's KRaft rules
  write a string attribute: one series per state, 1 for the node's),
  `high-watermark`, `log-end-offset`, `current-vote`.
- The controller (`kafka.controller:type=KafkaController`, on voters):
  `ActiveControllerCount` (1 on the active controller, 0 elsewhere, so
  the sum over the quorum is 1), `GlobalTopicCount`,
  `GlobalPartitionCount`, `OfflinePartitionsCount`,
  `PreferredReplicaImbalanceCount`, `FencedBrokerCount`,
  `ActiveBrokerCount`, `LastAppliedRecordOffset`,
  `LastCommittedRecordOffset`, from the node's committed image.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from common.metrics import FunctionCollector, gauge

_STATES = ("leader", "candidate", "voted", "follower", "unattached", "observer", "resigned", "prospective")


def raft_collector(node) -> FunctionCollector:
    """Raft metrics of `node` (a `RaftNode`; a pysyncobj node has only its leader)."""

    def collect():
        core = getattr(node, "core", None)
        if core is None:
            return
        leader = core.leader_and_epoch
        yield gauge("kafka_server_raftmetrics_current_leader", "The quorum's leader as this node knows it (-1: none)",
                    -1 if leader.leader_id is None else leader.leader_id)
        yield gauge("kafka_server_raftmetrics_current_epoch", "The quorum epoch this node is in", leader.epoch)
        hw = core.high_watermark
        yield gauge("kafka_server_raftmetrics_high_watermark", "The metadata log's high watermark (-1: unknown)",
                    -1 if hw is None else hw)
        yield gauge("kafka_server_raftmetrics_log_end_offset", "The metadata log's end offset here",
                    core.log.log_end_offset)
        role = core.role.lower()
        if not core.is_voter and role in ("follower", "unattached"):
            role = "observer"
        states = GaugeMetricFamily("kafka_server_raftmetrics_current_state",
                                   "This node's Raft state (1 on the current one)", labels=["state"])
        for state in _STATES if role in _STATES else (*_STATES, role):
            states.add_metric([state], 1 if state == role else 0)
        yield states

    return FunctionCollector(collect)


def controller_collector(node) -> FunctionCollector:
    """The controller's metrics on a voter `node`."""

    def collect():
        yield gauge("kafka_controller_kafkacontroller_activecontrollercount",
                    "1 on the active controller, 0 on the other voters", 1 if node.is_active else 0)
        image = node.image
        topics = partitions = offline = imbalance = 0
        for topic in image.topics_by_id.values():
            topics += 1
            for registration in topic.partitions.values():
                partitions += 1
                if registration.leader < 0:
                    offline += 1
                elif registration.leader != registration.replicas[0]:
                    imbalance += 1
        brokers = list(image.brokers.values())
        fenced = sum(1 for b in brokers if b.fenced)
        yield gauge("kafka_controller_kafkacontroller_globaltopiccount", "Topics in the cluster", topics)
        yield gauge("kafka_controller_kafkacontroller_globalpartitioncount", "Partitions in the cluster", partitions)
        yield gauge("kafka_controller_kafkacontroller_offlinepartitionscount", "Partitions without a leader",
                    offline)
        yield gauge("kafka_controller_kafkacontroller_preferredreplicaimbalancecount",
                    "Partitions not led by their preferred replica", imbalance)
        yield gauge("kafka_controller_kafkacontroller_fencedbrokercount", "Registered brokers that are fenced",
                    fenced)
        yield gauge("kafka_controller_kafkacontroller_activebrokercount", "Registered brokers that are unfenced",
                    len(brokers) - fenced)
        yield gauge("kafka_controller_kafkacontroller_lastappliedrecordoffset",
                    "Offset of the last metadata record applied here", image.offset)
        hw = node.high_watermark
        yield gauge("kafka_controller_kafkacontroller_lastcommittedrecordoffset",
                    "Offset of the last committed metadata record (-1: unknown)", -1 if hw is None else hw - 1)

    return FunctionCollector(collect)
