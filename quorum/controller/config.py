"""Settings the controller's decisions depend on, with Kafka's key names and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Controller settings. Build one from a `common.config.NodeConfig` with `from_node_config`.

    - `broker_session_timeout_ms` (`broker.session.timeout.ms`): a broker whose
      last heartbeat is older than this is fenced by `QuorumController.tick`.
    - `num_partitions` / `default_replication_factor` (`num.partitions`,
      `default.replication.factor`): used when CreateTopics says -1.
    - `unclean_leader_election_enable` (`unclean.leader.election.enable`): the
      cluster default for topics that do not set the key.
    - `cluster_id`: when set, a BrokerRegistration for another cluster is
      refused with INCONSISTENT_CLUSTER_ID.
    - `producer_id_block_size`: ids handed out per AllocateProducerIds (Kafka: 1000).
    - `auto_leader_rebalance_enable` (`auto.leader.rebalance.enable`),
      `leader_imbalance_check_interval_ms` (`leader.imbalance.check.interval.seconds`
      x 1000) and `leader_imbalance_per_broker_percentage`
      (`leader.imbalance.per.broker.percentage`): every interval, brokers
      whose share of preferred partitions led by someone else exceeds the
      percentage get their leadership back (`leader_balance`).
    - `fence_moves_per_batch`: partition moves per metadata batch when a
      broker is fenced (`elections.LeaderMoves`); no Kafka key, Kafka's
      brokers replay a batch of 10,000 records in milliseconds.
    - `max_partitions_per_broker` (`max.partitions.per.broker`, KIP-578's
      proposal; 0, the default, is no limit): CreateTopics and
      CreatePartitions that would put more replicas on a broker are refused
      with POLICY_VIOLATION.
    """

    broker_session_timeout_ms: int = 9000
    num_partitions: int = 1
    default_replication_factor: int = 1
    unclean_leader_election_enable: bool = False
    cluster_id: str | None = None
    producer_id_block_size: int = 1000
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 300_000
    leader_imbalance_per_broker_percentage: int = 10
    fence_moves_per_batch: int = 500
    max_partitions_per_broker: int = 0

    def __post_init__(self) -> None:
        assert self.broker_session_timeout_ms > 0
        assert self.leader_imbalance_check_interval_ms > 0
        assert 0 <= self.leader_imbalance_per_broker_percentage <= 100
        assert self.num_partitions >= 1 and self.default_replication_factor >= 1
        assert self.producer_id_block_size >= 1
        assert self.fence_moves_per_batch >= 1
        assert self.max_partitions_per_broker >= 0

    @classmethod
    def from_node_config(cls, node_config: Any, cluster_id: str | None = None) -> ControllerConfig:
        """Take the controller's keys from a `common.config.NodeConfig`."""
        raw = getattr(node_config, "raw", {}) or {}
        return cls(
            broker_session_timeout_ms=node_config.broker_session_timeout_ms,
            num_partitions=node_config.num_partitions,
            default_replication_factor=node_config.default_replication_factor,
            unclean_leader_election_enable=raw.get("unclean.leader.election.enable", "false").strip().lower() == "true",
            cluster_id=cluster_id,
            auto_leader_rebalance_enable=raw.get("auto.leader.rebalance.enable", "true").strip().lower() == "true",
            leader_imbalance_check_interval_ms=1000 * _whole(
                raw, "leader.imbalance.check.interval.seconds", 300, 1, None),
            leader_imbalance_per_broker_percentage=_whole(raw, "leader.imbalance.per.broker.percentage", 10, 0, 100),
            max_partitions_per_broker=_whole(raw, "max.partitions.per.broker", 0, 0, None),
        )


def _whole(raw: dict[str, str], key: str, default: int, lowest: int, highest: int | None) -> int:
    text = raw.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{key}={text!r} is not a whole number") from None
    if value < lowest or (highest is not None and value > highest):
        bounds = f"at least {lowest}" if highest is None else f"between {lowest} and {highest}"
        raise ConfigError(f"{key}={value}: must be {bounds}")
    return value
