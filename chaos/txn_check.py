"""The transactional checks: what a `txn` history says about atomicity and isolation.

Pure, like chaos.checker (which calls it). A transaction is named by the
`key` of its sends' invoke events; its producer records `begin`, then its
sends, then `commit` or `abort` (value: the transaction's name), each an
invoke and a completion:

    committed   a `commit` completed `ok`
    aborted     an `abort` completed `ok` (also after a commit that failed)
    unknown     anything else: a commit or abort that timed out, or a
                producer that never got to either (the coordinator aborts it
                once its transaction timeout passes, or has committed it)

A reader is read_committed when its `open` event says
`extra.isolation == "read_committed"`; the rest read uncommitted.

Anomalies (each reported once per transaction, with the events that show it):

- `aborted-read`: a read_committed reader received a record of an aborted
  transaction.
- `intermediate-read`: a read_committed reader received a record of a
  transaction before its producer asked to commit it (the transaction was
  still open: the reader saw part of it); a transaction later aborted is an
  aborted read instead.
- `lost-committed-txn`: a transaction's commit was acknowledged, and a
  read_committed final read of the whole partition lacks one of its records.
- `txn-not-atomic`: a transaction whose outcome is unknown is in a
  read_committed final read in part (some records there, others not), or
  whole in one final reader and absent from another.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from chaos.history import Event

ANOMALIES = ("aborted-read", "intermediate-read", "lost-committed-txn", "txn-not-atomic")
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"
READ_COMMITTED = "read_committed"


@dataclasses.dataclass
class Txn:
    name: str
    process: str
    #: value -> the send's invoke event, in the order of the sends.
    sends: dict[str, Event] = dataclasses.field(default_factory=dict)
    outcome: str = UNKNOWN
    #: The first `commit` invoke (None: the producer never asked to commit).
    commit_invoke: Event | None = None
    #: The completion that decided the outcome (commit ok, abort ok), or the last one recorded.
    decided_by: Event | None = None

    @property
    def asked_to_commit_at(self) -> float | None:
        return None if self.commit_invoke is None else self.commit_invoke.mono


def transactions(events: Sequence[Event]) -> dict[str, Txn]:
    """name -> the transaction, from the sends' keys and the commit and abort events."""
    txns: dict[str, Txn] = {}
    for e in events:
        if e.f == "send" and e.type == "invoke" and e.key is not None:
            txn = txns.setdefault(e.key, Txn(e.key, e.process))
            txn.sends[e.value] = e  # type: ignore[index]
        elif e.f in ("begin", "commit", "abort") and e.value is not None:
            txn = txns.setdefault(e.value, Txn(e.value, e.process))
            if e.f == "commit" and e.type == "invoke" and txn.commit_invoke is None:
                txn.commit_invoke = e
            if e.type == "ok" and e.f == "commit":
                txn.outcome, txn.decided_by = COMMITTED, e
            elif e.type == "ok" and e.f == "abort" and txn.outcome != COMMITTED:
                txn.outcome, txn.decided_by = ABORTED, e
            elif e.type in ("fail", "info") and e.f in ("commit", "abort") and txn.outcome == UNKNOWN:
                txn.decided_by = e
    return txns


def read_committed_processes(events: Sequence[Event]) -> set[str]:
    return {e.process for e in events if e.f == "open" and e.extra.get("isolation") == READ_COMMITTED}


def visible_to_read_committed(txns: dict[str, Txn]) -> dict[str, bool | None]:
    """value -> True (its transaction committed), False (aborted), None (unknown).
    Values sent outside any transaction are not in it: they are always visible."""
    out: dict[str, bool | None] = {}
    for txn in txns.values():
        seen = {COMMITTED: True, ABORTED: False}.get(txn.outcome)
        for value in txn.sends:
            out[value] = seen
    return out


