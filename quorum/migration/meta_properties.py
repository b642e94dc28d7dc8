"""A broker's `meta.properties` from ZooKeeper mode (v0) to KRaft mode (v1), data untouched.

A ZooKeeper-mode Kafka log dir says `version=0`, `broker.id=<id>` and
(since 2.x) `cluster.id`; a KRaft one says `version=1`, `node.id=<id>`,
`cluster.id`. KIP-866 lets KRaft brokers read v0 during the migration and
rewrite it as v1 afterwards. raftka's KRaft broker checks `node.id` and
`cluster.id` only, so the migrate command rewrites the file before the
broker's first KRaft start: same id, the cluster id ZooKeeper holds.
Nothing else in the log dir changes -- segments, indexes and checkpoints
are the same files in both modes, so every record keeps its offset.
"""

from __future__ import annotations


def to_kraft(meta: dict[str, str], cluster_id: str, node_id: int) -> dict[str, str]:
    """The v1 properties for a dir whose current properties are `meta` (v0 or v1)."""
    current = meta.get("node.id", meta.get("broker.id"))
    if current is not None and current != str(node_id):
        raise ValueError(f"meta.properties belongs to broker {current}, not {node_id}")
    if meta.get("cluster.id") not in (None, cluster_id):
        raise ValueError(f"meta.properties belongs to cluster {meta['cluster.id']}, not {cluster_id}")
    return {"version": "1", "cluster.id": cluster_id, "node.id": str(node_id)}


def render(meta: dict[str, str]) -> str:
    return "#raftka meta.properties\n" + "".join(f"{k}={v}\n" for k, v in meta.items())
