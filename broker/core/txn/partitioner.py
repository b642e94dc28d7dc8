"""Which `__transaction_state` partition holds a transactional id (pure).

Kafka's `TransactionStateManager.partitionFor`: `Utils.abs(transactionalId.hashCode())
% transaction.state.log.num.partitions`, the same arithmetic as groups on
`__consumer_offsets` (`broker.core.group.partitioner`).
"""

from __future__ import annotations

from broker.core.group.partitioner import java_string_hash_code, kafka_abs


def partition_for_transactional_id(transactional_id: str, num_partitions: int) -> int:
    assert num_partitions > 0, "transaction.state.log.num.partitions must be positive"
    return kafka_abs(java_string_hash_code(transactional_id)) % num_partitions
