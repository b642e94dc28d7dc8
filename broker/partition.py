"""Names the request handlers share about partition replicas.

The state of a hosted replica is the replication core's `Partition`
(`broker.replication.partition`), as the handlers see it through
`broker.replica_state.ReplicaState`; this module keeps the one constant the
handlers import from here.
"""

from broker.replication import NO_EPOCH

__all__ = ["NO_EPOCH"]
