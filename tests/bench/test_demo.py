"""`raftka demo`'s two phases against a real broker, and the table it ends with.

The end-to-end run of the whole demo (a 3+3 cluster) is in
tests/cluster/test_cluster_bench.py; these are the parts a reader relies
on: every record is counted, a topic short of records ends the consume
phase at once, and each phase's throughput is printed on one line beside
the CPU the client and the brokers used.
"""

import io
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "broker"))

from broker_testing import BrokerThread  # noqa: E402
from rich.console import Console  # noqa: E402

from bench import demo  # noqa: E402
from bench.proc_stats import cpu_mark  # noqa: E402

RECORDS = 3000
PARTITIONS = 3


def this_process_mark():
    # The broker runs in this process (a thread), so everything counts as the client here.
    return cpu_mark({os.getpid(): "bench"})


def quiet() -> Console:
    return Console(file=io.StringIO(), width=80)


def test_the_demo_produces_and_consumes_every_record_and_says_what_each_phase_cost(tmp_path):
    with BrokerThread(tmp_path, topics={demo.TOPIC: PARTITIONS}) as bt:
        produced = demo.produce(quiet(), bt.bootstrap, RECORDS, 100, this_process_mark)
        consumed = demo.consume(quiet(), bt.bootstrap, RECORDS, PARTITIONS, this_process_mark)
    # Only failed records get a delivery report: the count of acknowledged ones is inferred.
    assert produced.records == RECORDS
    assert consumed.records == RECORDS
    for phase in (produced, consumed):
        assert phase.seconds > 0
        assert phase.client_cpu_s > 0  # this process's CPU clock, to the nanosecond
        assert phase.brokers_cpu_s == 0  # no broker processes in this mark
        assert 0 <= phase.machine_busy <= 1


def test_a_topic_short_of_records_ends_the_consume_phase_at_its_end(tmp_path):
    with BrokerThread(tmp_path, topics={demo.TOPIC: PARTITIONS}) as bt:
        demo.produce(quiet(), bt.bootstrap, RECORDS, 100, this_process_mark)
        t0 = time.monotonic()
        consumed = demo.consume(quiet(), bt.bootstrap, RECORDS + 500, PARTITIONS, this_process_mark)
        waited = time.monotonic() - t0
    assert consumed.records == RECORDS
    # Every partition reported its end: no waiting out the 30 s stall limit.
    assert waited < demo.CONSUME_STALL_S / 3, waited


def test_each_phase_is_one_line_of_throughput_and_both_sides_cpu_in_80_columns():
    produced = demo.Phase(1_000_000, 1.46, client_cpu_s=1.02, brokers_cpu_s=1.13, machine_busy=0.97)
    consumed = demo.Phase(1_000_000, 1.32, client_cpu_s=0.80, brokers_cpu_s=0.10, machine_busy=0.99)
    console = Console(file=io.StringIO(), width=80, record=True)
    console.print(demo.summary(1_000_000, 100, 3, produced, consumed))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "1,000,000 records of 100 B, produced with acks=all" in text

    def row(name: str) -> list[str]:
        [line] = [line for line in lines if line.startswith(f"│ {name} ")]
        return re.findall(r"[\d,.]+%?", line)

    # records/s, MB/s, seconds, client CPU s, brokers CPU s, machine busy
    assert row("produce") == ["684,932", "68.5", "1.46", "1.02", "1.13", "97%"]
    assert row("consume") == ["757,576", "75.8", "1.32", "0.80", "0.10", "99%"]
    header = " ".join(lines[:lines.index(next(line for line in lines if line.startswith("┡")))])
    for column in ("records/s", "MB/s", "seconds", "client", "brokers", "CPU s", "machine", "busy"):
        assert column in header
    # The caption says what the CPU columns count.
    caption = " ".join(text.split("└")[-1].split())
    assert "CPU seconds used during the phase" in caption
    assert "librdkafka's threads" in caption and "the 3 broker processes together" in caption
