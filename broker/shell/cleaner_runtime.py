"""The log cleaner's task: compaction in bounded steps, within a budget (I/O shell).

Theory of operation
-------------------
`run_log_cleaner(broker)` drives the pure-ish `storage.cleaner.LogCleaner`
that the `LogManager` owns. Each turn it lists the hosted logs of compacted
topics (`cleanup.policy` containing `compact`: every `__consumer_offsets`
partition and any topic configured so), with each topic's compaction
settings (its configs over the broker's `log.cleaner.*` defaults) and the
partition's high watermark (nothing at or above it is compacted: a record
there may still be truncated away), and calls `maybe_clean` for about
`STEP_BYTES` bytes of work (or `log.cleaner.io.buffer.size` if smaller).
The call runs on the event loop and costs Python work per record (about 5
ms per 64 KiB of small records here), so steps are kept that small: the
broker's requests wait at most one step. Between calls the task sleeps
for the longest of:

- what `Throttler` says for `log.cleaner.io.max.bytes.per.second`
  (Kafka's knob; unlimited by default);
- what `duty_cycle_sleep_ms` says for `raftka.log.cleaner.cpu.fraction`
  (default 0.25 of one core): the CPU budget;
- `log.cleaner.backoff.ms` when no log needed cleaning.

The cleaner never touches a log's active segment and keeps every offset
(see `storage.cleaner`); tombstones go once `delete.retention.ms` has passed
since the pass that first cleaned them (KIP-534).
"""

from __future__ import annotations

import logging
import time

import trio

from broker.shell.hosted_partition import HostedPartition
from storage.cleaner import CompactedLog
from storage.cleaner_config import CompactionConfig
from storage.throttler import Throttler, duty_cycle_sleep_ms

_log = logging.getLogger("broker.cleaner")

#: Bytes read and written per call into the cleaner: one event-loop stall.
STEP_BYTES = 64 * 1024

#: Broker keys whose values are the defaults of compaction topic configs.
_BROKER_DEFAULTS = ("cleanup.policy", "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
                    "min.cleanable.dirty.ratio")


def compaction_config(broker, topic: str) -> CompactionConfig:
    # The replica manager's defaults include the dynamic broker configs.
    defaults = {k: v for k, v in broker.replicas.log_defaults.items() if k in _BROKER_DEFAULTS}
    # Kafka's default cleanup.policy is delete: a topic that sets none, on a
    # broker that sets no log.cleanup.policy, is not compacted (and its
    # records without keys not removed).
    return CompactionConfig.from_properties({"cleanup.policy": "delete", **defaults,
                                             **broker.image.topic_config(topic)})


class CompactedLogs:
    """The hosted logs of compacted topics, with their settings and HWs;
    the list of partitions is recomputed only when the image changes."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self._key: tuple | None = None
        self._hosted: list[tuple[HostedPartition, CompactionConfig]] = []

    def current(self) -> list[CompactedLog]:
        broker = self.broker
        image = broker.image
        # Recomputed when topics, configs or the hosted replicas change, not
        # on every image: a broker registration or fence makes a new image,
        # and each walk of 100,000 hosted partitions held the event loop.
        key = (image.topics_by_id, image.configs, len(broker.replicas.partitions))
        if self._key is None or any(a is not b for a, b in zip(key[:2], self._key[:2])) or key[2] != self._key[2]:
            self._key = key
            configs: dict[str, CompactionConfig] = {}
            self._hosted = []
            for (topic, _partition), hosted in broker.replicas.partitions.items():
                config = configs.get(topic)
                if config is None:
                    config = configs[topic] = compaction_config(broker, topic)
                if config.compact:
                    self._hosted.append((hosted, config))
        return [CompactedLog(hp.log, config, hp.state.high_watermark) for hp, config in self._hosted]


async def run_log_cleaner(broker) -> None:
    """Compact until cancelled (module doc)."""
    config = broker.config
    cleaner = broker.log_manager.cleaner
    cleaner_config = cleaner.config
    throttler = Throttler(cleaner_config.io_max_bytes_per_second, broker.clock_ms())
    fraction = config.log_cleaner_cpu_fraction
    step_bytes = min(cleaner_config.io_buffer_size, STEP_BYTES)
    logs = CompactedLogs(broker)
    while True:
        if not broker.loaded:
            await trio.sleep(cleaner_config.backoff_ms / 1000)
            continue
        started = time.perf_counter()
        step = cleaner.maybe_clean(logs.current(), broker.clock_ms(), step_bytes)
        busy_ms = (time.perf_counter() - started) * 1000
        if step.passes_completed:
            _log.debug("%d compaction pass(es) completed", step.passes_completed)
        if not step.busy and step.bytes == 0:
            await trio.sleep(cleaner_config.backoff_ms / 1000)
            continue
        sleep_ms = max(throttler.record(step.bytes, broker.clock_ms()), duty_cycle_sleep_ms(busy_ms, fraction))
        await trio.sleep(sleep_ms / 1000)
