"""Which topics and groups a flow mirrors, and what the target calls them.

The replication policies are MirrorMaker 2's:

- `DefaultReplicationPolicy`: topic `orders` of cluster `us` is `us.orders`
  on the target (the separator is `replication.policy.separator`). The name
  says where a topic came from, so a flow refuses a topic that came from its
  own target (`eu.orders` read from `us` is not sent back to `eu`): two
  clusters mirroring each other do not loop.
- `IdentityReplicationPolicy`: the name stays. Nothing in the name tells a
  mirrored topic from a local one, so cycles cannot be detected; as in MM2
  it is for one-way flows only, and the config parser refuses it when the
  reverse flow is enabled too.
"""

from __future__ import annotations

import dataclasses
import re

#: MM2's defaults for `topics.exclude` and `groups.exclude`, plus raftka's
#: and Kafka's own internal topics (never mirrored: they belong to a cluster).
DEFAULT_TOPICS_EXCLUDE = r".*[\-\.]internal, .*\.replica, __.*"
DEFAULT_GROUPS_EXCLUDE = r"console-consumer-.*, connect-.*, __.*"
HEARTBEATS_TOPIC = "heartbeats"


def _compile(patterns: str) -> re.Pattern[str] | None:
    """A comma-separated list of regexes, as MM2 takes them; empty matches nothing."""
    parts = [p.strip() for p in patterns.split(",") if p.strip()]
    if not parts:
        return None
    return re.compile("|".join(f"(?:{p})" for p in parts))


@dataclasses.dataclass(frozen=True)
class NameFilter:
    include: str
    exclude: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_include", _compile(self.include))
        object.__setattr__(self, "_exclude", _compile(self.exclude))

    def matches(self, name: str) -> bool:
        include, exclude = self._include, self._exclude  # type: ignore[attr-defined]
        if include is None or not include.fullmatch(name):
            return False
        return exclude is None or not exclude.fullmatch(name)


class ReplicationPolicy:
    name = ""

    def remote_topic(self, source_alias: str, topic: str) -> str:
        raise NotImplementedError

    def topic_source(self, topic: str) -> str | None:
        """The cluster a topic was mirrored from, None for a local topic."""
        raise NotImplementedError

    def upstream_topic(self, topic: str) -> str | None:
        """The topic's name on the cluster it was mirrored from."""
        return None

    def offset_syncs_topic(self, target_alias: str) -> str:
        return f"mm2-offset-syncs.{target_alias}.internal"

    def checkpoints_topic(self, source_alias: str) -> str:
        return f"{source_alias}.checkpoints.internal"


@dataclasses.dataclass(frozen=True)
class DefaultReplicationPolicy(ReplicationPolicy):
    separator: str = "."
    name = "DefaultReplicationPolicy"

    def remote_topic(self, source_alias: str, topic: str) -> str:
        return f"{source_alias}{self.separator}{topic}"

    def topic_source(self, topic: str) -> str | None:
        head, sep, _ = topic.partition(self.separator)
        return head if sep and head else None

    def upstream_topic(self, topic: str) -> str | None:
        head, sep, rest = topic.partition(self.separator)
        return rest if sep and head else None


@dataclasses.dataclass(frozen=True)
class IdentityReplicationPolicy(ReplicationPolicy):
    separator: str = "."
    name = "IdentityReplicationPolicy"

    def remote_topic(self, source_alias: str, topic: str) -> str:
        return topic

    def topic_source(self, topic: str) -> str | None:
        return None


def policy_for(class_name: str, separator: str) -> ReplicationPolicy:
    """`replication.policy.class`, by its simple or MM2's full class name."""
    simple = class_name.rsplit(".", 1)[-1]
    if simple == "DefaultReplicationPolicy":
        return DefaultReplicationPolicy(separator)
    if simple == "IdentityReplicationPolicy":
        return IdentityReplicationPolicy(separator)
    raise ValueError(f"replication.policy.class={class_name!r}: use DefaultReplicationPolicy or "
                     "IdentityReplicationPolicy")


def refusal(topic: str, source_alias: str, target_alias: str, policy: ReplicationPolicy,
            topics: NameFilter) -> str | None:
    """Why the flow source->target does not mirror `topic`, None if it does."""
    if not topics.matches(topic):
        return "not selected by topics / topics.exclude"
    # MM2's isCycle: walk the name's chain of upstream clusters; any of them
    # being the target means the records came from there.
    name: str | None = topic
    while name is not None:
        upstream = policy.topic_source(name)
        if upstream is None:
            break
        if upstream == target_alias:
            return f"came from {target_alias} (mirroring it back would loop)"
        name = policy.upstream_topic(name)
    return None


def mirrored_topics(source_topics: list[str], source_alias: str, target_alias: str,
                    policy: ReplicationPolicy, topics: NameFilter) -> dict[str, str]:
    """source topic -> target topic, for every source topic the flow mirrors."""
    return {t: policy.remote_topic(source_alias, t) for t in sorted(source_topics)
            if refusal(t, source_alias, target_alias, policy, topics) is None}


#: The topic configs a mirror copies to the target (what decides what a
#: consumer can read there); broker-specific ones such as segment sizes stay.
MIRRORED_CONFIGS = frozenset({
    "cleanup.policy", "retention.ms", "retention.bytes", "compression.type", "max.message.bytes",
    "min.compaction.lag.ms", "max.compaction.lag.ms", "delete.retention.ms", "min.cleanable.dirty.ratio",
    "message.timestamp.type",
})


def configs_to_copy(source_configs: dict[str, tuple[str, bool]]) -> dict[str, str]:
    """The source topic's configs the target gets: the mirrored keys whose
    value was set on the topic (`(value, is_default)`); a default stays the
    target cluster's own default."""
    return {k: v for k, (v, is_default) in source_configs.items() if k in MIRRORED_CONFIGS and not is_default}
