"""Snapshots: an image as a list of records, and back (KIP-630).

Theory of operation
-------------------
A snapshot at offset N is the smallest list of records that rebuilds the
image as of N. `image_to_records` emits, in this order: every broker (a
`RegisterBrokerRecord` carrying its epoch and fence/shutdown state), every
topic followed by its partitions (one full `PartitionRecord` each, with
their current epochs), every config key, and the producer-id watermark.
`image_from_records` replays them onto an empty image; the round trip gives
an equal image (tested as a property).

Ordering is deterministic (brokers by id, topics by name, partitions by
index) so two nodes snapshotting the same image write the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from quorum.metadata.image import MetadataImage
from quorum.metadata.records import (
    ClientQuotaRecord,
    ConfigRecord,
    PartitionRecord,
    ProducerIdsRecord,
    Record,
    RegisterBrokerRecord,
    TopicRecord,
    ZkMigrationStateRecord,
    UserScramCredentialRecord,
    RemoveUserScramCredentialRecord,
    AccessControlEntryRecord,
)
from common.security.sasl import SCRAM_MECHANISMS
from quorum.metadata.replay import replay_snapshot


def image_to_records(image: MetadataImage) -> list[Record]:
    """Records that rebuild `image` with `image_from_records`."""
    out: list[Record] = []
    for _, b in sorted(image.brokers.items()):
        out.append(RegisterBrokerRecord(
            broker_id=b.broker_id, incarnation_id=b.incarnation_id, endpoints=b.endpoints, rack=b.rack,
            fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown, broker_epoch=b.epoch,
            offline_log_dirs=tuple(sorted(b.offline_log_dirs))))
    for name, topic_id in sorted(image.topic_ids_by_name.items()):
        topic = image.topics_by_id[topic_id]
        out.append(TopicRecord(name=name, topic_id=topic_id))
        for index, p in sorted(topic.partitions.items()):
            out.append(PartitionRecord(
                topic_id=topic_id, partition=index, replicas=p.replicas, isr=p.isr, leader=p.leader,
                leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                removing_replicas=p.removing_replicas, adding_replicas=p.adding_replicas,
                directories=p.directories))
    for resource, values in sorted(image.configs.items(), key=lambda kv: (int(kv[0].type), kv[0].name)):
        for key, value in sorted(values.items()):
            out.append(ConfigRecord(resource_type=resource.type, resource_name=resource.name, key=key, value=value))
    for entity, values in sorted(image.client_quotas.items(), key=lambda kv: [(t, n or "") for t, n in kv[0]]):
        for key, value in sorted(values.items()):
            out.append(ClientQuotaRecord(entity=entity, key=key, value=value))
    if image.next_producer_id:
        out.append(ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=image.next_producer_id))
    if image.zk_migration_state:
        out.append(ZkMigrationStateRecord(migration_state=image.zk_migration_state))
    for (mechanism, name), credential in sorted(image.scram_credentials.items()):
        out.append(UserScramCredentialRecord(
            name=name, mechanism=SCRAM_MECHANISMS[mechanism], salt=credential.salt,
            stored_key=credential.stored_key, server_key=credential.server_key, iterations=credential.iterations))
    if image.scram_ever_set and not image.scram_credentials:
        out.append(RemoveUserScramCredentialRecord(name="", mechanism=0))
    for acl_id, acl in sorted(image.acls.items(), key=lambda kv: str(kv[0])):
        out.append(AccessControlEntryRecord(
            id=acl_id, resource_type=int(acl.resource_type), resource_name=acl.resource_name,
            pattern_type=int(acl.pattern_type), principal=acl.principal, host=acl.host,
            operation=int(acl.operation), permission_type=int(acl.permission)))
    return out


def image_from_records(records: Iterable[Record], offset: int, epoch: int) -> MetadataImage:
    """The image a snapshot taken at `offset` (leader epoch `epoch`) describes."""
    return replay_snapshot(records, offset, epoch)
