"""The benches' broker CPU figure: another process's CPU time, to the nanosecond,
and the CPU used by groups of processes between two marks."""

import os
import subprocess
import sys
import time

from bench.proc_stats import cpu_between, cpu_mark, cpu_seconds, process_cpu_seconds


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


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)


def test_cpu_between_marks_sums_each_group_and_leaves_out_a_process_gone_at_the_end():
    burn = ("import sys, time\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\n"
            "print('done', flush=True); time.sleep(30)\n")
    burner, idler, leaver = _child(burn), _child("import sys, time\nprint('ready', flush=True); time.sleep(30)\n"), \
        _child("import sys\nprint('ready', flush=True); sys.stdin.readline()\n")
    children = [burner, idler, leaver]
    try:
        for c in children:
            assert c.stdout.readline().strip() == "ready"
        start = cpu_mark({burner.pid: "brokers", idler.pid: "brokers", leaver.pid: "controllers"})
        burner.stdin.write("go\n")
        burner.stdin.flush()
        assert burner.stdout.readline().strip() == "done"
        leaver.stdin.write("bye\n")
        leaver.stdin.flush()
        leaver.wait()
        end = cpu_mark({burner.pid: "brokers", idler.pid: "brokers", leaver.pid: "controllers"})
        used, busy = cpu_between(start, end)
        # The burner's 0.3 s, and the sleeper's next to nothing, in one group.
        assert 0.3 <= used["brokers"] < 0.45, used
        # The process that exited has no end mark: its group is not reported.
        assert "controllers" not in used
        # The burner kept one of the machine's CPUs busy for most of the interval.
        assert 0.2 / os.cpu_count() < busy <= 1.0, busy
        assert end.at - start.at >= 0.3
    finally:
        for c in children:
            c.kill()
            c.wait()
