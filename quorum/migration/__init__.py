"""ZooKeeper mode -> KRaft quorum migration, in the spirit of KIP-866.

Design (choices, and where they differ from Kafka)
--------------------------------------------------
* **States** are Kafka's `ZkMigrationState`, kept in the metadata log as a
  `ZkMigrationStateRecord` and replayed into `MetadataImage.zk_migration_state`:
  NONE -> MIGRATION (the copy) -> POST_MIGRATION (finalize). The copy is
  one batch ending in the MIGRATION record, so it commits whole or not at
  all; raftka never needs Kafka's PRE_MIGRATION (a copy spread over many
  batches, KIP-868). Limit: the copy must fit one metadata batch (about
  4 MiB of records, some tens of thousands of partitions).
* **Controllers** run with `zookeeper.metadata.migration.enable=true` and
  `zookeeper.connect`; the active one runs `MigrationDriver` (`driver`):
  claim `/controller` + bump `/controller_epoch` (fences the ZooKeeper
  controller), wait for the brokers, copy (`copy`), then dual-write every
  committed change back to the znodes (`dual_write`, `zk_io`) and send
  LeaderAndIsr/UpdateMetadata to brokers still in ZooKeeper mode.
* **Brokers** move one at a time: stopped in ZooKeeper mode, restarted
  with `process.roles=broker`, `node.id` = their old `broker.id` and the
  quorum's voters, on the same log dirs (`meta_properties.to_kraft`
  rewrites meta.properties v0 -> v1 with the cluster id ZooKeeper had, so
  the data and offsets stay as they are).
* **Finalize**, as in KIP-866: restart the controllers without
  `zookeeper.metadata.migration.enable`; the active one (`MigrationFinalizer`)
  appends ZkMigrationState(POST_MIGRATION) once no broker is left in
  ZooKeeper mode: no more ZooKeeper writes. **Rollback** (before finalize): stop the controllers, restart the
  brokers in ZooKeeper mode, delete `/migration` and the KRaft controller's
  `/controller` (`zk_io.release`); ZooKeeper is current thanks to dual write.
* Pure cores: `copy`, `dual_write`, `znode`, `meta_properties`. I/O shells:
  `zk_io` (blocking kazoo), `driver` (trio). Moving a local cluster's
  processes and files (`raftka migrate`) is `cluster.migration`.

Not covered: client/user/IP quotas and ACLs (raftka has none), broker
config changes made on the ZooKeeper side during the migration (topic
configs are taken), reassignments started in ZooKeeper mode, and a copy
larger than one metadata batch.
"""

from quorum.migration.copy import ZkClusterState, brokers_ready, migration_records
from quorum.migration.driver import MigrationConfig, MigrationDriver, MigrationFinalizer
from quorum.migration.dual_write import DualWrites, zk_broker_requests, zk_writes
from quorum.migration.znode import MIGRATION_PATH, MigrationZnode

__all__ = [
    "MIGRATION_PATH",
    "DualWrites",
    "MigrationConfig",
    "MigrationDriver",
    "MigrationFinalizer",
    "MigrationZnode",
    "ZkClusterState",
    "brokers_ready",
    "migration_records",
    "zk_broker_requests",
    "zk_writes",
]
