"""A broker's metrics, with Kafka's JMX names as the JMX exporter's rules write them.

`BrokerMetrics(broker)` is made only when `metrics.port` is set. It turns
on the two per-request counts a scrape cannot read from state:

- bytes and messages in/out per topic (`TopicStats`, a list per topic
  that the produce and fetch paths add to when `broker.replicas.topic_stats`
  is not None);
- requests and their latencies per API (`instrument`: the broker's
  `handle` is wrapped to time the handler's own part (local time), and,
  when it returns an awaitable, the wait for it (remote time); the queue
  time from the frame's read to the handler's start (`ctx._read_at`);
  the send time from the complete response to its last byte written,
  which the connection server reports to `observe_send`);
- errors by code per API (Kafka's ErrorsPerSec, counting NONE too): the
  hand-built Produce and Fetch encoders count their partitions' codes
  (`broker.api.codec.produce_error_counts`), and every other response
  (a kio object) is walked for its `error_code` fields once answered.

Everything else (ISR state, leaders, purgatories, groups) is read from the
broker's state by `collect` when Prometheus scrapes.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import typing
from types import CoroutineType

import trio
from kio.schema.errors import ErrorCode
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.api import codec
from common.metrics import (
    BUCKETS,
    FunctionCollector,
    LatencyHistogram,
    ScrapedRate,
    counter,
    gauge,
    histogram_families,
)
from common.wire.codec import api_key_map

PRODUCE_KEY, FETCH_KEY = 0, 1

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

    __slots__ = ("at_once", "waited", "waited_local", "remote", "queue")

    def __init__(self) -> None:
        self.at_once = LatencyHistogram()
        self.waited = LatencyHistogram()
        self.waited_local = LatencyHistogram()
        self.remote = LatencyHistogram()
        self.queue = LatencyHistogram()

    @property
    def count(self) -> int:
        return self.at_once.count + self.waited.count


class BrokerMetrics:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.requests: dict[int, RequestStats] = {}  # api_key << 16 | version -> stats
        self.send_times: dict[int, LatencyHistogram] = {}  # api_key -> response send times
        #: (api_key, error code) -> responses' error codes, of kio responses.
        self.errors: collections.Counter = collections.Counter()
        self.produce_errors = codec.produce_error_counts = collections.Counter()
        self.fetch_errors = codec.fetch_error_counts = collections.Counter()
        broker.replicas.topic_stats = TopicStats()
        self.rebalance_rate = ScrapedRate(trio.current_time())
        self.consumer_rebalance_rate = ScrapedRate(trio.current_time())

    def collector(self) -> FunctionCollector:
        return FunctionCollector(self.collect)

    def instrument(self, handle):
        """`handle` (the broker's request handler) timed per API."""
        requests = self.requests
        errors = self.errors
        clock = time.perf_counter
        # `ctx._read_at` is on the trio clock, which is perf_counter plus an
        # offset: reading perf_counter (a C call) saves a Python call per stamp.
        offset = getattr(trio.lowlevel.current_clock(), "offset", None)

        def timed(ctx, request):
            header = request.header
            key = header.api_key << 16 | header.api_version
            stats = requests.get(key)
            if stats is None:
                stats = requests[key] = RequestStats()
            start = clock()
            if offset is not None and ctx._read_at:
                # LatencyHistogram.observe, inlined: two more calls per request otherwise.
                queue = stats.queue
                seconds = start + offset - ctx._read_at
                index = int(seconds * 1_000_000).bit_length()
                queue.buckets[index if index < BUCKETS else BUCKETS - 1] += 1
                queue.count += 1
                queue.sum_s += seconds
            result = handle(ctx, request)
            local = clock() - start
            if type(result) is CoroutineType or (
                result is not None and not isinstance(result, (bytes, list)) and hasattr(result, "__await__")
            ):
                return _timed_wait(stats, start, local, result, clock, errors, header.api_key)
            stats.at_once.observe(local)
            # The hot path's hand-built answers (bytes, lists of parts) count
            # their errors as they are encoded: no attribute lookup for them.
            if type(result) is not bytes and type(result) is not list and hasattr(result, "__api_key__"):
                count_errors(result, header.api_key, errors)
            return result

        send_times = self.send_times

        def observe_send(api_key: int, seconds: float) -> None:
            hist = send_times.get(api_key)
            if hist is None:
                hist = send_times[api_key] = LatencyHistogram()
            index = int(seconds * 1_000_000).bit_length()
            hist.buckets[index if index < BUCKETS else BUCKETS - 1] += 1
            hist.count += 1
            hist.sum_s += seconds

        timed.observe_send = observe_send  # type: ignore[attr-defined]
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
                         _merged([s.remote for s in stats]),
                         _merged([s.queue for s in stats]))
                  for name, stats in by_api.items()}
        for index, metric, doc in ((0, "totaltimems", "Request time from decode to response (ms)"),
                                   (1, "localtimems", "Time in the request's handler (ms)"),
                                   (2, "remotetimems", "Time waiting on other replicas or the coordinator (ms)"),
                                   (3, "requestqueuetimems",
                                    "Time from the request's frame read to its handler's start (ms)")):
            yield from histogram_families(f"kafka_network_requestmetrics_{metric}", doc, ["request"],
                                          (([name], hists[index]) for name, hists in merged.items()))
        yield from histogram_families(
            "kafka_network_requestmetrics_responsesendtimems",
            "Time from the response's completion to its last byte written to the socket (ms)", ["request"],
            (([request_name(key)], hist) for key, hist in sorted(self.send_times.items())))
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors",
                                     "Responses' error codes per API (NONE included), as Kafka's ErrorsPerSec",
                                     labels=["request", "error"])
        counts = collections.Counter(self.errors)
        for api_key, by_code in ((PRODUCE_KEY, self.produce_errors), (FETCH_KEY, self.fetch_errors)):
            for code, n in list(by_code.items()):
                counts[(api_key, code)] += n
        for (api_key, code), n in sorted(counts.items()):
            errors.add_metric([request_name(api_key), error_name(code)], n)
        yield errors

    def _group_families(self):
        counts = {"Stable": 0, "PreparingRebalance": 0, "CompletingRebalance": 0, "Empty": 0, "Dead": 0}
        for runner in list(self.broker.coordinator.shards.values()):
            shard = runner.shard
            for group in list(shard.groups.values()):
                counts[group.state.value] = counts.get(group.state.value, 0) + 1
        yield gauge("kafka_coordinator_group_groupmetadatamanager_numgroups", "Groups coordinated here",
                    sum(counts.values()))
        # Kafka 4's group coordinator (`kafka.server:type=group-coordinator-metrics`,
        # its `group-rebalance-*` and `consumer-group-rebalance-*` sensors), as the
        # JMX exporter's generic rule names them.
        coordinator = self.broker.coordinator
        runners = list(coordinator.shards.values())
        classic = getattr(coordinator, "retired_rebalances", 0) + sum(r.shard.rebalances for r in runners)
        consumer = getattr(coordinator, "retired_consumer_rebalances", 0) + sum(
            r.shard.consumer_rebalances for r in runners)
        now = trio.current_time()
        prefix = "kafka_server_group_coordinator_metrics_"
        yield gauge(f"{prefix}group_rebalance_count",
                      "Classic groups' rebalances completed here (join phases that made a generation)", classic)
        yield gauge(f"{prefix}group_rebalance_rate", "Classic groups' rebalances per second here (30 s window)",
                    self.rebalance_rate.rate(classic, now))
        yield gauge(f"{prefix}consumer_group_rebalance_count",
                      "Consumer groups' (KIP-848) new target assignments computed here", consumer)
        yield gauge(f"{prefix}consumer_group_rebalance_rate",
                    "Consumer groups' (KIP-848) rebalances per second here (30 s window)",
                    self.consumer_rebalance_rate.rate(consumer, now))
        for state, n in counts.items():
            yield gauge(f"kafka_coordinator_group_groupmetadatamanager_numgroups{state.lower()}",
                        f"Groups coordinated here in state {state}", n)


