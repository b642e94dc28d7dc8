"""A broker's metrics, with Kafka's JMX names as the JMX exporter's rules write them.

`BrokerMetrics(broker)` is made only when `metrics.port` is set. It turns
on the two per-request counts a scrape cannot read from state:

- bytes and messages in/out per topic (`TopicStats`, a list per topic
  that the produce and fetch paths add to when `broker.replicas.topic_stats`
  is not None);
- requests and their latencies per API (`instrument`: the broker's
  `handle` is wrapped to time the handler's own part (local time), and,
  when it returns an awaitable, the wait for it (remote time)).

Everything else (ISR state, leaders, purgatories, groups) is read from the
broker's state by `collect` when Prometheus scrapes.
"""

from __future__ import annotations

import time
from types import CoroutineType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from common.metrics import FunctionCollector, LatencyHistogram, counter, gauge, histogram_families
from common.wire.codec import api_key_map

#: Positions in a topic's stats list.
BYTES_IN, MESSAGES_IN, BYTES_OUT, REPLICATION_BYTES_IN, REPLICATION_BYTES_OUT = range(5)

_TOPIC_METRICS = (
    (BYTES_IN, "kafka_server_brokertopicmetrics_bytesin_total", "Bytes produced to the topic's leaders here"),
    (MESSAGES_IN, "kafka_server_brokertopicmetrics_messagesin_total", "Records produced to the topic's leaders here"),
    (BYTES_OUT, "kafka_server_brokertopicmetrics_bytesout_total", "Record bytes fetched by consumers"),
    (REPLICATION_BYTES_IN, "kafka_server_brokertopicmetrics_replicationbytesin_total",
     "Record bytes fetched from leaders by this broker's followers"),
    (REPLICATION_BYTES_OUT, "kafka_server_brokertopicmetrics_replicationbytesout_total",
     "Record bytes fetched by other brokers' followers"),
)


class TopicStats(dict):
    """topic -> [bytes in, messages in, bytes out, replication in, replication out]."""

    def __missing__(self, topic: str) -> list[int]:
        stats = self[topic] = [0, 0, 0, 0, 0]
        return stats


def request_name(api_key: int) -> str:
    name = api_key_map.get(api_key)
    return "".join(w.capitalize() for w in name.split("_")) if name else f"Unknown{api_key}"


class RequestStats:
    """One API version's latencies. A request answered at once has one
    duration (its total and local time alike: `at_once`); one that waited
    has three (`waited`, `waited_local`, `remote`). The scrape merges them
    into Kafka's total and local times, so the hot path observes once."""

    __slots__ = ("at_once", "waited", "waited_local", "remote")

    def __init__(self) -> None:
        self.at_once = LatencyHistogram()
        self.waited = LatencyHistogram()
        self.waited_local = LatencyHistogram()
        self.remote = LatencyHistogram()

    @property
    def count(self) -> int:
        return self.at_once.count + self.waited.count


