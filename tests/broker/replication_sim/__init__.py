"""Deterministic simulation of raftka's data-partition replication (VOPR style).

Three brokers, each a thin shell (`broker.SimBroker`) over the pure
replication core (`broker.core.replication`) and a real `storage.Log` on its own
`storage.sim_fs.SimFileSystem` (a crash loses what was not fsynced); the
real controller decisions (`quorum.controller.QuorumController` over
`quorum.metadata.MetadataImage`) as the controller, its images reaching
brokers and clients over the network; a simulated network (delay, loss,
partitions) and clock; acks=all producers and a consumer. One seed drives
everything; `invariants.Invariants` checks after every event.
"""
