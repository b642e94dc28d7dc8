"""A quorum node's metrics, read from its state when Prometheus scrapes.

- Raft (KIP-595's `kafka.server:type=raft-metrics`, on every node that
  follows `__cluster_metadata`, voter or observer): `current-leader`,
  `current-epoch`, `current-state` (as the JMX exporter's KRaft rules
  write a string attribute: one series per state, 1 for the node's),
  `high-watermark`, `log-end-offset`, `current-vote`, and from the node's
  `RaftStats` `commit-latency-avg`/`-max` and `election-latency-avg`/`-max`
  (ms, over Kafka's 30 s x 2 sample window; NaN when nothing happened in
  it, as Kafka), `append-records-rate` and `fetch-records-rate`.
- The controller (`kafka.controller:type=KafkaController`, on voters):
  `ActiveControllerCount` (1 on the active controller, 0 elsewhere, so
  the sum over the quorum is 1), `GlobalTopicCount`,
  `GlobalPartitionCount`, `OfflinePartitionsCount`,
  `PreferredReplicaImbalanceCount`, `FencedBrokerCount`,
  `ActiveBrokerCount`, `LastAppliedRecordOffset`,
  `LastCommittedRecordOffset`, from the node's committed image; and
  `kafka.controller:type=ControllerEventManager,name=EventQueueTimeMs`,
  how long controller decisions waited for the Raft loop (histogram).
"""

from __future__ import annotations

import trio
from prometheus_client.core import GaugeMetricFamily

from common.metrics import FunctionCollector, gauge, histogram_families

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
        stats = getattr(node, "stats", None)
        if stats is None:
            return
        now = trio.current_time()
        for name, stat, doc in (("commit_latency", stats.commit_latency,
                                 "Time from a leader's append to the high watermark passing it (ms)"),
                                ("election_latency", stats.election_latency,
                                 "Time from starting an election to a leader being known (ms)")):
            yield gauge(f"kafka_server_raftmetrics_{name}_avg", f"{doc}, mean over the last 30-60 s", stat.avg(now))
            yield gauge(f"kafka_server_raftmetrics_{name}_max", f"{doc}, largest over the last 30-60 s", stat.max(now))
        yield gauge("kafka_server_raftmetrics_append_records_rate",
                    "Records appended to the metadata log per second as its leader", stats.append_records.rate(now))
        yield gauge("kafka_server_raftmetrics_fetch_records_rate",
                    "Records fetched from the leader per second as a follower or observer",
                    stats.fetch_records.rate(now))

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
        stats = getattr(node, "stats", None)
        if stats is not None:
            yield from histogram_families("kafka_controller_controllereventmanager_eventqueuetimems",
                                          "Time a controller decision waited for the Raft loop to run it (ms)", [],
                                          [([], stats.event_queue)])

    return FunctionCollector(collect)


def zk_controller_collector(link) -> FunctionCollector:
    """The controller's metrics on a ZooKeeper-mode broker (`link`: its
    `BrokerZkLink`; the controller candidate appears once it registered),
    with the names Kafka's ZooKeeper-mode controller has: counts on the
    active controller, 0 elsewhere, so a sum over the brokers is the
    cluster's."""

    def collect():
        controller = link.controller
        active = controller is not None and controller.active
        yield gauge("kafka_controller_kafkacontroller_activecontrollercount",
                    "1 on the active controller, 0 on the other brokers", 1 if active else 0)
        topics = partitions = offline = imbalance = live = 0
        if active:
            ctx = controller.core.ctx
            live = len(ctx.live_brokers)
            topics = len(ctx.topics)
            for tp, state in list(ctx.states.items()):
                partitions += 1
                if state.leader < 0 or state.leader not in ctx.live_brokers:
                    offline += 1
                else:
                    assignment = ctx.topics.get(tp.topic)
                    replicas = assignment.partitions.get(tp.partition) if assignment is not None else None
                    if replicas and state.leader != replicas[0]:
                        imbalance += 1
        yield gauge("kafka_controller_kafkacontroller_globaltopiccount", "Topics in the cluster", topics)
        yield gauge("kafka_controller_kafkacontroller_globalpartitioncount", "Partitions in the cluster", partitions)
        yield gauge("kafka_controller_kafkacontroller_offlinepartitionscount", "Partitions without a live leader",
                    offline)
        yield gauge("kafka_controller_kafkacontroller_preferredreplicaimbalancecount",
                    "Partitions not led by their preferred replica", imbalance)
        yield gauge("kafka_controller_kafkacontroller_activebrokercount", "Brokers registered in ZooKeeper", live)
        if controller is not None:
            yield from histogram_families("kafka_controller_controllereventmanager_eventqueuetimems",
                                          "Time from a ZooKeeper watch firing to the controller reading it (ms)", [],
                                          [([], controller.event_queue)])

    return FunctionCollector(collect)
