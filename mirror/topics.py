"""The target's topics and groups follow the source's (I/O shell over two
AdminClients): topics created with the source's partition count and
mirrored configs, partitions added and config changes copied as the source
makes them, and the checkpoints' offsets written into the target's idle
groups."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from mirror.config import FlowConfig
from mirror.offsets import offsets_to_sync
from mirror.policy import configs_to_copy, mirrored_topics

ADMIN_TIMEOUT_S = 15.0

_UNKNOWN_CONFIG = re.compile(r"[Uu]nknown topic config(?: name)?:? '?([\w.]+)")


class TopicFollower:
    """One flow's topic work on both clusters; every failure is reported
    through `error` and retried at the next refresh."""

    def __init__(self, cfg: FlowConfig, src_admin: AdminClient, tgt_admin: AdminClient,
                 say: Callable[[str], None], error: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.src_admin = src_admin
        self.tgt_admin = tgt_admin
        self.say = say
        self._error = error

    def follow(self, src: Any, tgt: Any, policy: Any) -> dict[str, str]:
        """Create the mirrored topics the target lacks, add the partitions and
        copy the configs the source changed; source topic -> target topic of
        those the target now holds (`src`, `tgt`: each cluster's metadata)."""
        mapping = mirrored_topics([t for t, m in src.topics.items() if m.error is None], self.cfg.source,
                                  self.cfg.target, policy, self.cfg.topics)
        source_configs = self._source_configs(list(mapping))
        missing = [s for s, t in mapping.items() if t not in tgt.topics]
        created = self.create(self.tgt_admin, self.cfg.target, [
            NewTopic(mapping[s], len(src.topics[s].partitions), self.cfg.replication_factor,
                     config=source_configs.get(s, {})) for s in missing])
        for s in missing:
            if mapping[s] in created:
                self.say(f"[{self.cfg.name}] created {mapping[s]} on {self.cfg.target} "
                         f"({len(src.topics[s].partitions)} partitions) for {s}")
        ready = {s: t for s, t in mapping.items() if t in tgt.topics or t in created}
        grow = [NewPartitions(t, len(src.topics[s].partitions)) for s, t in ready.items()
                if t in tgt.topics and len(tgt.topics[t].partitions) < len(src.topics[s].partitions)]
        if grow:
            for name, future in self.tgt_admin.create_partitions(grow, request_timeout=ADMIN_TIMEOUT_S).items():
                try:
                    future.result(ADMIN_TIMEOUT_S + 5)
                    self.say(f"[{self.cfg.name}] {name} on {self.cfg.target}: partitions added to follow the source")
                except KafkaException as exc:
                    self._error(f"cannot add partitions to {name} on {self.cfg.target}: {exc.args[0].str()}")
                    ready = {s: t for s, t in ready.items() if t != name}
        existing = [t for s, t in ready.items() if t in tgt.topics]
        target_configs = self._target_configs(existing)
        for s, t in ready.items():
            if t not in target_configs:
                continue
            changed = {k: v for k, v in source_configs.get(s, {}).items() if target_configs[t].get(k) != v}
            if changed:
                self._alter_configs(t, changed)
        return ready

    def create(self, admin: AdminClient, alias: str, topics: list[NewTopic]) -> list[str]:
        """Create `topics` on `alias`; the names that exist afterwards."""
        done = []
        while topics:
            futures = admin.create_topics(topics, operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S)
            again = []
            for topic in topics:
                name = topic.topic
                try:
                    futures[name].result(ADMIN_TIMEOUT_S + 5)
                    done.append(name)
                except KafkaException as exc:
                    err = exc.args[0]
                    unknown = _UNKNOWN_CONFIG.search(err.str() or "")
                    if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                        done.append(name)
                    elif (err.code() == KafkaError.INVALID_CONFIG and unknown
                          and unknown.group(1) in (topic.config or {})):
                        # The target does not know a config the source set (another broker's key):
                        # create the topic without it, and say so.
                        config = {k: v for k, v in topic.config.items() if k != unknown.group(1)}
                        self._error(f"{alias} does not know the topic config {unknown.group(1)} of {name}: "
                                    "creating the topic without it")
                        again.append(NewTopic(name, topic.num_partitions, topic.replication_factor, config=config))
                    else:
                        self._error(f"cannot create topic {name} on {alias}: {err.name()}: {err.str()}; "
                                    "retrying at the next topic refresh")
            topics = again
        return done

    def _source_configs(self, topics: list[str]) -> dict[str, dict[str, str]]:
        if not topics:
            return {}
        out = {}
        futures = self.src_admin.describe_configs([ConfigResource("TOPIC", t) for t in topics],
                                                  request_timeout=ADMIN_TIMEOUT_S)
        for resource, future in futures.items():
            try:
                entries = future.result(ADMIN_TIMEOUT_S + 5)
            except KafkaException as exc:
                self._error(f"cannot read the configs of {resource.name} on {self.cfg.source}: {exc.args[0].str()}")
                continue
            out[resource.name] = configs_to_copy({k: (e.value, bool(e.is_default)) for k, e in entries.items()
                                                  if e.value is not None})
        return out

    def _target_configs(self, topics: list[str]) -> dict[str, dict[str, str]]:
        if not topics:
            return {}
        out = {}
        futures = self.tgt_admin.describe_configs([ConfigResource("TOPIC", t) for t in topics],
                                                  request_timeout=ADMIN_TIMEOUT_S)
        for resource, future in futures.items():
            try:
                out[resource.name] = {k: e.value for k, e in future.result(ADMIN_TIMEOUT_S + 5).items()}
            except KafkaException:
                pass
        return out

    def _alter_configs(self, topic: str, changed: dict[str, str]) -> None:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

        resource = ConfigResource("TOPIC", topic, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sorted(changed.items())])
        for future in self.tgt_admin.incremental_alter_configs([resource]).values():
            try:
                future.result(ADMIN_TIMEOUT_S + 5)
                self.say(f"[{self.cfg.name}] {topic} on {self.cfg.target}: configs follow the source "
                         + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
            except KafkaException as exc:
                self._error(f"cannot set {changed} on {topic} at {self.cfg.target}: {exc.args[0].str()}")

    def sync_group_offsets(self, checkpoints: list) -> int:
        """Write the checkpoints' translated offsets into the target's groups
        that have no member there (`sync.group.offsets.enabled`, never moving
        a group back); how many groups were written."""
        synced = 0
        by_group: dict[str, list] = {}
        for cp in checkpoints:
            by_group.setdefault(cp.group, []).append(cp)
        if not by_group:
            return synced
        try:
            described = self.tgt_admin.describe_consumer_groups(sorted(by_group), request_timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            self._error(f"cannot describe groups on {self.cfg.target}: {exc.args[0].str()}")
            return synced
        for group, cps in sorted(by_group.items()):
            try:
                desc = described[group].result(ADMIN_TIMEOUT_S + 5)
                active = bool(desc.members)
            except KafkaException:
                active = False  # unknown on the target: nobody consumes there yet
            if active:
                continue  # a group with members on the target owns its offsets there (MM2's rule)
            try:
                current = self.tgt_admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)], request_timeout=ADMIN_TIMEOUT_S)[group].result(
                        ADMIN_TIMEOUT_S + 5)
                committed = {(p.topic, p.partition): p.offset for p in current.topic_partitions}
            except KafkaException:
                committed = {}
            wanted = offsets_to_sync(cps, committed)
            if not wanted:
                continue
            request = ConsumerGroupTopicPartitions(
                group, [TopicPartition(t, p, o) for (t, p), o in sorted(wanted.items())])
            try:
                self.tgt_admin.alter_consumer_group_offsets([request], request_timeout=ADMIN_TIMEOUT_S)[group].result(
                    ADMIN_TIMEOUT_S + 5)
                synced += 1
            except KafkaException as exc:
                self._error(f"cannot write the offsets of group {group} on {self.cfg.target}: {exc.args[0].str()}")
        return synced
