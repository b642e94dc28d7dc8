"""The transaction coordinator (KIP-98, KIP-360, KIP-588, KIP-890), pure.

Public API
----------
- `TransactionCoordinatorShard(partition, coordinator_epoch, config)`: the
  transactional ids of one `__transaction_state` partition; `replay`,
  `on_loaded`, `init_producer_id`, `add_partitions`, `verify_partitions`,
  `end_txn`, `markers_written`, `tick`, `abort_open`, `describe`,
  `list_transactions`. Each step returns a `Step(records, response, markers)`.
- `TxnState`, `TransactionMetadata`: the state machine (`state`).
- `TransactionCoordinatorConfig`, `TRANSACTION_STATE_TOPIC_NAME`.
- `partition_for_transactional_id(transactional_id, n)`.
- `records`: the `__transaction_state` key/value codec (Kafka's format).

The shell (`broker.shell.txn_runtime`) appends each step's records, holds
its response and markers until they are committed, writes the markers with
WriteTxnMarkers, and calls `markers_written` when every partition has one.
"""

from broker.core.txn.config import (
    TRANSACTION_STATE_TOPIC_NAME,
    TransactionCoordinatorConfig,
)
from broker.core.txn.partitioner import partition_for_transactional_id
from broker.core.txn.records import TransactionRecordError
from broker.core.txn.shard import (
    AddPartitionsAnswer,
    DescribedTransaction,
    EndTxnAnswer,
    InitProducerIdAnswer,
    ListedTransaction,
    MarkerJob,
    Step,
    TransactionCoordinatorShard,
    TxnRecord,
)
from broker.core.txn.state import TransactionMetadata, TxnState

__all__ = [
    "TRANSACTION_STATE_TOPIC_NAME",
    "AddPartitionsAnswer",
    "DescribedTransaction",
    "EndTxnAnswer",
    "InitProducerIdAnswer",
    "ListedTransaction",
    "MarkerJob",
    "Step",
    "TransactionCoordinatorConfig",
    "TransactionCoordinatorShard",
    "TransactionMetadata",
    "TransactionRecordError",
    "TxnRecord",
    "TxnState",
    "partition_for_transactional_id",
]
