"""The metadata backends side by side: raftka's Raft, pysyncobj's Raft and ZooKeeper.

The metadata benches (`quorum`, `controller-failover`, `topic-create`,
`metadata-scale`) write rows carrying the backend they ran on
(`params.engine`: raftka or pysyncobj in KRaft mode, zookeeper in ZooKeeper
mode; rows from before the engine existed count as raftka in KRaft mode,
as zookeeper in ZooKeeper mode). `backend_table` lines up, for the
headline metrics, each measurement's median across runs per backend,
matching rows whose other params are equal, with the ratios to raftka's
Raft. It works on the collected per-key statistics (one small dict per
key), so it runs in the driver's Python.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("raftka", "pysyncobj", "zookeeper")

#: (scenario, metric, what it is), in the order the table shows them.
HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("quorum", "committed_records_per_s", "committed metadata records/s, 3 controllers"),
    ("quorum", "commit_latency_p50", "commit latency p50"),
    ("quorum", "commit_latency_p99", "commit latency p99"),
    ("controller-failover", "controller_failover_ms", "controller failover: signal to a topic created again"),
    ("controller-failover", "controller_election_ms", "controller failover: signal to a new leader"),
    ("quorum", "failover_median", "quorum failover: SIGKILL of the leader to a write committed"),
    ("topic-create", "topic_create_rate", "topic creations/s"),
    ("topic-create", "topic_create_ms_p50", "new topic listed by the broker it was sent to, p50"),
    ("topic-create", "topic_create_ms_p99", "new topic listed by the broker it was sent to, p99"),
    ("topic-create", "topic_create_all_brokers_ms", "every broker lists every new topic"),
    ("metadata-scale", "create_topics_ms", "CreateTopics of N partitions answered"),
    ("metadata-scale", "metadata_propagation_ms", "every broker lists N new partitions"),
)

#: Params that name the backend or describe it, not the measurement's conditions.
_BACKEND_PARAMS = ("engine", "record")


def backend_of(stat: dict[str, Any]) -> str:
    engine = stat["params"].get("engine")
    if engine:
        return str(engine)
    return "zookeeper" if stat["mode"] == "zk" else "raftka"


def _conditions(params: dict[str, Any]) -> tuple:
    """The params a measurement is matched on across backends (the engine,
    also when it came as `--set quorum.engine=...`, left out)."""
    kept = {k: v for k, v in params.items() if k not in _BACKEND_PARAMS}
    if "sets" in kept:
        sets = [s for s in str(kept.pop("sets")).split(",") if s and not s.startswith("quorum.engine=")]
        if sets:
            kept["sets"] = ",".join(sets)
    return tuple(sorted((k, str(v)) for k, v in kept.items()))


def backend_table(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per (headline metric, matched params): the median of each
    backend (None where not measured) and the ratios to raftka's."""
    order = {(scenario, metric): i for i, (scenario, metric, _) in enumerate(HEADLINES)}
    what = {(scenario, metric): text for scenario, metric, text in HEADLINES}
    lines: dict[tuple, dict[str, Any]] = {}
    for st in stats:
        key = (st["scenario"], st["metric"])
        if key not in order:
            continue
        backend = backend_of(st)
        if backend not in BACKENDS:
            continue
        conditions = _conditions(st["params"])
        line = lines.setdefault(key + (st["unit"], conditions), {
            "scenario": st["scenario"], "metric": st["metric"], "what": what[key], "unit": st["unit"],
            "params": dict(conditions), "direction": st.get("direction"),
            **{b: None for b in BACKENDS}, **{f"{b}_runs": 0 for b in BACKENDS}})
        line[backend] = st["median"]
        line[f"{backend}_runs"] = st["n_runs"]
    out = []
    for line in lines.values():
        base = line["raftka"]
        for other in BACKENDS[1:]:
            value = line[other]
            line[f"{other}_to_raftka"] = value / base if value is not None and base else None
        out.append(line)
    return sorted(out, key=lambda x: (order[(x["scenario"], x["metric"])], sorted(x["params"].items())))
