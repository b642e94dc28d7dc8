"""Metrics over HTTP in Prometheus' text format, with the names the
Prometheus JMX exporter's usual Kafka rules (`kafka-2_0_0.yml`,
`kafka-kraft-3_0_0.yml`, `lowercaseOutputName: true`) give Kafka's JMX
metrics, so dashboards and alerts written for Kafka work unchanged:

- a JMX `Value` gauge `kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions`
  is `kafka_server_replicamanager_underreplicatedpartitions`;
- a `...PerSec` meter's `Count` is a counter `kafka_<domain>_<type>_<name>_total`
  (`PerSec` dropped), e.g. `kafka_server_brokertopicmetrics_bytesin_total{topic=...}`;
- a Yammer histogram is `kafka_<domain>_<type>_<name>{quantile="0.99",...}`
  plus its `_count`, e.g. `kafka_network_requestmetrics_totaltimems{request="Produce"}`.

Nothing is counted on the hot path that can be read from existing state
when Prometheus scrapes: each node registers a `Collector` that walks its
partitions, metadata image and Raft state at scrape time. What must be
counted per request (bytes in/out per topic, request latencies per API) is
a few integer additions (`LatencyHistogram`: power-of-two buckets of
microseconds, the bucket index one `int.bit_length`).

The endpoint is served by the node's own trio loop (`serve_metrics`), so a
collector reads the node's state between two of its steps, never while a
step is halfway through changing it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from common.config import int_property
from common.errors import ConfigError

_log = logging.getLogger("common.metrics")

#: The quantiles a Yammer histogram exports through the JMX exporter.
QUANTILES = (0.5, 0.75, 0.95, 0.98, 0.99, 0.999)
#: Power-of-two microsecond buckets: bucket i holds durations below 2**i us
#: (the last, above 2**31 us, catches everything longer).
BUCKETS = 33
#: The largest request line and headers read before a scrape is refused.
MAX_HEADER_BYTES = 16 * 1024


def new_registry() -> CollectorRegistry:
    """A registry with the process metrics (`process_cpu_seconds_total`,
    `process_resident_memory_bytes`, `process_open_fds`, ...), as the JMX
    exporter's agent exports them too."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    return registry


def metrics_endpoint(raw: dict[str, str]) -> tuple[str, int] | None:
    """(`metrics.host`, `metrics.port`) from a node's properties, or None
    when `metrics.port` is unset (metrics are off by default). Port 0
    picks a free port (the node logs the one it got)."""
    if raw.get("metrics.port", "").strip() == "":
        return None
    port = int_property(raw, "metrics.port", 0, 0)
    if port > 65535:
        raise ConfigError(f"metrics.port={port} is not a TCP port: give 0-65535, or leave it unset to "
                          "serve no metrics")
    return raw.get("metrics.host", "0.0.0.0").strip() or "0.0.0.0", port


class LatencyHistogram:
    """Durations of one kind (an API's total time, say) in power-of-two
    microsecond buckets: `observe` is an integer conversion, a
    `bit_length` and two additions."""

    __slots__ = ("buckets", "count", "sum_s")

    def __init__(self) -> None:
        self.buckets = [0] * BUCKETS
        self.count = 0
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        index = int(seconds * 1_000_000).bit_length()
        self.buckets[index if index < BUCKETS else BUCKETS - 1] += 1
        self.count += 1
        self.sum_s += seconds

    def quantile_ms(self, q: float) -> float:
        """The upper bound of the bucket holding quantile `q`, in ms (0 when empty)."""
        if not self.count:
            return 0.0
        rank = q * self.count
        seen = 0
        for index, n in enumerate(self.buckets):
            seen += n
            if seen >= rank and n:
                return (1 << index) / 1000
        return (1 << (BUCKETS - 1)) / 1000


