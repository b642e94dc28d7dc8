"""The KIP-584 features a node reports in ApiVersions v3+ (pure).

Theory of operation
-------------------
A Kafka 4 broker or controller answers ApiVersions with the range of each feature it can
run at (`supported_features`) and the level the cluster runs at
(`finalized_features`, with the epoch of the metadata they were read from).
Clients read them to pick protocol behaviour: Kafka's own client uses
transactions v2 when `transaction.version` is finalized at 2, the new
consumer group protocol only when `group.version` is at least 1.

raftka claims only what it serves:

- `metadata.version` 25 (Kafka 4.0-IV3), the one level whose client APIs
  raftka serves (Fetch v17 with topic ids, DescribeTopicPartitions,
  ListOffsets v9). raftka's metadata log has its own record format and no
  FeatureLevelRecord, so the level is fixed: supported 25..25, finalized 25.
- `kraft.version` 0 for a static controller quorum
  (`controller.quorum.voters`), 1 for a dynamic one (KIP-853: nodes found
  through `controller.quorum.bootstrap.servers`, voters in VotersRecords of
  the metadata log). Supported 0..1; a level 0 is not listed as finalized,
  as Kafka leaves out features at level 0.
- `group.version` 1: KIP-848's consumer protocol (ConsumerGroupHeartbeat,
  ConsumerGroupDescribe) is served next to the classic one. Supported
  0..1, finalized 1.
- `transaction.version` 2: transactions v2 (KIP-890 part 2) are served and
  on.

Brokers and controllers report the same levels. The finalized features
epoch is the offset of the metadata image the node serves, as Kafka's
nodes report it: it only grows, so a client
that saw a higher epoch knows an answer is older.
"""

from __future__ import annotations

from common.wire.apis import Feature

METADATA_VERSION_FEATURE = "metadata.version"
#: Kafka 4.0-IV3 (MetadataVersion.IBP_4_0_IV3).
METADATA_VERSION = 25
KRAFT_VERSION_FEATURE = "kraft.version"
KRAFT_VERSION = 0
#: KIP-853's dynamic quorum.
KRAFT_VERSION_DYNAMIC = 1
GROUP_VERSION_FEATURE = "group.version"
GROUP_VERSION = 1
TRANSACTION_VERSION_FEATURE = "transaction.version"
#: KIP-890's transactions v2: the epoch bumped by every EndTxn.
TRANSACTION_VERSION = 2

#: What this broker can run at, by feature.
SUPPORTED_FEATURES = (
    Feature(GROUP_VERSION_FEATURE, 0, GROUP_VERSION),
    Feature(KRAFT_VERSION_FEATURE, 0, KRAFT_VERSION_DYNAMIC),
    Feature(METADATA_VERSION_FEATURE, METADATA_VERSION, METADATA_VERSION),
    Feature(TRANSACTION_VERSION_FEATURE, 0, TRANSACTION_VERSION),
)

def finalized_features(kraft_version: int = KRAFT_VERSION) -> tuple[Feature, ...]:
    """The levels the cluster runs at; features at level 0 are left out (Kafka's rule)."""
    return tuple(
        Feature(name, level, level)
        for name, level in ((METADATA_VERSION_FEATURE, METADATA_VERSION),
                            (KRAFT_VERSION_FEATURE, kraft_version),
                            (GROUP_VERSION_FEATURE, GROUP_VERSION),
                            (TRANSACTION_VERSION_FEATURE, TRANSACTION_VERSION))
        if level > 0
    )


#: A static quorum's levels.
FINALIZED_FEATURES = finalized_features()


def finalized_features_epoch(image_offset: int) -> int:
    """The epoch reported with `FINALIZED_FEATURES`: the image's offset
    (-1, "no finalized features yet", before the first image; KIP-584)."""
    return image_offset if image_offset >= 0 else -1
