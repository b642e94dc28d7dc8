"""What the group and the transaction coordinators share in the broker:
shards over the partitions of an internal topic this broker leads (I/O shell).

Theory of operation
-------------------
A coordinator keeps its state in an internal, compacted topic
(`__consumer_offsets`, `__transaction_state`), and the leader of a
partition of that topic coordinates the keys hashed to it. `ShardHost`
keeps one `ShardRunner` per such partition led here:

- `on_metadata_update` (after the replica manager applied a delta) unloads
  the runner of a partition no longer led here, or led at a new leader
  epoch (another leader may have written in between, so the shard is
  rebuilt), and loads one for each newly led partition. What loading and
  unloading mean is the subclass's (`_load`, `_unload`).
- One timer task sleeps until the earliest `next_deadline_ms` of the loaded
  shards (at most `MAX_TIMER_SLEEP_S`, as deadlines are wall-clock times
  that can jump; at least `MIN_TIMER_SLEEP_S`, so a deadline a tick did not
  move cannot spin the loop), is woken early by `_timers_moved`, and hands
  each due shard to `_on_due`. With no deadline it sleeps until woken: an
  idle broker's wakeups count against its CPU per GB served.
- `topic_lock` and `topic_refused_at_brokers` serve the topic's creation on
  first use (`broker.api.find_coordinator`).
"""

from __future__ import annotations

import math
from typing import Any

import trio

from broker.shell.hosted_partition import HostedPartition

#: Longest sleep of the timer task while some deadline is set.
MAX_TIMER_SLEEP_S = 1.0
#: Shortest: how late a due deadline may fire (Kafka's timer wheel ticks every ms).
MIN_TIMER_SLEEP_S = 0.01


class ShardRunner:
    """A shard with the partition it is loaded from."""

    def __init__(self, shard: Any, hp: HostedPartition) -> None:
        self.shard = shard
        self.hp = hp
        self.leader_epoch = hp.state.leader_epoch
        self.load_scope = trio.CancelScope()
        self.active = True

    @property
    def partition(self) -> int:
        return self.shard.partition


class ShardHost:
    """Shards over the led partitions of `topic_name` (see the module docstring)."""

    topic_name: str

    def __init__(self, broker, config: Any) -> None:
        self.broker = broker
        self.config = config
        #: Partition of the topic -> its runner here.
        self.shards: dict[int, Any] = {}
        self._nursery: trio.Nursery | None = None
        #: One creation of the topic at a time.
        self.topic_lock = trio.Lock()
        #: The live broker count when the topic was last found wider than
        #: the cluster (its warning is logged once per count).
        self.topic_refused_at_brokers: int | None = None
        #: Set by every step that may move a shard's next deadline.
        self._timers_moved = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load shards, fire their deadlines; until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._start_tasks(nursery)
            self.on_metadata_update()
            task_status.started()
            try:
                while True:
                    with trio.move_on_after(self._timer_sleep_s()):
                        await self._timers_moved.wait()
                    self._tick_due()
                    # `_tick_due` is synchronous: the next sleep is computed
                    # after every change it made, so its own wakeup is moot.
                    self._timers_moved = trio.Event()
            finally:
                self._nursery = None

    async def _start_tasks(self, nursery: trio.Nursery) -> None:
        """Tasks of the subclass's own, started before the first load."""

    def _timer_sleep_s(self) -> float:
        deadlines = [runner.shard.next_deadline_ms() for runner in self.shards.values() if runner.active]
        due = min((d for d in deadlines if d is not None), default=None)
        if due is None:
            return math.inf
        return min(max((due - self.broker.clock_ms()) / 1000, MIN_TIMER_SLEEP_S), MAX_TIMER_SLEEP_S)

    def _tick_due(self) -> None:
        now_ms = self.broker.clock_ms()
        for runner in list(self.shards.values()):
            if not runner.active or not runner.shard.loaded:
                continue
            due = runner.shard.next_deadline_ms()
            if due is not None and due <= now_ms:
                self._on_due(runner, now_ms)

    def _on_due(self, runner: Any, now_ms: int) -> None:
        raise NotImplementedError

    def on_metadata_update(self) -> None:
        """Load shards of the partitions this broker now leads, unload the others."""
        if self._nursery is None:
            return
        leading = self._led_partitions()
        for p, runner in list(self.shards.items()):
            hp = leading.get(p)
            if hp is not runner.hp or hp.state.leader_epoch != runner.leader_epoch:
                self._unload(runner, "leadership moved" if hp is None else "a new leader epoch")
        for p, hp in leading.items():
            if p not in self.shards:
                self._load(p, hp)

    def _load(self, partition: int, hp: HostedPartition) -> None:
        raise NotImplementedError

    def _unload(self, runner: Any, why: str) -> None:
        raise NotImplementedError

    def _led_partitions(self) -> dict[int, HostedPartition]:
        topic = self.broker.image.topic(self.topic_name)
        if topic is None:
            return {}
        partitions = self.broker.replicas.partitions
        out = {}
        for p in topic.partitions:
            hp = partitions.get((self.topic_name, p))
            if hp is not None and hp.state.is_leader:
                out[p] = hp
        return out

    def num_partitions(self) -> int | None:
        topic = self.broker.image.topic(self.topic_name)
        return None if topic is None else len(topic.partitions)
