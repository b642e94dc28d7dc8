"""Deterministic simulation of a raftka metadata quorum (VOPR / FoundationDB style).

Everything (the network's delays, drops, duplicates and reordering, the
partitions, the crashes, every node's election timeouts) derives from one
seed, so a failing run replays exactly. `cluster.SimCluster` drives real
`RaftCore`s over `network.SimNetwork` with a simulated clock; each node's
log (`disk.py`: a `MemoryLog`, or the production `StorageReplicatedLog` on
the storage engine's simulated file system) loses unflushed writes on a
crash. A wipe loses a node's disk: it comes back with a new directory id and
the operator replaces its old voter identity (remove, then add). `invariants.Invariants`
checks Raft's safety properties after every event; `node.SimNode` checks that
a node on a wiped disk never counts as the voter its id was (no vote granted,
no fetch counted), and `Invariants` that no such node stands.
"""
