"""`raftka chaos`: a Jepsen-style harness for a local raftka cluster.

- `history`: the history file, one JSON line per event.
- `checker`: pure; reads a history, finds lost writes, duplicates,
  inconsistent offsets, non-monotonic sends and polls, skips.
- `schedule`: pure; the seeded nemesis schedule.
- `nemesis`: the faults (kill, pause, partition) applied to real processes.
- `workload`: the `queue` workload with confluent-kafka producers and consumers.
- `safety`: metadata safety from the controllers' logs after the run.
- `run`: one run, end to end, and its report.

It sits above `cluster` (it starts a LocalCluster) and below the command line.
"""
