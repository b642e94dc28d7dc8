"""Local clusters of separate processes: `LocalCluster` (launcher) and readiness probes."""

from raftka.cluster.launcher import ClusterError, LocalCluster, LocalNode, free_ports

__all__ = ["ClusterError", "LocalCluster", "LocalNode", "free_ports"]
