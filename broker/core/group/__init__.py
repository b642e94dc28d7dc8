"""The consumer group coordinator (Kafka's classic group protocol and
KIP-848's consumer protocol, `consumer_group`), pure.

Public API
----------
- `GroupCoordinatorShard(partition, config, rng)`: the groups and offsets
  of one `__consumer_offsets` partition; `replay`, `on_loaded`, `handle`,
  `tick`, `next_deadline_ms`, `unload`. Each step returns a
  `CoordinatorResult(records, responses)`.
- `RequestContext(token, client_id, client_host)`: who sent a request.
- `GroupCoordinatorConfig`: `group.*` / `offsets.*` settings.
- `partition_for_group(group_id, n)`, `java_string_hash_code`,
  `OFFSETS_TOPIC_NAME`, `offsets_topic_configs()`.
- `GROUP_API_VERSIONS`, `split_by_partition`, `merge_responses`,
  `error_response`: routing requests to shards and answering for shards
  this broker does not have.
- `records`: the `__consumer_offsets` key/value codec (Kafka's formats).

Wiring a shard into the broker (for the integrator)
----------------------------------------------------
1. `__consumer_offsets` is created on first use (FindCoordinator for a
   group, or any group request) with `offsets.topic.num.partitions`
   partitions, `offsets.topic.replication.factor` replicas and
   `offsets_topic_configs()`. FindCoordinator answers with the leader of
   `partition_for_group(key, n)` (COORDINATOR_NOT_AVAILABLE while the topic
   or its leader does not exist yet).
2. When this broker becomes leader of partition p: create
   `GroupCoordinatorShard(p, config, random.Random(seed))`, read the log of
   p from its start to its end calling `shard.replay(key, value)` per
   record (`shard.replay(key, value, producer_id)` for the records of a
   transactional batch; for a COMMIT/ABORT control batch
   `shard.complete_transaction(producer_id, commit)`; skip other control
   batches), then `shard.on_loaded(now_ms)`. Requests
   meanwhile get COORDINATOR_LOAD_IN_PROGRESS from the shard itself.
   When it stops leading p: `result = shard.unload()`, send its responses,
   answer every response still held for p (below) with
   `error_response(request, NOT_COORDINATOR)`, drop the shard.
3. A request with an API key in `GROUP_API_VERSIONS`: for a multi-group
   request `split_by_partition`, else its one partition; for a partition
   without a shard here answer `error_response(request, NOT_COORDINATOR)`;
   else `result = shard.handle(RequestContext(token, client_id,
   "/" + peer_host), request, now_ms)`; merge parts with `merge_responses`.
   ListGroups goes to every shard here.
4. Every `CoordinatorResult` (from `handle`, `tick` or `unload`), on the
   shard's own task so results stay in order:
   - if `result.records`: append them at once as one record batch (magic
     v2, no compression needed, timestamps = now) to partition p as
     leader (acks=all semantics); remember `barrier` = the log end offset
     after the append. With no records, `barrier` = the current log end
     offset.
   - hold each `(token, response)` of `result.responses` until the high
     watermark of p reaches `barrier`, then send it on the connection of
     the request with that token. Tokens may belong to requests other
     than the one just handled (parked JoinGroup/SyncGroup), and the
     handled request may get no response yet (it is parked: keep its
     connection slot open; the answer comes from a later step).
   - if the append fails (NOT_LEADER_OR_FOLLOWER, storage error) or the
     barrier is not reached within `offsets.commit.timeout.ms`: answer the
     held responses with `error_response(request, NOT_COORDINATOR)` (lost
     leadership) or `COORDINATOR_NOT_AVAILABLE` (timeout, the records may
     still commit later), keeping the request of each held token. After a
     failed append, unload the shard and reload it by replay (step 2).
   - each `(producer_id, producer_epoch, records)` of `result.txn_records`
     (TxnOffsetCommit) goes after `records` as its own transactional
     batch of that producer; a marker later written to p by
     WriteTxnMarkers is passed on as `shard.complete_transaction`.
5. Call `shard.tick(now_ms)` at `shard.next_deadline_ms()` (or simply every
   ~100 ms) and treat its result as in step 4.

Parked requests: JoinGroup (until the join phase ends: all known members
rejoined, the rebalance timeout, or the initial rebalance delay) and
SyncGroup of followers (until the leader's SyncGroup). Their clients
already wait longer than the rebalance timeout for them.
"""

from broker.core.group.config import GroupCoordinatorConfig
from broker.core.group.effects import CoordinatorResult, RequestContext
from broker.core.group.partitioner import (
    OFFSETS_TOPIC_NAME,
    java_string_hash_code,
    kafka_abs,
    offsets_topic_configs,
    partition_for_group,
)
from broker.core.group.records import GroupRecordError, Record
from broker.core.group.responses import error_response
from broker.core.group.routing import GROUP_API_VERSIONS, is_multi_group, merge_responses, split_by_partition
from broker.core.group.shard import GroupCoordinatorShard, NotAGroupRequestError

__all__ = [
    "GROUP_API_VERSIONS",
    "OFFSETS_TOPIC_NAME",
    "CoordinatorResult",
    "GroupCoordinatorConfig",
    "GroupCoordinatorShard",
    "GroupRecordError",
    "NotAGroupRequestError",
    "Record",
    "RequestContext",
    "error_response",
    "is_multi_group",
    "java_string_hash_code",
    "kafka_abs",
    "merge_responses",
    "offsets_topic_configs",
    "partition_for_group",
    "split_by_partition",
]
