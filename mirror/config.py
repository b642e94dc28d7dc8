"""MirrorMaker 2-style properties: which clusters, which flows, and each flow's settings.

    clusters = us, eu
    us.bootstrap.servers = 127.0.0.1:9092
    eu.bootstrap.servers = 127.0.0.1:9192
    us->eu.enabled = true
    us->eu.topics = orders.*
    topics.exclude = .*\\.tmp
    replication.policy.class = DefaultReplicationPolicy    # or IdentityReplicationPolicy
    replication.policy.separator = .
    emit.checkpoints.interval.seconds = 60
    sync.group.offsets.enabled = false
    exactly.once.support = disabled                        # or enabled

A key given as `A->B.<key>` applies to that flow only and wins over the
plain `<key>`. Keys raftka reads (MM2's names and defaults unless said):

| key | default | |
|---|---|---|
| topics | `.*` | regexes, comma-separated |
| topics.exclude | `.*[\\-\\.]internal, .*\\.replica, __.*` | |
| groups / groups.exclude | `.*` / `console-consumer-.*, connect-.*, __.*` | groups to checkpoint |
| replication.policy.class / .separator | DefaultReplicationPolicy / `.` | |
| replication.factor | -1 | of created target topics (-1: the target's default) |
| offset-syncs.topic.replication.factor, checkpoints.topic.replication.factor | -1 | |
| offset.lag.max | 100 | records between two offset syncs |
| emit.checkpoints.enabled / .interval.seconds | true / 60 | |
| sync.group.offsets.enabled / .interval.seconds | false / 60 | |
| emit.heartbeats.enabled / .interval.seconds | true / 1 | to `heartbeats` on the target |
| refresh.topics.interval.seconds | 10 (MM2: 600) | new topics, partitions, configs |
| offset.flush.interval.ms | 1000 (MM2: 60000) | source commits, at-least-once |
| exactly.once.support | disabled | `enabled`: transactions on the target |
| group.id | `mirror-<source>-<target>` | raftka's: the source group sharing the work |

Client settings per cluster, as MM2 has them (confluent-kafka/librdkafka
names): `<alias>.security.protocol`, `<alias>.sasl.*`, `<alias>.ssl.*` and
`<alias>.client.id` go to every client of that cluster;
`<alias>.consumer.*`, `<alias>.producer.*` and `<alias>.admin.*` to that
kind of client only (and win over the former), e.g.
`source.consumer.fetch.max.bytes = 1048576`. The settings the mirror's
delivery rests on (group.id, enable.auto.commit, isolation.level,
transactional.id, enable.idempotence, acks, ...) are refused there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from common.config import bool_property, float_property, int_property
from common.errors import ConfigError
from mirror.policy import (DEFAULT_GROUPS_EXCLUDE, DEFAULT_TOPICS_EXCLUDE, IdentityReplicationPolicy, NameFilter,
                           ReplicationPolicy, policy_for)

_ALIAS = re.compile(r"^[A-Za-z0-9_\-]+$")

#: The kinds of client a flow makes, for `<alias>.<kind>.<setting>`.
CLIENT_KINDS = ("consumer", "producer", "admin")
#: `<alias>.<prefix>...` keys that go to every client of the cluster.
_COMMON_CLIENT_PREFIXES = ("security.protocol", "sasl.", "ssl.", "client.id")
#: Set by the mirror itself: its delivery guarantees rest on them.
RESERVED_CLIENT_SETTINGS = {
    "bootstrap.servers": "set <alias>.bootstrap.servers",
    "group.id": "the mirror's groups are named by group.id",
    "group.instance.id": "set by --instance",
    "enable.auto.commit": "source offsets are committed after the target acknowledged",
    "enable.auto.offset.store": "source offsets are committed after the target acknowledged",
    "isolation.level": "only committed source records are copied",
    "transactional.id": "set by exactly.once.support",
    "enable.idempotence": "order per partition through retries rests on it",
    "acks": "a record counts as copied once every in-sync replica of the target has it",
}


@dataclasses.dataclass(frozen=True)
class FlowConfig:
    source: str
    target: str
    source_bootstrap: str
    target_bootstrap: str
    topics: NameFilter
    groups: NameFilter
    policy: ReplicationPolicy
    replication_factor: int = -1
    internal_replication_factor: int = -1
    max_offset_lag: int = 100
    emit_checkpoints: bool = True
    checkpoint_interval_s: float = 60.0
    sync_group_offsets: bool = False
    sync_group_offsets_interval_s: float = 60.0
    emit_heartbeats: bool = True
    heartbeat_interval_s: float = 1.0
    refresh_interval_s: float = 10.0
    flush_interval_s: float = 1.0
    exactly_once: bool = False
    group_id: str = ""
    #: Client settings per kind ("consumer", "producer", "admin") for each cluster.
    source_clients: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    target_clients: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)

    def source_client(self, kind: str) -> dict[str, str]:
        """The user's settings for a `kind` client of the source."""
        return dict(self.source_clients.get(kind, {}))

    def target_client(self, kind: str) -> dict[str, str]:
        return dict(self.target_clients.get(kind, {}))

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"

    @property
    def mirror_group(self) -> str:
        return self.group_id or f"mirror-{self.source}-{self.target}"


