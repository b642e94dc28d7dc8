"""The ZkMigrationStateRecord (KIP-866): on the wire, in the image, in snapshots."""

import cbor2

from quorum.metadata.image import LoggedRecord, MetadataImage
from quorum.metadata.records import (
    UnsupportedRecordError,
    ZkMigrationState,
    ZkMigrationStateRecord,
    decode_record,
    encode_record,
    record_to_map,
)
from quorum.metadata.snapshot import image_from_records, image_to_records


def test_record_round_trips_with_kafka_state_codes():
    for state in ZkMigrationState:
        record = ZkMigrationStateRecord(int(state))
        assert decode_record(encode_record(record)) == record
    assert [int(s) for s in (ZkMigrationState.NONE, ZkMigrationState.MIGRATION, ZkMigrationState.POST_MIGRATION,
                             ZkMigrationState.PRE_MIGRATION)] == [0, 1, 2, 3]


def test_newer_record_version_is_refused():
    data = record_to_map(ZkMigrationStateRecord(1))
    data["v"] = 99
    try:
        decode_record(cbor2.dumps(data))
    except UnsupportedRecordError as e:
        assert "upgrade" in str(e)
    else:
        raise AssertionError("a newer ZkMigrationState record version was accepted")


def test_image_tracks_state_and_snapshot_keeps_it():
    image = MetadataImage()
    assert image.zk_migration_state == ZkMigrationState.NONE
    image = image.apply([LoggedRecord(0, 1, ZkMigrationStateRecord(ZkMigrationState.MIGRATION))])
    assert image.zk_migration_state == ZkMigrationState.MIGRATION
    restored = image_from_records(image_to_records(image), image.offset, image.epoch)
    assert restored.zk_migration_state == ZkMigrationState.MIGRATION
    image = image.apply([LoggedRecord(1, 1, ZkMigrationStateRecord(ZkMigrationState.POST_MIGRATION))])
    assert image.zk_migration_state == ZkMigrationState.POST_MIGRATION
    # a never-migrated cluster's snapshot has no such record
    assert not any(isinstance(r, ZkMigrationStateRecord) for r in image_to_records(MetadataImage()))
