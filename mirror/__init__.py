"""`raftka mirror`: copy topics between Kafka-protocol clusters, in the
manner of Kafka's MirrorMaker 2 (KIP-382).

A mirror is a Kafka client of two clusters and nothing more: it sits on
`common/` and the client library (confluent-kafka), never on the broker or
the quorum. The pure core decides (which topics, their names on the target,
when to write an offset sync, how a source offset translates to a target
offset, which checkpoints to write); the shell does the I/O.

    config.py     MM2-style properties: clusters, flows (`A->B.enabled`), their keys
    policy.py     topic and group selection, the replication policy, cycle refusal
    offsets.py    offset syncs and checkpoints: their wire format, the emitter,
                  the store that translates offsets (as MM2's OffsetSyncStore)
    worker.py     one flow's process: consumer on the source, producer on the target
    eos.py        its exactly-once transaction steps: time limits, producer
                  replacement, abort and rewind to the target's committed positions
    errors.py     MirrorError, the retry backoff, the quiet librdkafka logger
    status.py     lag per topic and partition, for `raftka mirror status`
"""
