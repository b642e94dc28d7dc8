"""`raftka bench produce --transactional`: transactional producers beside
idempotent ones, in the same run on the same cluster.

Two producing phases, each `--producers` processes for `--duration`
seconds (or `--count` records each) at the same batching, on two topics of
the same shape (`--partitions`, `--rf`):

1. **idempotent**: `enable.idempotence=true`, `acks=all`, no transaction
   (`--acks` does not apply);
2. **transactional**: the same plus a `transactional.id` per process;
   `init_transactions()` before the release, then a transaction committed
   every `--commit-interval-ms` (default 100, Kafka's figure for its ~3%
   overhead with 1 KB records) and at the end. Its records/s counts the
   span until the last commit, when the last records became visible.

Each producer first writes one uncounted record (committed, if
transactional), so neither phase's figures include getting a producer id.
Then a read_committed consumer reads each topic from the beginning:
records/s of read_committed over the transactional topic (its markers and
LSO) beside the same over the idempotent one.

Rows: `idempotent_produce_records_per_s`, `txn_produce_records_per_s`,
`txn_records_per_s_ratio` (transactional / idempotent; target ≥ 0.9 at
100 ms), the delivery latency p50/p99 of each (`produce()` to delivery
report), the transactional phase's commit latency p50/p99
(`commit_transaction()`), its visibility latency p50/p99 (`produce()` to
the end of the commit that made the record visible), `txn_commits`, and
`txn_read_committed_records_per_s`, `idempotent_read_committed_records_per_s`.

`__transaction_state` gets `transaction.state.log.replication.factor`
min(3, brokers), `transaction.state.log.min.isr` min(2, brokers) and 5
partitions (Kafka's defaults need three brokers and make 50), unless
`--set` gives them.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.kafka_bench import MB, bench_cluster, create_topic, emit, row
from bench.load_generator import aggregate, consume_worker, produce_worker

SCENARIO = "produce"
TOPIC = "bench-produce-idempotent"
TXN_TOPIC = "bench-produce-txn"
#: Target of the transactions issue: transactional records/s over idempotent, at 100 ms commits.
TARGET_TXN_RATIO = 0.9


def txn_overrides(args: argparse.Namespace) -> list[str]:
    """`--set` entries for `__transaction_state` that fit the cluster, where the user gave none."""
    given = {entry.split("=", 1)[0] for entry in args.set}
    defaults = {"transaction.state.log.replication.factor": min(3, args.brokers),
                "transaction.state.log.min.isr": min(2, args.brokers),
                "transaction.state.log.num.partitions": 5}
    return [f"{k}={v}" for k, v in defaults.items() if k not in given]


def run_transactional(args: argparse.Namespace, console: Any, params: dict[str, Any],
                      spec: dict[str, Any]) -> int:
    from bench.histogram import LatencyHistogram

    params = {**params, "acks": "all", "enable_idempotence": True, "transactional": True,
              "commit_interval_ms": args.commit_interval_ms}
    args.set = [*args.set, *txn_overrides(args)]
    base = {**spec, "config": {**spec["config"], "enable.idempotence": True, "acks": "all"}}
    with bench_cluster(args, console, TOPIC) as bc:
        create_topic(bc.bootstrap, TXN_TOPIC, args.partitions, args.replication_factor)
        idem = _produce(console, args, bc, {**base, "topic": TOPIC}, "idempotent", None)
        txn = _produce(console, args, bc, {**base, "topic": TXN_TOPIC}, "transactional", args.commit_interval_ms)
        # Each producer's warm-up record is in the topic too.
        idem_read = _read_committed(console, args, bc, TOPIC, idem["records"] + args.producers)
        txn_read = _read_committed(console, args, bc, TXN_TOPIC, txn["records"] + args.producers)

    def histogram(values: list[float]) -> LatencyHistogram:
        h = LatencyHistogram()
        h.record_many(values)
        return h

    ratio = txn["records_per_s"] / idem["records_per_s"] if idem["records_per_s"] else float("nan")
    rows = [
        row(SCENARIO, params, "idempotent_produce_records_per_s", idem["records_per_s"], "records/s"),
        row(SCENARIO, params, "txn_produce_records_per_s", txn["records_per_s"], "records/s"),
        row(SCENARIO, params, "txn_records_per_s_ratio", ratio, "ratio"),
        row(SCENARIO, params, "txn_commits", len(txn["commit_ms"]), "commits"),
        row(SCENARIO, params, "idempotent_read_committed_records_per_s", idem_read["records_per_s"], "records/s"),
        row(SCENARIO, params, "txn_read_committed_records_per_s", txn_read["records_per_s"], "records/s"),
        row(SCENARIO, params, "failed_records", idem["failed"] + txn["failed"], "records"),
        row(SCENARIO, params, "read_committed_missing_records",
            idem["records"] + txn["records"] + 2 * args.producers - idem_read["records"] - txn_read["records"],
            "records"),
    ]
    figures = {"idempotent_produce_latency": idem["latencies_ms"], "txn_produce_latency": txn["latencies_ms"],
               "txn_commit_latency": txn["commit_ms"], "txn_visible_latency": txn["visible_ms"]}
    histograms = {name: histogram(values) for name, values in figures.items()}
    for name, h in histograms.items():
        if h.count:
            rows += [row(SCENARIO, params, f"{name}_p50", h.percentile(50), "ms"),
                     row(SCENARIO, params, f"{name}_p99", h.percentile(99), "ms")]
    _print(console, args, idem, txn, idem_read, txn_read, ratio, histograms)
    emit(args, console, rows, figures, SCENARIO, params)
    failed = idem["failed"] + txn["failed"] + idem_read["failed"] + txn_read["failed"]
    return 0 if not failed and txn_read["records"] == txn["records"] + args.producers else 1


def _produce(console: Any, args: argparse.Namespace, bc: Any, spec: dict[str, Any], title: str,
             commit_interval_ms: int | None) -> dict[str, Any]:
    from bench.produce_bench import _progress

    specs = []
    for i in range(args.producers):
        config = {**spec["config"], "bootstrap.servers": bc.bootstrap}
        if commit_interval_ms is not None:
            config["transactional.id"] = f"bench-txn-{i}"
        specs.append({**spec, "config": config, "commit_interval_ms": commit_interval_ms, "warm_up": True})
    total = args.count * len(specs) if args.count else None
    result = aggregate(_progress(console, f"producing: {title}", total, produce_worker, specs))
    result["records_per_s"] = result["records"] / result["elapsed_s"]
    result["mb_per_s"] = result["records"] * args.record_size / MB / result["elapsed_s"]
    if result["failed"]:
        console.print(f"[red]{title}: {result['failed']} records failed: {result['errors']}[/red]")
    return result


def _read_committed(console: Any, args: argparse.Namespace, bc: Any, topic: str, count: int) -> dict[str, Any]:
    from bench.produce_bench import _progress

    spec = {"bootstrap": bc.bootstrap, "topic": topic, "partitions": list(range(args.partitions)),
            "group_id": f"bench-read-{topic}", "count": count, "timeout_s": 60 + count / 5000,
            "config": {"isolation.level": "read_committed"}}
    result = aggregate(_progress(console, f"read_committed: {topic}", count, consume_worker, [spec]))
    result["records_per_s"] = result["records"] / result["elapsed_s"]
    if result["records"] != count:
        console.print(f"[red]read_committed {topic}: {result['records']:,} records of {count:,}[/red]")
    return result


def _print(console, args, idem, txn, idem_read, txn_read, ratio, histograms) -> None:
    from rich.table import Table

    table = Table(title=f"transactional beside idempotent: {args.producers} producers, {args.record_size} B "
                        f"records, commit every {args.commit_interval_ms} ms, {args.partitions} partitions, "
                        f"RF={args.replication_factor}, {args.brokers} broker(s)")
    for column in ("", "idempotent", "transactional", "ratio"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("records/s", f"{idem['records_per_s']:,.0f}", f"{txn['records_per_s']:,.0f}",
                  f"{ratio:.2f} (target ≥ {TARGET_TXN_RATIO})")
    for q in (50, 99):
        ours, theirs = histograms["txn_produce_latency"], histograms["idempotent_produce_latency"]
        if ours.count and theirs.count:
            table.add_row(f"delivery latency p{q} (ms)", f"{theirs.percentile(q):.1f}", f"{ours.percentile(q):.1f}",
                          f"{ours.percentile(q) / max(theirs.percentile(q), 1e-9):.2f}")
    for name, label in (("txn_commit_latency", "commit_transaction"), ("txn_visible_latency", "produce→visible")):
        h = histograms[name]
        if h.count:
            table.add_row(f"{label} p50 / p99 (ms)", "", f"{h.percentile(50):.1f} / {h.percentile(99):.1f}", "")
    table.add_row("commits", "", f"{len(txn['commit_ms']):,}", "")
    table.add_row("read_committed records/s", f"{idem_read['records_per_s']:,.0f}",
                  f"{txn_read['records_per_s']:,.0f}",
                  f"{txn_read['records_per_s'] / max(idem_read['records_per_s'], 1e-9):.2f}")
    console.print(table)