def check_transactions(events: Sequence[Event], txns: dict[str, Txn], finding: type) -> list:
    """The findings (instances of `finding`, chaos.checker.Finding) of the four kinds above."""
    found: list = []
    if not txns:
        return found
    committed_readers = read_committed_processes(events)
    txn_of = {value: txn for txn in txns.values() for value in txn.sends}

    # --- what read_committed readers received ----------------------------------------------
    reported: set[tuple[str, str]] = set()
    for e in events:
        if e.f not in ("poll", "final-read") or e.type != "ok" or e.process not in committed_readers:
            continue
        txn = txn_of.get(e.value)  # type: ignore[arg-type]
        if txn is None:
            continue
        if txn.outcome == ABORTED:
            if (txn.name, "aborted-read") not in reported:
                reported.add((txn.name, "aborted-read"))
                found.append(finding(
                    "aborted-read",
                    f"{e.process} (read_committed) received {e.value} at partition {e.partition} offset {e.offset}; "
                    f"its transaction {txn.name} was aborted", (txn.sends[e.value], txn.decided_by, e)))
            continue
        asked = txn.asked_to_commit_at
        if (asked is None or e.mono < asked) and (txn.name, "intermediate-read") not in reported:
            reported.add((txn.name, "intermediate-read"))
            when = "was never asked to commit" if asked is None else "was asked to commit only later"
            evidence = (txn.sends[e.value], e) + ((txn.commit_invoke,) if txn.commit_invoke is not None else ())
            found.append(finding(
                "intermediate-read",
                f"{e.process} (read_committed) received {e.value} at partition {e.partition} offset {e.offset} "
                f"while its transaction {txn.name} was open (it {when})", evidence))

    # --- the read_committed final reads: committed transactions whole, the others all or nothing ---
    final: dict[str, dict[str, Event]] = defaultdict(dict)       # reader -> value -> its read
    covered: dict[str, set[int]] = defaultdict(set)              # reader -> partitions read in full
    for e in events:
        if e.process not in committed_readers:
            continue
        if e.f == "final-read" and e.type == "ok":
            final[e.process][e.value] = e  # type: ignore[index]
        elif e.f == "final-range" and e.type == "ok" and e.partition is not None:
            covered[e.process].add(e.partition)
    for txn in txns.values():
        if txn.outcome == ABORTED or not txn.sends:
            continue
        partitions = {s.partition for s in txn.sends.values()}
        whole_in: list[str] = []
        absent_from: list[str] = []
        for reader in sorted(covered):
            if not partitions <= covered[reader]:
                continue  # this reader cannot judge the transaction; the queue checks say so
            there = [v for v in txn.sends if v in final[reader]]
            missing = [v for v in txn.sends if v not in final[reader]]
            if txn.outcome == COMMITTED and missing:
                found.append(finding(
                    "lost-committed-txn",
                    f"transaction {txn.name} of {txn.process} was committed (acknowledged), and the final "
                    f"read_committed read ({reader}) lacks {missing} of its {len(txn.sends)} records",
                    (txn.sends[missing[0]], txn.decided_by)
                    + ((final[reader][there[0]],) if there else ())))  # type: ignore[operator]
                break
            if txn.outcome == UNKNOWN and there and missing:
                found.append(finding(
                    "txn-not-atomic",
                    f"transaction {txn.name} of {txn.process} (outcome unknown) is in part in the final "
                    f"read_committed read ({reader}): {there} there, {missing} not",
                    (final[reader][there[0]], txn.sends[missing[0]])
                    + ((txn.decided_by,) if txn.decided_by is not None else ())))
                break
            (whole_in if there else absent_from).append(reader)
        else:
            if txn.outcome == UNKNOWN and whole_in and absent_from:
                first = next(iter(txn.sends))
                found.append(finding(
                    "txn-not-atomic",
                    f"transaction {txn.name} of {txn.process} (outcome unknown) is whole in the final "
                    f"read_committed read of {whole_in} and absent from that of {absent_from}",
                    (txn.sends[first], final[whole_in[0]][first])))
    return found
