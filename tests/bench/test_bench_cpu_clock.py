"""The benches' broker CPU figure: another process's CPU time, to the nanosecond."""

import subprocess
import sys
import time

from bench.kafka_bench import process_cpu_seconds
from bench.proc_stats import cpu_seconds


def test_process_cpu_seconds_counts_another_process_precisely():
    # A child that burns about 0.3 s of CPU in a second thread, then ends
    # that thread and sleeps: the figure must include the ended thread.
    child = subprocess.Popen([sys.executable, "-c", (
        "import threading, time\n"
        "def burn():\n"
        "    t = time.thread_time()\n"
        "    while time.thread_time() - t < 0.3: pass\n"
        "th = threading.Thread(target=burn); th.start(); th.join()\n"
        "print('done', flush=True); time.sleep(30)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        precise = process_cpu_seconds(child.pid)
        ticks = cpu_seconds(child.pid)
        assert precise >= 0.3
        # The same quantity as /proc's utime + stime, which counts 10 ms ticks.
        assert abs(precise - ticks) < 0.03, (precise, ticks)
        # It does not move while the process sleeps (to well under a tick).
        time.sleep(0.2)
        assert process_cpu_seconds(child.pid) - precise < 0.005
    finally:
        child.kill()
        child.wait()
