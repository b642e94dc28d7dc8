"""Replication throttles (KIP-73), as Kafka's ReplicationQuotaManager.

Two dynamic broker configs set the rates: `leader.replication.throttled.rate`
(what a leader sends to followers) and `follower.replication.throttled.rate`
(what a follower fetches), in bytes per second. Two topic configs say which
replicas they hold: `leader.replication.throttled.replicas` and
`follower.replication.throttled.replicas`, lists of PARTITION:BROKER or `*`.
A broker throttles partition P of topic T as leader when T's leader list
names P:<this broker> (or is `*`), as follower when T's follower list does.
Only replicas out of the ISR are throttled: a caught-up follower is never
held back, so throttling cannot shrink an ISR.

The rate is measured as Kafka's SimpleRate: bytes over the last
`WINDOW_NUM` one-second samples, over the time they span but at least one
window, so a throttle holds from its first second (unlike the client
quotas' ten-second padding, which would let a reassignment copy ten
seconds' worth at full speed first).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.core.client_quotas import WINDOW_NUM, WINDOW_SIZE_S, RateSensor

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
#: Kafka's default rate: unlimited.
UNLIMITED = 2**63 - 1
#: Every partition of a topic (the list `*`).
ALL = None


class SimpleRateSensor(RateSensor):
    """`RateSensor` over at least one window rather than ten."""

    __slots__ = ()

    def measure(self, now: float) -> tuple[float, float]:
        self._purge(now)
        if not self.starts:
            return 0.0, WINDOW_SIZE_S
        span = max(now - self.starts[0], WINDOW_SIZE_S)
        return sum(self.totals) / span, span


def throttled_partitions(value: str, broker_id: int) -> frozenset[int] | None:
    """The partitions a throttled-replicas list names on `broker_id`: ALL for `*`."""
    items = [i.strip() for i in value.split(",") if i.strip()]
    if items == ["*"]:
        return ALL
    out = set()
    for item in items:
        partition, _, broker = item.partition(":")
        if broker.strip() == str(broker_id):
            out.add(int(partition))
    return frozenset(out)


class ReplicationQuota:
    """One direction's throttle on one broker: the rate and the throttled partitions."""

    def __init__(self, rate: float, partitions: Mapping[str, frozenset[int] | None],
                 sensor: SimpleRateSensor | None = None) -> None:
        self.rate = rate
        #: topic -> its throttled partitions here (ALL: every one).
        self.partitions = partitions
        self.sensor = sensor if sensor is not None else SimpleRateSensor()

    def throttled(self, topic: str, partition: int) -> bool:
        if topic not in self.partitions:
            return False
        named = self.partitions[topic]
        return named is ALL or partition in named

    def record(self, nbytes: int, now: float) -> None:
        self.sensor.record(now, nbytes)

    def exceeded(self, now: float) -> bool:
        return self.sensor.measure(now)[0] > self.rate

    def delay_s(self, now: float) -> float:
        """How long until the rate is back at the quota if nothing more is sent (0: it is)."""
        rate, span = self.sensor.measure(now)
        if rate <= self.rate or not self.sensor.starts:
            return 0.0
        return min(rate * span / self.rate - (now - self.sensor.starts[0]), WINDOW_NUM * WINDOW_SIZE_S)


def replication_quota(rate_key: str, replicas_key: str, properties: Mapping[str, str],
                      topic_configs: Mapping[str, Mapping[str, str]], broker_id: int,
                      previous: ReplicationQuota | None) -> ReplicationQuota | None:
    """The throttle of one direction, None when no rate is set or no replica
    here is throttled (the fetch paths then look at one attribute).
    `topic_configs`: topic name -> its explicit configs."""
    raw = properties.get(rate_key)
    try:
        rate = int(raw.strip()) if raw not in (None, "") else UNLIMITED
    except ValueError:
        rate = UNLIMITED
    if rate >= UNLIMITED:
        return None
    partitions = {}
    for topic, configs in topic_configs.items():
        value = configs.get(replicas_key)
        if value:
            named = throttled_partitions(value, broker_id)
            if named is ALL or named:
                partitions[topic] = named
    if not partitions:
        return None
    return ReplicationQuota(rate, partitions, previous.sensor if previous is not None else None)
