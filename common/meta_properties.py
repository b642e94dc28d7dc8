"""`meta.properties`: which cluster and node a data dir belongs to.

Kafka writes this file when a log dir is formatted (`kafka-storage format`)
and refuses to start when it disagrees with the config, because a data dir
copied to the wrong node, or left over from another cluster, silently mixes
two histories. We do the same: `format_log_dir` writes it once, `check_log_dir`
refuses a mismatch with a message naming the file and what to do.
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from common.config import read_properties
from common.errors import ConfigError

META_PROPERTIES = "meta.properties"


def random_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID in URL-safe base64, 22 chars.

    Never one that starts with "-", as Kafka's `Uuid.randomUuid` does: it
    would read as an option on a command line (`--cluster-id -x...`)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def format_log_dir(log_dir: str | Path, cluster_id: str, node_id: int, directory_id: str | None = None) -> str:
    """Write meta.properties (atomically) unless it already says the same
    thing; return the dir's `directory.id` (KIP-858: a random id per log
    dir, which a dynamic quorum uses to tell a controller's fresh disk from
    its old one)."""
    path = Path(log_dir) / META_PROPERTIES
    if path.exists():
        check_log_dir(log_dir, cluster_id, node_id)
        existing = read_directory_id(log_dir)
        if existing is not None:
            return existing
        # A dir formatted before directory ids: give it one, keeping the rest.
        meta = read_meta(log_dir) or {}
        directory_id = directory_id or random_cluster_id()
        write_meta(log_dir, "".join(f"{k}={v}\n" for k, v in meta.items()) + f"directory.id={directory_id}\n")
        return directory_id
    directory_id = directory_id or random_cluster_id()
    write_meta(log_dir, f"version=1\ncluster.id={cluster_id}\nnode.id={node_id}\ndirectory.id={directory_id}\n")
    return directory_id


def read_directory_id(log_dir: str | Path) -> str | None:
    """The dir's `directory.id` from meta.properties (None before one was written)."""
    meta = read_meta(log_dir)
    return None if meta is None else meta.get("directory.id")


def write_meta(log_dir: str | Path, body: str) -> None:
    """Replace `log_dir`'s meta.properties with `body` durably: temp file,
    fsync, rename, directory fsync."""
    path = Path(log_dir) / META_PROPERTIES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(f"#raftka meta.properties\n{body}")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_meta(log_dir: str | Path) -> dict[str, str] | None:
    path = Path(log_dir) / META_PROPERTIES
    if not path.exists():
        return None
    return read_properties(path)


def check_log_dir(log_dir: str | Path, cluster_id: str | None, node_id: int) -> str:
    """Return the dir's cluster id; refuse a dir formatted for another node or cluster."""
    path = Path(log_dir) / META_PROPERTIES
    meta = read_meta(log_dir)
    if meta is None:
        raise ConfigError(
            f"{path} does not exist: format the log dir first with "
            f"`raftka storage format --config FILE --cluster-id ID`"
        )
    if meta.get("node.id") != str(node_id):
        raise ConfigError(
            f"{path} says node.id={meta.get('node.id')} but the config says node.id={node_id}: "
            f"point log.dirs at this node's own directory, or fix node.id"
        )
    if cluster_id is not None and meta.get("cluster.id") != cluster_id:
        raise ConfigError(
            f"{path} says cluster.id={meta.get('cluster.id')} but this node was asked to join "
            f"cluster {cluster_id}: the dir belongs to another cluster; use an empty dir"
        )
    return meta["cluster.id"]
