"""The transactional checks on hand-built `txn` histories: each anomaly alone
is found exactly once with its evidence, and a clean history (commits,
aborts, an undecided transaction, control markers between the records)
has no finding at all."""

from __future__ import annotations

from chaos.checker import check
from chaos.history import Event

RC = "c-rc"
FINAL_RU = "final-confluent"
FINAL_RC = "final-confluent-rc"


class TxnHistory:
    """A clock that ticks on every event; transactions of one producer, `tp-0`."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.t = 0.0
        self.add("tp-0", "info", "open", extra={"role": "producer", "idempotent": True, "ordered": True,
                                                "transactional": True})
        self.add(RC, "info", "open", extra={"role": "consumer", "isolation": "read_committed"})
        self.add(FINAL_RU, "info", "open", extra={"role": "final", "isolation": "read_uncommitted"})
        self.add(FINAL_RC, "info", "open", extra={"role": "final", "isolation": "read_committed"})

    def add(self, process: str, type: str, f: str, **fields) -> Event:
        self.t += 1.0
        e = Event(process, type, f, wall=1e9 + self.t, mono=self.t, **fields)
        self.events.append(e)
        return e

    def txn(self, name: str, sends: list[tuple[str, int, int]], end: str, outcome: str = "ok") -> None:
        """sends: (value, partition, acknowledged offset); end: commit or abort."""
        self.add("tp-0", "invoke", "begin", value=name)
        self.add("tp-0", "ok", "begin", value=name)
        for value, partition, offset in sends:
            self.add("tp-0", "invoke", "send", partition=partition, value=value, key=name)
            self.add("tp-0", "ok", "send", partition=partition, value=value, offset=offset, key=name)
        self.commit(name, end, outcome)

    def commit(self, name: str, end: str, outcome: str = "ok") -> None:
        self.add("tp-0", "invoke", end, value=name)
        self.add("tp-0", outcome, end, value=name, extra={} if outcome == "ok" else {"error": "_TIMED_OUT"})

    def poll(self, partition: int, offset: int, value: str, process: str = RC) -> None:
        self.add(process, "ok", "poll", partition=partition, offset=offset, value=value, session=1)

    def final(self, reader: str, partition: int, records: list[tuple[int, str]], high: int) -> None:
        for offset, value in records:
            self.add(reader, "ok", "final-read", partition=partition, offset=offset, value=value)
        self.add(reader, "ok", "final-range", partition=partition, extra={"low": 0, "high": high})


def clean(rc_p0: list[tuple[int, str]] | None = None, rc_p1: list[tuple[int, str]] | None = None,
          before_t1_commit: list[tuple[int, int, str]] = ()) -> TxnHistory:
    """t1 committed, t2 aborted, t3 committed, t4 undecided (its commit timed out) and
    wholly aborted by the coordinator; a control marker after each transaction's records."""
    h = TxnHistory()
    h.add("tp-0", "invoke", "begin", value="t1")
    h.add("tp-0", "ok", "begin", value="t1")
    for value, partition in (("a", 0), ("b", 1)):
        h.add("tp-0", "invoke", "send", partition=partition, value=value, key="t1")
        h.add("tp-0", "ok", "send", partition=partition, value=value, offset=0, key="t1")
    for partition, offset, value in before_t1_commit:
        h.poll(partition, offset, value)
    h.commit("t1", "commit")
    h.txn("t2", [("c", 0, 2), ("d", 1, 2)], "abort")
    h.txn("t3", [("e", 0, 4), ("f", 1, 4)], "commit")
    h.txn("t4", [("g", 0, 6), ("h", 1, 6)], "commit", outcome="info")
    # The read_committed consumer skips the aborted (and undecided) records and the markers.
    if not before_t1_commit:
        h.poll(0, 0, "a")
    h.poll(0, 4, "e")
    h.poll(1, 0, "b")
    h.poll(1, 4, "f")
    h.final(FINAL_RU, 0, [(0, "a"), (2, "c"), (4, "e"), (6, "g")], high=8)
    h.final(FINAL_RU, 1, [(0, "b"), (2, "d"), (4, "f"), (6, "h")], high=8)
    h.final(FINAL_RC, 0, rc_p0 if rc_p0 is not None else [(0, "a"), (4, "e")], high=8)
    h.final(FINAL_RC, 1, rc_p1 if rc_p1 is not None else [(0, "b"), (4, "f")], high=8)
    return h


