"""Broker configs: which keys can change without a restart, and how a
broker's properties become the defaults of its topics' configs.

Theory of operation
-------------------
A broker config has up to four values, highest precedence first (KIP-226):

1. DYNAMIC_BROKER_CONFIG (2): set for this broker, a `ConfigRecord` on
   resource (BROKER, "<node id>") in the metadata log;
2. DYNAMIC_DEFAULT_BROKER_CONFIG (3): set for every broker, a `ConfigRecord`
   on (BROKER, "");
3. STATIC_BROKER_CONFIG (4): the broker's properties file;
4. DEFAULT_CONFIG (5): Kafka's default.

Only the keys in `DYNAMIC_BROKER_CONFIGS` can be set dynamically: the
broker defaults of topic configs (Kafka's `DynamicLogConfig`), which a
broker applies to its hosted logs as soon as its metadata image shows them.
`topic_defaults` turns merged broker properties into topic-config defaults;
`log.retention.ms` wins over `log.retention.minutes`, which wins over
`log.retention.hours`, as in Kafka's `KafkaConfig.logRetentionTimeMillis`.
"""

from __future__ import annotations

from collections.abc import Mapping

from quorum.metadata.topic_configs import TOPIC_CONFIGS, ConfigDef, ConfigType

DYNAMIC_BROKER_SOURCE = 2
DYNAMIC_DEFAULT_BROKER_SOURCE = 3
STATIC_BROKER_SOURCE = 4
DEFAULT_SOURCE = 5

#: Broker key -> the topic config it is the default of.
TOPIC_SYNONYMS: Mapping[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "message.max.bytes": "max.message.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "compression.type": "compression.type",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

#: The broker keys a topic config falls back to, most specific first.
BROKER_SYNONYMS: Mapping[str, tuple[str, ...]] = {
    **{topic: (broker,) for broker, topic in TOPIC_SYNONYMS.items()},
    "retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "segment.ms": ("log.roll.ms", "log.roll.hours"),
}

_MS_PER = {"log.retention.minutes": 60_000, "log.retention.hours": 3_600_000, "log.roll.hours": 3_600_000}


def _broker_def(broker_key: str, topic_key: str) -> ConfigDef:
    d = TOPIC_CONFIGS[topic_key]
    return ConfigDef(broker_key, d.type, d.default, d.doc, d.minimum, d.choices)


_DEFS = [_broker_def(b, t) for b, t in TOPIC_SYNONYMS.items()] + [
    ConfigDef("log.retention.minutes", ConfigType.INT, "",
              "Keep a segment at most this many minutes, when log.retention.ms is not set.", minimum=-1),
    ConfigDef("log.retention.hours", ConfigType.INT, "168",
              "Keep a segment at most this many hours, when neither log.retention.ms nor .minutes is set.",
              minimum=-1),
    ConfigDef("log.roll.hours", ConfigType.INT, "168",
              "Roll a segment this many hours old, when log.roll.ms is not set.", minimum=1),
    ConfigDef("leader.replication.throttled.rate", ConfigType.LONG, str(2**63 - 1),
              "Bytes per second a leader sends to the throttled replicas of its topics' "
              "leader.replication.throttled.replicas.", minimum=0),
    ConfigDef("follower.replication.throttled.rate", ConfigType.LONG, str(2**63 - 1),
              "Bytes per second a follower fetches for the throttled replicas of its topics' "
              "follower.replication.throttled.replicas.", minimum=0),
]
# Kafka's broker defaults that differ from the topic-level spelling: no
# value for log.retention.ms and log.roll.ms (the hours keys decide).
_NULL_DEFAULTS = {"log.retention.ms", "log.roll.ms"}

DYNAMIC_BROKER_CONFIGS: Mapping[str, ConfigDef] = {
    d.name: (ConfigDef(d.name, d.type, "", d.doc, d.minimum, d.choices) if d.name in _NULL_DEFAULTS else d)
    for d in _DEFS}
"""The broker keys IncrementalAlterConfigs may set on a broker or on every broker."""


def broker_config_error(key: str, value: str | None) -> str | None:
    """None if `key=value` can be set dynamically, else a message for INVALID_CONFIG."""
    d = DYNAMIC_BROKER_CONFIGS.get(key)
    if d is None:
        return (f"Cannot update these configs dynamically: {key} (set it in the broker's properties file "
                f"and restart the broker)")
    if d.type == ConfigType.LIST and value is not None and not value.strip():
        return None  # an empty log.cleanup.policy, as a topic's (neither delete nor compact)
    return d.validate(value)


def default_value(key: str) -> str | None:
    """Kafka's default of a broker key (None: no value)."""
    d = DYNAMIC_BROKER_CONFIGS.get(key)
    if d is None or d.default == "":
        return None
    return d.default


def topic_defaults(props: Mapping[str, str]) -> dict[str, str]:
    """The topic-config defaults in (merged) broker properties `props`:
    only the keys set there, with the ms/minutes/hours precedence resolved."""
    out = {topic: props[broker] for broker, topic in TOPIC_SYNONYMS.items() if props.get(broker) not in (None, "")}
    for topic_key in ("retention.ms", "segment.ms"):
        if topic_key in out:
            continue
        for broker_key in BROKER_SYNONYMS[topic_key][1:]:
            raw = props.get(broker_key)
            if raw not in (None, ""):
                n = int(raw.strip())
                out[topic_key] = str(n * _MS_PER[broker_key] if n >= 0 else -1)
                break
    return out


def broker_value(topic_key: str, props: Mapping[str, str]) -> tuple[str, str] | None:
    """The broker key and topic-level value `props` give `topic_key`, or None."""
    for broker_key in BROKER_SYNONYMS.get(topic_key, ()):
        raw = props.get(broker_key)
        if raw not in (None, ""):
            if broker_key in _MS_PER:
                n = int(raw.strip())
                return broker_key, str(n * _MS_PER[broker_key] if n >= 0 else -1)
            return broker_key, raw
    return None