class BrokerMetrics:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.requests: dict[int, RequestStats] = {}  # api_key << 16 | version -> stats
        broker.replicas.topic_stats = TopicStats()

    def collector(self) -> FunctionCollector:
        return FunctionCollector(self.collect)

    def instrument(self, handle):
        """`handle` (the broker's request handler) timed per API."""
        requests = self.requests
        perf_counter = time.perf_counter

        def timed(ctx, request):
            header = request.header
            key = header.api_key << 16 | header.api_version
            stats = requests.get(key)
            if stats is None:
                stats = requests[key] = RequestStats()
            start = perf_counter()
            result = handle(ctx, request)
            local = perf_counter() - start
            if type(result) is CoroutineType or (
                result is not None and not isinstance(result, (bytes, list)) and hasattr(result, "__await__")
            ):
                return _timed_wait(stats, start, local, result)
            stats.at_once.observe(local)
            return result

        return timed

    def collect(self):
        broker = self.broker
        replicas = broker.replicas
        leaders = under_replicated = under_min_isr = at_min_isr = 0
        produce_waiting = fetch_waiting = 0
        max_lag = 0
        for hp in list(replicas.partitions.values()):
            state = hp.state
            fetch_waiting += len(hp.waiters)
            if state.is_leader:
                leaders += 1
                produce_waiting += len(hp.acks_waiters)
                isr = len(state.isr)
                if isr < len(state.replicas):
                    under_replicated += 1
                if isr < state.min_insync_replicas:
                    under_min_isr += 1
                elif isr == state.min_insync_replicas:
                    at_min_isr += 1
            else:
                lag = state.high_watermark - hp.log.log_end_offset
                if lag > max_lag:
                    max_lag = lag
        yield gauge("kafka_server_replicamanager_underreplicatedpartitions",
                    "Partitions led here whose ISR is smaller than their replica set", under_replicated)
        yield gauge("kafka_server_replicamanager_underminisrpartitioncount",
                    "Partitions led here whose ISR is below min.insync.replicas", under_min_isr)
        yield gauge("kafka_server_replicamanager_atminisrpartitioncount",
                    "Partitions led here whose ISR is exactly min.insync.replicas", at_min_isr)
        yield gauge("kafka_server_replicamanager_leadercount", "Partitions led here", leaders)
        yield gauge("kafka_server_replicamanager_partitioncount", "Partition replicas hosted here",
                    len(replicas.partitions))
        yield gauge("kafka_server_replicamanager_offlinereplicacount",
                    "Replicas hosted here whose log could not be opened or whose log dir is offline",
                    len(replicas.offline) + len(replicas.dir_offline))
        yield gauge("kafka_log_logmanager_offlinelogdirectorycount",
                    "Log dirs taken offline by a disk failure", len(replicas.log_manager.offline_dirs))
        yield counter("kafka_server_replicamanager_isrshrinks_total",
                      "ISR shrinks of partitions led here", replicas.isr_shrinks)
        yield counter("kafka_server_replicamanager_isrexpands_total",
                      "ISR expansions of partitions led here", replicas.isr_expands)
        purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                      "Requests parked on partitions", labels=["delayedOperation"])
        purgatory.add_metric(["Produce"], produce_waiting)
        purgatory.add_metric(["Fetch"], fetch_waiting)
        yield purgatory
        lag = GaugeMetricFamily("kafka_server_replicafetchermanager_maxlag",
                                "Largest lag of a follower here behind its leader's high watermark (records)",
                                labels=["clientId"])
        lag.add_metric(["Replica"], max_lag)
        yield lag
        yield from self._topic_families(replicas.topic_stats)
        yield from self._request_families()
        yield from self._group_families()

    def _topic_families(self, topic_stats: TopicStats):
        items = list(topic_stats.items())
        for index, name, doc in _TOPIC_METRICS:
            family = CounterMetricFamily(name.removesuffix("_total"), doc, labels=["topic"])
            # The broker-wide series has no topic label (an empty label is none to Prometheus).
            family.add_metric([""], sum(stats[index] for _, stats in items))
            for topic, stats in items:
                family.add_metric([topic], stats[index])
            yield family

    def _request_families(self):
        items = sorted(self.requests.items())
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests handled",
                                       labels=["request", "version"])
        by_api: dict[str, list[RequestStats]] = {}
        for key, stats in items:
            name = request_name(key >> 16)
            requests.add_metric([name, str(key & 0xFFFF)], stats.count)
            by_api.setdefault(name, []).append(stats)
        yield requests
        merged = {name: (_merged([h for s in stats for h in (s.at_once, s.waited)]),
                         _merged([h for s in stats for h in (s.at_once, s.waited_local)]),
                         _merged([s.remote for s in stats]))
                  for name, stats in by_api.items()}
        for index, metric, doc in ((0, "totaltimems", "Request time from decode to response (ms)"),
                                   (1, "localtimems", "Time in the request's handler (ms)"),
                                   (2, "remotetimems", "Time waiting on other replicas or the coordinator (ms)")):
            yield from histogram_families(f"kafka_network_requestmetrics_{metric}", doc, ["request"],
                                          (([name], hists[index]) for name, hists in merged.items()))

    def _group_families(self):
        counts = {"Stable": 0, "PreparingRebalance": 0, "CompletingRebalance": 0, "Empty": 0, "Dead": 0}
        for runner in list(self.broker.coordinator.shards.values()):
            shard = runner.shard
            for group in list(shard.groups.values()):
                counts[group.state.value] = counts.get(group.state.value, 0) + 1
        yield gauge("kafka_coordinator_group_groupmetadatamanager_numgroups", "Groups coordinated here",
                    sum(counts.values()))
        for state, n in counts.items():
            yield gauge(f"kafka_coordinator_group_groupmetadatamanager_numgroups{state.lower()}",
                        f"Groups coordinated here in state {state}", n)


async def _timed_wait(stats: RequestStats, start: float, local: float, awaitable):
    try:
        return await awaitable
    finally:
        total = time.perf_counter() - start
        stats.waited.observe(total)
        stats.waited_local.observe(local)
        stats.remote.observe(total - local)


def _merged(hists) -> LatencyHistogram:
    merged = LatencyHistogram()
    for h in hists:
        merged.buckets = [a + b for a, b in zip(merged.buckets, h.buckets)]
        merged.count += h.count
        merged.sum_s += h.sum_s
    return merged