def parse(props: Mapping[str, str]) -> list[FlowConfig]:
    """The enabled flows of an MM2-style properties file; a ConfigError names the key at fault."""
    raw = props.get("clusters", "")
    aliases = [a.strip() for a in raw.split(",") if a.strip()]
    if len(aliases) < 2:
        raise ConfigError(f"clusters={raw!r}: name at least two cluster aliases, e.g. clusters = us, eu")
    for alias in aliases:
        if not _ALIAS.match(alias):
            raise ConfigError(f"clusters: alias {alias!r} may hold only letters, digits, '_' and '-'")
        if not props.get(f"{alias}.bootstrap.servers"):
            raise ConfigError(f"{alias}.bootstrap.servers is missing: where is cluster {alias}?")
    for key in props:
        m = re.match(r"^([^.>]+)->([^.]+)\.", key)
        if m and (m.group(1) not in aliases or m.group(2) not in aliases):
            raise ConfigError(f"{key}: {m.group(1)}->{m.group(2)} names a cluster not in clusters={raw!r}")
    enabled = [(a, b) for a in aliases for b in aliases
               if a != b and bool_property(props, f"{a}->{b}.enabled", False)]
    if not enabled:
        raise ConfigError("no flow is enabled: set e.g. "
                          f"{aliases[0]}->{aliases[1]}.enabled = true")
    flows = [_flow(props, a, b) for a, b in enabled]
    for f in flows:
        if isinstance(f.policy, IdentityReplicationPolicy) and (f.target, f.source) in enabled:
            raise ConfigError(f"{f.name} and {f.target}->{f.source} both enabled with IdentityReplicationPolicy: "
                              "topic names cannot tell mirrored records from local ones, so they would loop; "
                              "use DefaultReplicationPolicy")
    return flows


def _flow(props: Mapping[str, str], source: str, target: str) -> FlowConfig:
    prefix = f"{source}->{target}."
    scoped = {**props, **{k[len(prefix):]: v for k, v in props.items() if k.startswith(prefix)}}
    try:
        policy = policy_for(scoped.get("replication.policy.class", "DefaultReplicationPolicy"),
                            scoped.get("replication.policy.separator", "."))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    eos = scoped.get("exactly.once.support", "disabled").strip().lower()
    if eos not in ("enabled", "disabled", "requested"):
        raise ConfigError(f"exactly.once.support={eos!r}: use enabled or disabled")
    try:
        topics = NameFilter(scoped.get("topics", ".*"), scoped.get("topics.exclude", DEFAULT_TOPICS_EXCLUDE))
        groups = NameFilter(scoped.get("groups", ".*"), scoped.get("groups.exclude", DEFAULT_GROUPS_EXCLUDE))
    except re.error as exc:
        raise ConfigError(f"{prefix}topics/groups: not a regex: {exc}") from None
    return FlowConfig(
        source=source, target=target,
        source_bootstrap=props[f"{source}.bootstrap.servers"], target_bootstrap=props[f"{target}.bootstrap.servers"],
        topics=topics, groups=groups, policy=policy,
        replication_factor=int_property(scoped, "replication.factor", -1),
        internal_replication_factor=int_property(scoped, "checkpoints.topic.replication.factor", -1),
        max_offset_lag=int_property(scoped, "offset.lag.max", 100, minimum=0),
        emit_checkpoints=bool_property(scoped, "emit.checkpoints.enabled", True),
        checkpoint_interval_s=_positive(scoped, "emit.checkpoints.interval.seconds", 60.0),
        sync_group_offsets=bool_property(scoped, "sync.group.offsets.enabled", False),
        sync_group_offsets_interval_s=_positive(scoped, "sync.group.offsets.interval.seconds", 60.0),
        emit_heartbeats=bool_property(scoped, "emit.heartbeats.enabled", True),
        heartbeat_interval_s=_positive(scoped, "emit.heartbeats.interval.seconds", 1.0),
        refresh_interval_s=_positive(scoped, "refresh.topics.interval.seconds", 10.0),
        flush_interval_s=int_property(scoped, "offset.flush.interval.ms", 1000, minimum=1) / 1000,
        exactly_once=eos in ("enabled", "requested"),
        group_id=scoped.get("group.id", ""),
        source_clients=client_settings(props, source),
        target_clients=client_settings(props, target),
    )


def client_settings(props: Mapping[str, str], alias: str) -> dict[str, dict[str, str]]:
    """`<alias>.*` client settings per client kind (see the module doc); a
    ConfigError names a key the mirror sets itself."""
    common: dict[str, str] = {}
    per_kind: dict[str, dict[str, str]] = {kind: {} for kind in CLIENT_KINDS}
    for key, value in sorted(props.items()):
        if not key.startswith(f"{alias}."):
            continue
        rest = key[len(alias) + 1:]
        kind, _, setting = rest.partition(".")
        if kind in CLIENT_KINDS and setting:
            target = per_kind[kind]
        elif rest.startswith(_COMMON_CLIENT_PREFIXES):
            target, setting = common, rest
        else:
            continue  # bootstrap.servers, or not a client setting
        if setting in RESERVED_CLIENT_SETTINGS:
            raise ConfigError(f"{key}: the mirror sets {setting} itself ({RESERVED_CLIENT_SETTINGS[setting]}); "
                              "remove the key")
        target[setting] = value
    return {kind: {**common, **settings} for kind, settings in per_kind.items()}


def _positive(props: Mapping[str, str], key: str, default: float) -> float:
    value = float_property(props, key, default)
    if value <= 0:
        raise ConfigError(f"{key}={value}: must be above 0")
    return value


def simple(source_bootstrap: str, target_bootstrap: str, topics: str, **overrides: str) -> list[FlowConfig]:
    """`raftka mirror --source B --target B --topics REGEX`: aliases `source` and `target`."""
    return parse({"clusters": "source, target", "source.bootstrap.servers": source_bootstrap,
                  "target.bootstrap.servers": target_bootstrap, "source->target.enabled": "true",
                  "topics": topics, **overrides})
