"""Local clusters of separate processes: `LocalCluster` (launcher) and readiness probes."""

from cluster.launcher import ClusterError, LocalCluster, LocalNode

__all__ = ["ClusterError", "LocalCluster", "LocalNode"]