def kinds(h: TxnHistory) -> list[str]:
    return [f.kind for f in check(h.events).anomalies]


def test_a_clean_transactional_history_has_no_finding() -> None:
    result = check(clean().events)
    assert result.anomalies == [] and result.allowed == []
    assert result.stats["transactions"] == {"committed": 2, "aborted": 1, "unknown": 1}


def test_an_undecided_transaction_seen_whole_is_fine() -> None:
    # A commit that timed out may have happened: all of it visible is allowed.
    assert kinds(clean(rc_p0=[(0, "a"), (4, "e"), (6, "g")], rc_p1=[(0, "b"), (4, "f"), (6, "h")])) == []


def test_a_read_committed_read_of_an_aborted_transaction_is_an_aborted_read() -> None:
    result = check(clean(rc_p0=[(0, "a"), (2, "c"), (4, "e")]).events)
    assert [f.kind for f in result.anomalies] == ["aborted-read"]
    found = result.anomalies[0]
    assert "t2" in found.message and "c" in found.message
    assert [(e.f, e.type) for e in found.evidence] == [("send", "invoke"), ("abort", "ok"), ("final-read", "ok")]


def test_a_read_committed_poll_before_the_commit_was_asked_is_an_intermediate_read() -> None:
    result = check(clean(before_t1_commit=[(0, 0, "a")]).events)
    assert [f.kind for f in result.anomalies] == ["intermediate-read"]
    found = result.anomalies[0]
    assert "t1" in found.message and "asked to commit only later" in found.message
    assert [(e.f, e.type) for e in found.evidence] == [("send", "invoke"), ("poll", "ok"), ("commit", "invoke")]


def test_a_committed_transaction_missing_a_record_from_the_read_committed_read_is_lost() -> None:
    result = check(clean(rc_p1=[(0, "b")]).events)
    assert [f.kind for f in result.anomalies] == ["lost-committed-txn"]
    found = result.anomalies[0]
    assert "t3" in found.message and "['f']" in found.message
    assert [(e.f, e.type) for e in found.evidence] == [("send", "invoke"), ("commit", "ok"), ("final-read", "ok")]


def test_an_undecided_transaction_seen_in_part_is_not_atomic() -> None:
    result = check(clean(rc_p0=[(0, "a"), (4, "e"), (6, "g")]).events)
    assert [f.kind for f in result.anomalies] == ["txn-not-atomic"]
    assert "t4" in result.anomalies[0].message and "['g'] there, ['h'] not" in result.anomalies[0].message


def test_an_undecided_transaction_whole_in_one_reader_and_absent_from_another_is_not_atomic() -> None:
    h = clean(rc_p0=[(0, "a"), (4, "e"), (6, "g")], rc_p1=[(0, "b"), (4, "f"), (6, "h")])
    h.add("final-kafka-python-rc", "info", "open", extra={"role": "final", "isolation": "read_committed"})
    h.final("final-kafka-python-rc", 0, [(0, "a"), (4, "e")], high=8)
    h.final("final-kafka-python-rc", 1, [(0, "b"), (4, "f")], high=8)
    assert kinds(h) == ["txn-not-atomic"]


def test_a_read_committed_consumer_skipping_a_committed_record_is_a_poll_skip() -> None:
    h = clean()
    for i, e in enumerate(h.events):
        if e.f == "poll" and e.partition == 0 and e.offset == 4:
            h.events[i] = Event(RC, "ok", "poll", partition=0, offset=6, value="g", session=1, wall=e.wall,
                                mono=e.mono)
    # a@0 then g@6 skips e@4, of the committed t3 (and c@2 of the aborted t2, which is allowed).
    result = check(h.events)
    assert [f.kind for f in result.anomalies] == ["poll-skip"]
    assert "skipping offset 4 (e)" in result.anomalies[0].message


def test_an_acknowledged_transactional_record_the_uncommitted_read_lacks_is_a_lost_write() -> None:
    h = clean()
    h.events = [e for e in h.events if not (e.process == FINAL_RU and e.value == "c")]
    # An aborted transaction's records stay in the log: the read_uncommitted read must have them.
    assert kinds(h) == ["lost-write"]
