"""`raftka chaos`: a Jepsen-style harness for a local raftka cluster.

- `history`: the history file, one JSON line per event.
- `checker`: pure; reads a history, finds lost writes, duplicates,
  inconsistent offsets, non-monotonic sends and polls, skips, phantom reads,
  replica divergence, leader epochs going back, node crashes.
- `txn_check`: pure; the transactional checks (aborted and intermediate reads,
  lost committed transactions, transactions seen in part).
- `schedule`: pure; the seeded nemesis schedule.
- `nemesis`: the faults (kill, pause, partition, disk, clock) applied to real processes.
- `workload`: the `queue` workload with confluent-kafka producers and consumers,
  and the final reads (confluent-kafka and kafka-python).
- `txn_workload`: the `txn` workload: transactional producers, read_committed consumers.
- `on_disk`: the replicas as the brokers left them (producer epochs, agreement).
- `safety`: metadata safety from the controllers' logs and metadata logs.
- `report`: report.json, report.md and the plot.
- `run`: one run, end to end.

It sits above `cluster` (it starts a LocalCluster) and below the command line.
"""
