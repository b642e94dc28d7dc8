"""The checker: what a queue history says about the system that produced it.

Pure: it takes the events (chaos.history) in the order they were recorded
and returns findings; no I/O, no clock. Each finding names its kind, says
what went wrong in one sentence, and carries the fewest events that show it.

Anomalies (any one fails the run):

- `lost-write`: a send acknowledged `ok` whose value the final read of its
  partition does not contain (each final reader, one per client library,
  must have it).
- `unverified`: a partition with acknowledged sends that the final read did
  not cover, so nothing can be said about it.
- `duplicate`: one value at two offsets, written by an idempotent producer.
- `inconsistent-offset`: two reads (polls, the final read, or a send's
  acknowledgement) disagree on the value at one offset.
- `non-monotonic-send`: an ordered producer's acknowledgements on one
  partition whose offsets do not increase in the order of its sends.
- `non-monotonic-poll`: a consumer session receiving, on one partition, an
  offset at or below one it already received.
- `poll-skip`: a consumer session jumping from one offset to a later one
  over an offset that holds a record (known from any read).
- `phantom-read`: a read value that no send produced, or whose send failed.
- `group-undelivered` (the `group` workload, whose members' open events say
  `at_least_once`): a send acknowledged `ok` that no member of the group
  polled, in any generation or member epoch: the group lost it
  (at-least-once delivery). A value polled by two members, or twice by one
  after a rebalance, is allowed and counted (`group_redelivered`).

- `leader-epoch-regression`: along one replica's log, a batch written by a
  leader of an older epoch than the batch before it (from the run's reading
  of the replicas).
- `node-crash`: a node exited though no nemesis killed it (a full disk must
  stop the writes, not the broker, unless it says its metadata log cannot be
  written: `stopped-disk-full` below).
- `replica-divergence`: two brokers' copies of a partition disagree below
  the final high watermark (from `replica-divergence` events the run
  records after reading the replicas from disk).

Transactional histories (the `txn` workload) are also checked by
chaos.txn_check: aborted reads, intermediate reads, lost committed
transactions, transactions seen in part. Its read_committed readers are
left out of `lost-write` (they must not have aborted records) and may skip
offsets holding records of transactions not known to have committed.

Allowed, reported apart: `duplicate-non-idempotent` (a value at two offsets
from a producer without idempotence: its retries may write twice), and
`duplicate-new-epoch` (an idempotent producer's value stored twice under two
producer epochs, as the `stored` events show: librdkafka, when messages time
out, bumps its epoch and sends again under the new one records an earlier
request may already have written; the broker cannot tell them apart. Under
one epoch, a duplicate is the broker's fault and stays an anomaly).

Also allowed: `stopped-disk-full`, a broker that stopped because the
disk the nemesis filled holds its metadata log, saying so (a Kafka broker
whose metadata log dir fails stops too; the heal starts it again).

Measured, not judged: `unseen`, over time, the acknowledged sends that no
consumer has polled yet (the final read does not count).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from chaos import txn_check
from chaos.history import Event

ANOMALIES = ("lost-write", "unverified", "duplicate", "inconsistent-offset", "non-monotonic-send",
             "non-monotonic-poll", "poll-skip", "phantom-read", "replica-divergence", "leader-epoch-regression",
             "node-crash", "group-undelivered") + txn_check.ANOMALIES
ALLOWED = ("duplicate-non-idempotent", "duplicate-new-epoch", "stopped-disk-full")
READS = ("poll", "final-read")


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    message: str
    evidence: tuple[Event, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message,
                "evidence": [dataclasses.asdict(e) for e in self.evidence]}


@dataclasses.dataclass
class Result:
    anomalies: list[Finding]
    allowed: list[Finding]
    stats: dict[str, Any]
    #: (mono time, acknowledged so far, of those not yet polled by any consumer)
    unseen: list[tuple[float, int, int]]

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in ANOMALIES + ALLOWED}
        for f in self.anomalies + self.allowed:
            out[f.kind] += 1
        return out

    def to_dict(self, limit: int = 20) -> dict[str, Any]:
        """`limit` findings of each kind in full; the counts say how many there were."""
        shown: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in self.anomalies + self.allowed:
            if len(shown[f.kind]) < limit:
                shown[f.kind].append(f.to_dict())
        return {"valid": self.valid, "counts": self.counts(), "findings": dict(shown), "stats": self.stats,
                "unseen": [list(p) for p in self.unseen]}


def check(events: Sequence[Event], unseen_points: int = 100) -> Result:
    anomalies: list[Finding] = []
    allowed: list[Finding] = []
    txns = txn_check.transactions(events)
    # A read_committed reader does not receive aborted records, nor (until they are
    # decided) those of open transactions: its final read is judged by the
    # transactional checks, and it may skip the offsets of such records.
    read_committed = txn_check.read_committed_processes(events)
    visible = txn_check.visible_to_read_committed(txns)

    opens = {e.process: e for e in events if e.f == "open"}
    invokes: dict[str, Event] = {}          # value -> its send invoke
    completions: dict[str, Event] = {}      # value -> its send completion
    send_order: list[str] = []              # values in the order their sends were invoked
    for e in events:
        if e.f != "send" or e.value is None:
            continue
        if e.type == "invoke":
            invokes[e.value] = e
            send_order.append(e.value)
        else:
            completions[e.value] = e
    acked = {v: c for v, c in completions.items() if c.type == "ok"}
    failed = {v for v, c in completions.items() if c.type == "fail"}

    reads = [e for e in events if e.f in READS and e.type == "ok"]

    # --- what is at each offset, by every read and acknowledgement ---------------------
    at: dict[tuple[int, int], dict[str, Event]] = defaultdict(dict)
    for e in reads:
        at[(e.partition, e.offset)].setdefault(e.value, e)  # type: ignore[index]
    for e in acked.values():
        if e.offset is not None and e.offset >= 0:
            at[(e.partition, e.offset)].setdefault(e.value, e)  # type: ignore[index]
    for (partition, offset), values in sorted(at.items()):
        if len(values) > 1:
            shown = tuple(values.values())[:2]
            anomalies.append(Finding(
                "inconsistent-offset",
                f"partition {partition} offset {offset} holds {sorted(values)} depending on who asks", shown))

    # --- one value at two offsets ---------------------------------------------------------
    where: dict[str, dict[tuple[int, int], Event]] = defaultdict(dict)
    for e in reads:
        where[e.value][(e.partition, e.offset)] = e  # type: ignore[index]
    stored = {(e.partition, e.offset): e for e in events if e.f == "stored"}
    for value, places in where.items():
        if len(places) < 2:
            continue
        producer = invokes[value].process if value in invokes else None
        idempotent = producer is not None and bool(opens.get(producer, _NO_OPEN).extra.get("idempotent"))
        first_two = sorted(places)[:2]
        message = f"{value} (from {producer}) is at {sorted(places)}"
        evidence = tuple(places[k] for k in first_two)
        if not idempotent:
            allowed.append(Finding("duplicate-non-idempotent", message, evidence))
            continue
        identities = [_identity(stored.get(k)) for k in first_two]
        if None not in identities:
            evidence += tuple(stored[k] for k in first_two)
            message += " stored as (producer id, epoch, sequence) " + " and ".join(map(str, identities))
        if None not in identities and len({i[:2] for i in identities}) == 2:  # type: ignore[index]
            allowed.append(Finding("duplicate-new-epoch", message, evidence))
        else:
            anomalies.append(Finding("duplicate", message, evidence))

    for e in events:
        if e.f in ("replica-divergence", "leader-epoch-regression"):
            anomalies.append(Finding(e.f, str(e.value), (e,)))
        elif e.f == "crash" and e.extra.get("disk_full"):
            allowed.append(Finding("stopped-disk-full", f"{e.value}: the disk the nemesis filled stopped it, and "
                                   "it said so", (e,)))
        elif e.f == "crash":
            anomalies.append(Finding("node-crash", f"{e.value} while no nemesis killed it", (e,)))

    # --- values nobody wrote --------------------------------------------------------------
    for value, places in where.items():
        if value not in invokes or value in failed:
            first = places[min(places)]
            why = "was never sent" if value not in invokes else "was sent, and the send failed"
            evidence = (first,) if value not in invokes else (invokes[value], completions[value], first)
            anomalies.append(Finding("phantom-read", f"{value} was read at {min(places)} but {why}", evidence))

    # --- lost writes: every final reader (client library) must have every acknowledged value -----
    final_values: dict[tuple[str, int], set[str]] = defaultdict(set)
    final_at: dict[tuple[str, int, int], Event] = {}
    for e in reads:
        if e.f == "final-read":
            final_values[(e.process, e.partition)].add(e.value)  # type: ignore[index,arg-type]
            final_at[(e.process, e.partition, e.offset)] = e  # type: ignore[index]
    readers: dict[int, list[Event]] = defaultdict(list)  # partition -> the final-range of each reader
    for e in events:
        if e.f == "final-range" and e.type == "ok" and e.partition is not None and e.process not in read_committed:
            readers[e.partition].append(e)
    unverified: set[int] = set()
    for value in send_order:
        ack = acked.get(value)
        if ack is None:
            continue
        partition = ack.partition
        if not readers.get(partition):  # type: ignore[arg-type]
            if partition not in unverified:
                unverified.add(partition)  # type: ignore[arg-type]
                anomalies.append(Finding("unverified", f"partition {partition} has acknowledged sends "
                                         "(this one first) but the final read did not cover it", (ack,)))
            continue
        for rng in readers[partition]:  # type: ignore[index]
            if value in final_values[(rng.process, partition)]:  # type: ignore[index]
                continue
            there = final_at.get((rng.process, partition, ack.offset))  # type: ignore[arg-type]
            instead = f"; offset {ack.offset} holds {there.value}" if there is not None else ""
            evidence = (invokes[value], ack) + ((there,) if there is not None else (rng,))
            anomalies.append(Finding(
                "lost-write",
                f"{value} was acknowledged at partition {partition} offset {ack.offset}, and the final read "
                f"({rng.process}) of [{rng.extra.get('low')}, {rng.extra.get('high')}) does not have it{instead}",
                evidence))
            break

    # --- producers: acknowledged offsets in the order of the sends -------------------------
    last_ack: dict[tuple[str, int, int], Event] = {}
    for value in send_order:
        ack = acked.get(value)
        if ack is None or ack.offset is None or ack.offset < 0:
            continue
        if not opens.get(ack.process, _NO_OPEN).extra.get("ordered"):
            continue
        key = (ack.process, ack.session, ack.partition)  # type: ignore[assignment]
        before = last_ack.get(key)  # type: ignore[arg-type]
        if before is not None and ack.offset <= before.offset:  # type: ignore[operator]
            anomalies.append(Finding(
                "non-monotonic-send",
                f"{ack.process} sent {before.value} then {value} to partition {ack.partition}, acknowledged at "
                f"offsets {before.offset} then {ack.offset}", (before, ack)))
        last_ack[key] = ack  # type: ignore[index]

    # --- consumers: offsets within a session go up one record at a time --------------------
    occupied: dict[int, list[int]] = defaultdict(list)
    for partition, offset in at:
        occupied[partition].append(offset)
    for offsets in occupied.values():
        offsets.sort()
    occupied_committed: dict[int, list[int]] = {   # the offsets a read_committed reader must not skip
        p: [o for o in offsets if all(visible.get(v, True) for v in at[(p, o)])] for p, offsets in occupied.items()}
    last_poll: dict[tuple[str, int, int], Event] = {}
    for e in events:
        if e.f != "poll" or e.type != "ok":
            continue
        key = (e.process, e.session, e.partition)  # type: ignore[assignment]
        before = last_poll.get(key)  # type: ignore[arg-type]
        last_poll[key] = e  # type: ignore[index]
        if before is None:
            continue
        if e.offset <= before.offset:  # type: ignore[operator]
            anomalies.append(Finding(
                "non-monotonic-poll",
                f"{e.process} (session {e.session}) polled partition {e.partition} offset {before.offset}, "
                f"then offset {e.offset}", (before, e)))
        elif e.offset > before.offset + 1:  # type: ignore[operator]
            offsets = occupied_committed if e.process in read_committed else occupied
            missed = _first_between(offsets[e.partition], before.offset, e.offset)  # type: ignore[index,arg-type]
            if missed is not None:
                holder = next(iter(at[(e.partition, missed)].values()))  # type: ignore[index]
                anomalies.append(Finding(
                    "poll-skip",
                    f"{e.process} (session {e.session}) polled partition {e.partition} offset {before.offset}, "
                    f"then {e.offset}, skipping offset {missed} ({holder.value})", (before, e, holder)))

    anomalies += txn_check.check_transactions(events, txns, Finding)

    group_stats = _check_groups(events, opens, send_order, acked, invokes, anomalies)

    stats = _stats(events, acked, where)
    if group_stats:
        stats["groups"] = group_stats
    if txns:
        outcomes = [t.outcome for t in txns.values()]
        stats["transactions"] = {k: outcomes.count(k) for k in (txn_check.COMMITTED, txn_check.ABORTED,
                                                                 txn_check.UNKNOWN)}
    # Aborted records are never to be seen by a read_committed consumer: not unseen.
    expected = {v: e for v, e in acked.items() if visible.get(v) is not False}
    return Result(anomalies, allowed, stats, _unseen(events, expected, unseen_points))


_NO_OPEN = Event("", "info", "open")


def _check_groups(events: Sequence[Event], opens: dict[str, Event], send_order: list[str],
                  acked: dict[str, Event], invokes: dict[str, Event], anomalies: list[Finding]
                  ) -> dict[str, dict[str, Any]]:
    """At-least-once delivery to each group whose members say `at_least_once`:
    every acknowledged value polled by some member. Per group: members,
    protocol, assignments, acknowledged values delivered, records (offsets)
    polled more than once, acknowledged values undelivered."""
    members: dict[str, set[str]] = defaultdict(set)
    protocol: dict[str, str] = {}
    for process, e in opens.items():
        if e.extra.get("at_least_once"):
            group_id = str(e.extra.get("group_id"))
            members[group_id].add(process)
            protocol[group_id] = str(e.extra.get("group_protocol", "classic"))
    out: dict[str, dict[str, Any]] = {}
    for group_id, processes in sorted(members.items()):
        polls: set[str] = set()
        times_polled: dict[tuple[int, int], int] = defaultdict(int)
        assignments = 0
        for e in events:
            if e.process in processes:
                if e.f == "poll" and e.type == "ok":
                    polls.add(e.value)  # type: ignore[arg-type]
                    times_polled[(e.partition, e.offset)] += 1  # type: ignore[index]
                elif e.f == "assign":
                    assignments += 1
        undelivered = 0
        for value in send_order:
            ack = acked.get(value)
            if ack is None or value in polls:
                continue
            undelivered += 1
            anomalies.append(Finding(
                "group-undelivered",
                f"{value} was acknowledged at partition {ack.partition} offset {ack.offset}, and no member of "
                f"group {group_id} ({protocol[group_id]} protocol, members {sorted(processes)}) polled it",
                (invokes[value], ack)))
        out[group_id] = {"protocol": protocol[group_id], "members": len(processes), "assignments": assignments,
                         "delivered": sum(1 for v in acked if v in polls),
                         "redelivered": sum(1 for n in times_polled.values() if n > 1),
                         "undelivered": undelivered}
    return out


def _identity(e: Event | None) -> tuple[int, int, int] | None:
    if e is None:
        return None
    return (e.extra.get("producer_id"), e.extra.get("producer_epoch"), e.extra.get("sequence"))  # type: ignore[return-value]


def _first_between(sorted_offsets: list[int], low: int, high: int) -> int | None:
    """The first offset in `sorted_offsets` strictly between low and high."""
    i = bisect.bisect_right(sorted_offsets, low)
    if i < len(sorted_offsets) and sorted_offsets[i] < high:
        return sorted_offsets[i]
    return None


def _stats(events: Sequence[Event], acked: dict[str, Event], where: dict[str, Any]) -> dict[str, Any]:
    by: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e.process != "nemesis":
            by[e.f][e.type] += 1
    sends = by.get("send", {})
    finals: dict[str, int] = defaultdict(int)
    for e in events:
        if e.f == "final-read":
            finals[e.process] += 1
    finals = dict(finals)
    return {
        "sends_attempted": sends.get("invoke", 0),
        "sends_acknowledged": sends.get("ok", 0),
        "sends_failed": sends.get("fail", 0),
        "sends_indeterminate": sends.get("invoke", 0) - sends.get("ok", 0) - sends.get("fail", 0),
        "polled": by.get("poll", {}).get("ok", 0),
        "final_read": max(finals.values(), default=0),
        "final_read_by_reader": finals,
        "distinct_values_read": len(where),
        "faults": sum(1 for e in events if e.process == "nemesis" and e.extra.get("phase") == "start"),
        "by_operation": {f: dict(t) for f, t in sorted(by.items())},
    }


def _unseen(events: Iterable[Event], acked: dict[str, Event], points: int) -> list[tuple[float, int, int]]:
    """Sampled at `points` moments over the run: (mono, acknowledged so far, acknowledged and not yet polled)."""
    first_polled: dict[str, float] = {}
    for e in events:
        if e.f == "poll" and e.type == "ok" and e.value not in first_polled:
            first_polled[e.value] = e.mono  # type: ignore[index]
    if not acked:
        return []
    ack_times = sorted(a.mono for a in acked.values())
    seen_times = sorted(max(first_polled[v], a.mono) for v, a in acked.items() if v in first_polled)
    start, end = ack_times[0], max(ack_times[-1], seen_times[-1] if seen_times else ack_times[-1])
    out = []
    for i in range(points + 1):
        t = start + (end - start) * i / points
        n_acked = bisect.bisect_right(ack_times, t)
        n_seen = bisect.bisect_right(seen_times, t)
        out.append((t, n_acked, n_acked - n_seen))
    return out