async def _timed_wait(stats: RequestStats, start: float, local: float, awaitable, clock, errors, api_key: int):
    try:
        result = await awaitable
    finally:
        total = clock() - start
        stats.waited.observe(total)
        stats.waited_local.observe(local)
        stats.remote.observe(total - local)
    if hasattr(result, "__api_key__"):
        count_errors(result, api_key, errors)
    return result


def error_name(code: int) -> str:
    """Kafka's name of an error code (`NOT_LEADER_OR_FOLLOWER`), as its metrics' `error` tag."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_{code}"


#: A kio response class -> (whether it has an error_code, the fields that may hold nested entries).
_PLANS: dict[type, tuple[bool, tuple[str, ...]]] = {}


def _plan(cls: type) -> tuple[bool, tuple[str, ...]]:
    has_code = False
    nested = []
    for f in dataclasses.fields(cls):
        if f.name == "error_code":
            has_code = True
            continue
        kind = f.type
        args = typing.get_args(kind)
        if dataclasses.is_dataclass(kind) or (typing.get_origin(kind) is tuple and args
                                              and dataclasses.is_dataclass(args[0])):
            nested.append(f.name)
    plan = _PLANS[cls] = (has_code, tuple(nested))
    return plan


def count_errors(response, api_key: int, errors: collections.Counter) -> None:
    """Add each `error_code` of `response` (a kio response, its entries
    included: a partition's, a group's) to `errors[(api_key, code)]`, as
    Kafka's `AbstractResponse.errorCounts` feeds ErrorsPerSec."""
    stack = [response]
    while stack:
        obj = stack.pop()
        plan = _PLANS.get(type(obj)) or _plan(type(obj))
        if plan[0]:
            errors[(api_key, int(obj.error_code))] += 1
        for name in plan[1]:
            value = getattr(obj, name)
            if type(value) is tuple:
                stack.extend(value)
            elif value is not None:
                stack.append(value)


def _merged(hists) -> LatencyHistogram:
    merged = LatencyHistogram()
    for h in hists:
        merged.buckets = [a + b for a, b in zip(merged.buckets, h.buckets)]
        merged.count += h.count
        merged.sum_s += h.sum_s
    return merged
