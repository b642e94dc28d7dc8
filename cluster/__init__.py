"""The process launcher: local clusters of real, separate processes.

- `launcher.LocalCluster`: controllers and brokers (KRaft or ZooKeeper mode)
  for `raftka cluster up`, the benches and the tests; `probes`: when they
  are ready.
- `local_quorum.LocalQuorum`: controllers alone, for `raftka bench quorum`.
- `migration.LocalMigration`: a `LocalCluster` moved from ZooKeeper mode to
  KRaft, for `raftka migrate`.

It sits above `quorum` and `broker` (it starts them) and below `bench` and
the command line (which use it).
"""

from cluster.launcher import ClusterError, LocalCluster, LocalNode

__all__ = ["ClusterError", "LocalCluster", "LocalNode"]