class WindowedStat:
    """A Kafka Metrics sensor's `-avg`, `-max` and `-rate` over its sampled
    window (Kafka's defaults: `metrics.num.samples`=2 samples of
    `metrics.sample.window.ms`=30 s): what KIP-595's `commit-latency-avg`
    or `append-records-rate` report. `record` is for events counted in
    tens per second at most (Raft appends, elections), not per request."""

    __slots__ = ("window_s", "samples")

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        #: [start, count, total, max] of the current and the previous window.
        self.samples: list[list[float]] = []

    def record(self, value: float, now: float) -> None:
        samples = self.samples
        if not samples or now - samples[-1][0] >= self.window_s:
            samples.append([now, 0, 0.0, float("-inf")])
            del samples[:-2]
        sample = samples[-1]
        sample[1] += 1
        sample[2] += value
        if value > sample[3]:
            sample[3] = value

    def _live(self, now: float) -> list[list[float]]:
        return [s for s in self.samples if now - s[0] < 2 * self.window_s]

    def avg(self, now: float) -> float:
        """The mean value recorded in the window (NaN when nothing was, as Kafka)."""
        live = self._live(now)
        count = sum(s[1] for s in live)
        return sum(s[2] for s in live) / count if count else float("nan")

    def max(self, now: float) -> float:
        """The largest value recorded in the window (NaN when nothing was, as Kafka)."""
        live = self._live(now)
        return max(s[3] for s in live) if live else float("nan")

    def rate(self, now: float) -> float:
        """The values' sum per second over the window, which counts as at
        least one sample window long (Kafka's `Rate`)."""
        live = self._live(now)
        if not live:
            return 0.0
        elapsed = max(now - live[0][0], self.window_s)
        return sum(s[2] for s in live) / elapsed


class ScrapedRate:
    """The per-second rate of a count that is only read at scrape time
    (a count kept by the node's state, not by the metrics), over the last
    window (at least `window_s` long, as a Kafka `Rate`): each scrape
    remembers the count, and the rate is measured from the oldest memory
    within two windows."""

    __slots__ = ("window_s", "seen")

    def __init__(self, now: float, window_s: float = 30.0) -> None:
        """`now`: when the count was 0 (the node's start)."""
        self.window_s = window_s
        self.seen: list[tuple[float, float]] = [(now, 0.0)]

    def rate(self, count: float, now: float) -> float:
        seen = self.seen
        while len(seen) > 1 and now - seen[1][0] >= self.window_s:
            del seen[0]
        seen.append((now, count))
        then, before = seen[0]
        return (count - before) / max(now - then, self.window_s)


def histogram_families(name: str, doc: str, labels: list[str],
                       series: Iterable[tuple[list[str], LatencyHistogram]]) -> list:
    """A Yammer histogram as the JMX exporter shows it: a gauge with a
    `quantile` label (ms), plus `<name>_count` and `<name>_sum` (ms)."""
    gauge = GaugeMetricFamily(name, doc, labels=[*labels, "quantile"])
    count = CounterMetricFamily(f"{name}_count", f"{doc} (observations)", labels=labels)
    total = GaugeMetricFamily(f"{name}_sum", f"{doc} (sum, ms)", labels=labels)
    for values, hist in series:
        for q in QUANTILES:
            gauge.add_metric([*values, str(q)], hist.quantile_ms(q))
        count.add_metric(values, hist.count)
        total.add_metric(values, hist.sum_s * 1000)
    # prometheus_client appends `_total` to a counter's name; the JMX
    # exporter's `_count` has none, so the sample is renamed.
    count.samples[:] = [sample._replace(name=f"{name}_count") for sample in count.samples]
    return [gauge, count, total]


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """A counter named `name` (which ends in `_total`, as the JMX exporter's rules write it)."""
    return CounterMetricFamily(name.removesuffix("_total"), doc, value=value)


class FunctionCollector(Collector):
    """A collector whose `collect` is a function of the node (registered once)."""

    def __init__(self, collect) -> None:
        self._collect = collect

    def collect(self):
        return self._collect()


async def serve_metrics(registry: CollectorRegistry, host: str, port: int, *,
                        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `GET /metrics` (any path) in Prometheus' text format on
    host:port until cancelled; starts with the bound port."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ConfigError(f"metrics.port={port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                          "choose a free port or leave metrics.port unset") from exc
    bound = listeners[0].socket.getsockname()[1]
    _log.info("metrics on http://%s:%d/metrics", host, bound)
    task_status.started(bound)
    await trio.serve_listeners(lambda stream: _answer(registry, stream), listeners)


async def _answer(registry: CollectorRegistry, stream: trio.SocketStream) -> None:
    async with stream:
        data = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in data and len(data) < MAX_HEADER_BYTES:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                data += chunk
        if b"\r\n\r\n" not in data:
            return
        method = data.split(b" ", 1)[0]
        if method not in (b"GET", b"HEAD"):
            body, status = b"only GET /metrics is served\n", b"405 Method Not Allowed"
            ctype = b"text/plain"
        else:
            try:
                body, status = generate_latest(registry), b"200 OK"
            except Exception:
                # A collector's bug fails this scrape (Prometheus marks the
                # target down), not the node.
                _log.exception("collecting metrics failed")
                body, status = b"collecting metrics failed; see the node's log\n", b"500 Internal Server Error"
            ctype = b"text/plain; version=0.0.4; charset=utf-8"
        head = (b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
        try:
            await stream.send_all(head if method == b"HEAD" else head + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
