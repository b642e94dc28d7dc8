"""Kafka load generators: confluent-kafka producers and consumers in worker processes.

Theory of operation
-------------------
One Python process drives one librdkafka client at most as fast as one
core lets it, so a bench runs `workers` processes (multiprocessing,
*spawn*: no state inherited from the parent). `run_workers` starts them,
waits until every one has connected (imports and client set-up are not
measured), then releases them all at once and shows their progress from
shared counters. Each worker returns a plain dict: how many records, its
own start and end (CLOCK_MONOTONIC, comparable across processes), its
CPU seconds, and its latency samples.

- **produce_worker**: produces `record_size`-byte values (random,
  incompressible) with no key, for `duration_s` or `count` records; with
  `rate`, at that many records/s (record i due i/rate after the release),
  its sampled latencies then timed from when each record was due. Every
  record's delivery report is counted (one Python callback each, also in
  the ceiling runs, so both sides pay it); every `sample_every`-th record
  also records its latency, from `produce()` to its delivery report. The
  producer polls every 100 records, so a latency includes up to 100
  `produce()` calls of delay. With `commit_interval_ms` (and a
  `transactional.id` in its config) the producer is transactional: it
  `init_transactions()` before the release, begins a transaction, and
  commits it every `commit_interval_ms` (checked at each poll) and at the
  end; each `commit_transaction()`'s duration is kept (`commit_ms`), and
  for each sampled record the time from `produce()` to the end of the
  commit that made it visible to read_committed consumers (`visible_ms`).
  With `warm_up`, one record (committed, if transactional) is produced
  before the release and not counted.
- **consume_worker**: creates its consumer before the release, then
  `assign()`s its partitions from the beginning (after the release:
  librdkafka fetches ahead as soon as partitions are assigned) and
  consumes until it has `count` records (or `timeout_s` passes).
- **e2e_consume_worker**: one consumer of an OMB subscription, run beside
  producers whose values are stamped (`stamp`: the first 8 bytes carry
  when the record was due, at a fixed rate, or sent); it reads from the
  partitions' ends at the release and keeps each record's end-to-end
  latency (receipt minus stamp) and receipt time. `omb_worker` runs either
  role, so producers and consumers are released together.

With `mock=True` a producer talks to librdkafka's own in-process mock
cluster (`test.mock.num.brokers=1`) instead of a broker: the client's
ceiling on this machine, with the mock broker's work in the same process
(so a lower bound of the real ceiling).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import struct
import time
from collections.abc import Callable
from typing import Any

#: Longest wait for a delivery report while librdkafka's queue is full.
QUEUE_FULL_WAIT_S = 0.05
#: Bytes of a stamped value that carry its send time (a little-endian double).
STAMP_BYTES = 8
POLL_EVERY = 100
READY_TIMEOUT_S = 60.0


def _cpu_seconds() -> float:
    # This process's user + system time over all its threads (librdkafka's
    # too), as os.times() counts it, but to the nanosecond, not in 10 ms
    # ticks: a short phase's figure per record must not round to 0.
    return time.process_time()


def produce_worker(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    from confluent_kafka import KafkaException, Producer

    sent = [0, 0]  # acked, failed
    errors: list[str] = []
    latencies_ms: list[float] = []
    latency_at: list[float] = []  # when each sampled latency ended (monotonic clock, as the parent's)
    last_ack = [0.0]

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            sent[0] += 1
            last_ack[0] = time.monotonic()
        else:
            sent[1] += 1
            if len(errors) < 5:
                errors.append(str(err))

    def sampled(t0: float) -> Callable[[Any, Any], None]:
        def on_sampled_delivery(err: Any, msg: Any) -> None:
            on_delivery(err, msg)
            if err is None:
                now = time.perf_counter()
                latencies_ms.append((now - t0) * 1000)
                latency_at.append(now)
        return on_sampled_delivery

    config = {**spec["config"], "on_delivery": on_delivery}
    if spec.get("mock"):
        config = {**config, "test.mock.num.brokers": 1, "log_level": 3}
    producer = Producer(config)
    topic = spec["topic"]
    try:
        producer.list_topics(topic, timeout=30)  # connect (and, on a mock cluster, create the topic)
    except KafkaException as exc:
        results.put({"error": f"cannot reach the cluster: {exc}"})
        return
    interval_s = spec["commit_interval_ms"] / 1000 if spec.get("commit_interval_ms") else None
    if interval_s is not None:
        producer.init_transactions(60)
    perf_counter = time.perf_counter
    commit_ms: list[float] = []
    visible_ms: list[float] = []
    in_txn: list[float] = []  # produce() times of the sampled records of the open transaction

    def commit() -> None:
        c0 = perf_counter()
        producer.commit_transaction(60)
        done = perf_counter()
        commit_ms.append((done - c0) * 1000)
        visible_ms.extend((done - t) * 1000 for t in in_txn)
        in_txn.clear()

    value = os.urandom(spec["record_size"])
    # With `stamp`, each value starts with when the record was due (fixed rate) or sent, as a
    # monotonic time (one clock for every process of this machine): the consumers' end-to-end
    # latency starts there, as OMB's does from the record's publish time.
    stamp = bool(spec.get("stamp"))
    pack, tail = struct.Struct("<d").pack, value[STAMP_BYTES:]
    if spec.get("warm_up"):
        # One record before the release, not counted: the producer id (and
        # the transaction's partitions and coordinator) are then known, so
        # the measured phase does not start with their round trips.
        if interval_s is not None:
            producer.begin_transaction()
        producer.produce(topic, value)
        producer.flush(60)
        if interval_s is not None:
            producer.commit_transaction(60)
        sent[:] = [0, 0]
        latencies_ms.clear()
        latency_at.clear()
    count = spec.get("count")
    duration_s = spec.get("duration_s")
    sample_every = spec["sample_every"]
    ready.put(os.getpid())
    start.wait()
    cpu0, t0 = _cpu_seconds(), time.monotonic()
    deadline = t0 + duration_s if duration_s else float("inf")
    produce, poll = producer.produce, producer.poll
    if interval_s is not None:
        producer.begin_transaction()
        next_commit = time.monotonic() + interval_s
    # With a rate (records/s of this producer), record i is due at t0 + i/rate.
    rate = spec.get("rate") or 0.0
    i = 0
    while (count is None or i < count) and (i % POLL_EVERY or time.monotonic() < deadline):
        if rate:
            due = t0 + i / rate
            wait = due - time.monotonic()
            if wait > 0:
                # Serves delivery reports while it waits; may return early, so check again.
                poll(min(wait, QUEUE_FULL_WAIT_S))
                continue
        if stamp:
            value = pack(due if rate else perf_counter()) + tail
        try:
            if i % sample_every == 0:
                # At a fixed rate a sampled latency starts when the record was due, not when
                # it was sent: a producer that fell behind its schedule is not hidden
                # (coordinated omission corrected; monotonic and perf_counter are one clock).
                now = due if rate else perf_counter()
                produce(topic, value, on_delivery=sampled(now))
                if interval_s is not None:
                    in_txn.append(now)
            else:
                produce(topic, value)
        except BufferError:
            # The queue is full (queue.buffering.max.messages): wait for
            # the first delivery report instead of spinning; poll returns
            # as soon as it has served one.
            poll(QUEUE_FULL_WAIT_S)
            continue
        i += 1
        if i % POLL_EVERY == 0:
            poll(0)
            counter.value = sent[0]
            if interval_s is not None and time.monotonic() >= next_commit:
                commit()
                producer.begin_transaction()
                next_commit = time.monotonic() + interval_s
    unsent = producer.flush(60)
    end = max(last_ack[0], t0)
    if interval_s is not None:
        try:
            commit()
        except KafkaException as exc:
            errors.append(f"the last commit: {exc}")
            sent[1] += 1
        end = time.monotonic()  # the records are read_committed-visible only now
    counter.value = sent[0]
    results.put({"pid": os.getpid(), "records": sent[0], "failed": sent[1] + unsent, "errors": errors,
                 "topic": topic, "start": t0, "end": end, "cpu_s": _cpu_seconds() - cpu0,
                 "latencies_ms": latencies_ms, "latency_at": latency_at, "commit_ms": commit_ms,
                 "visible_ms": visible_ms})


def consume_worker(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group_id"],
                         "enable.auto.commit": False, "enable.auto.offset.store": False, **spec["config"]})
    count = spec["count"]
    ready.put(os.getpid())
    start.wait()
    cpu0, t0 = _cpu_seconds(), time.monotonic()
    # Assigned only now: librdkafka starts fetching into its local queue as
    # soon as partitions are assigned, and bytes fetched before the release
    # would be served outside the measured phase.
    consumer.assign([TopicPartition(spec["topic"], p, OFFSET_BEGINNING) for p in spec["partitions"]])
    deadline = t0 + spec["timeout_s"]
    got = 0
    value_bytes = 0
    errors: list[str] = []
    last = t0
    while got < count and time.monotonic() < deadline:
        messages = consumer.consume(num_messages=10000, timeout=0.5)
        for m in messages:
            if m.error() is not None:
                if len(errors) < 5:
                    errors.append(str(m.error()))
                continue
            got += 1
            value_bytes += len(m.value())
        if messages:
            last = time.monotonic()
            counter.value = got
    cpu_s = _cpu_seconds() - cpu0
    consumer.close()
    results.put({"pid": os.getpid(), "records": got, "value_bytes": value_bytes, "errors": errors,
                 "failed": len(errors), "start": t0, "end": last, "cpu_s": cpu_s, "latencies_ms": []})


def e2e_consume_worker(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    """One consumer of a subscription: reads its share of `spec["partitions"]`
    of `spec["topic"]` from their ends at the release (records written
    before are not its), and times each record from the send time stamped
    in its value. After `duration_s` it keeps reading until nothing came for
    `idle_s` (the producers' last records), at most `drain_s` more."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group_id"],
                         "enable.auto.commit": False, "enable.auto.offset.store": False, **spec["config"]})
    topic = spec["topic"]
    # The high watermarks before the release: every record produced in the phase lies above them.
    assignment = []
    for p in spec["partitions"]:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
        assignment.append(TopicPartition(topic, p, high))
    consumer.assign(assignment)
    unpack = struct.Struct("<d").unpack_from
    ready.put(os.getpid())
    start.wait()
    cpu0, t0 = _cpu_seconds(), time.monotonic()
    measured_end = t0 + spec["duration_s"]
    hard_end = measured_end + spec["drain_s"]
    latencies_ms: list[float] = []
    latency_at: list[float] = []
    errors: list[str] = []
    got = 0
    last = t0
    poll, consume = consumer.poll, consumer.consume
    while True:
        # consume() waits for its whole batch or its timeout, which would add up to the timeout to every
        # latency: poll() returns with the first record, then what is already queued is taken at once.
        first = poll(0.1)
        messages = [first, *consume(num_messages=10000, timeout=0)] if first is not None else []
        now = time.monotonic()
        for m in messages:
            if m.error() is not None:
                if len(errors) < 5:
                    errors.append(str(m.error()))
                continue
            got += 1
            latencies_ms.append((now - unpack(m.value())[0]) * 1000)
            latency_at.append(now)
        if messages:
            last = now
        elif now >= measured_end and (now - last >= spec["idle_s"] or now >= hard_end):
            break
    cpu_s = _cpu_seconds() - cpu0
    consumer.close()
    results.put({"pid": os.getpid(), "role": "consume", "subscription": spec["subscription"], "records": got,
                 "errors": errors, "failed": len(errors), "start": t0, "end": last, "cpu_s": cpu_s,
                 "latencies_ms": latencies_ms, "latency_at": latency_at})


def omb_worker(spec: dict[str, Any], ready: Any, start: Any, counter: Any, results: Any) -> None:
    """A producer or (`role: consume`) an end-to-end consumer, so that both run in one release."""
    target = e2e_consume_worker if spec.get("role") == "consume" else produce_worker
    target(spec, ready, start, counter, results)


def run_workers(
    target: Callable[..., None],
    specs: list[dict[str, Any]],
    *,
    on_start: Callable[[], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run one worker process per spec; release them together; their results.

    `on_start()` runs just before the release (e.g. to read the broker's
    CPU time); `on_progress(records)` every 0.1 s with the total so far."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    counters = [ctx.Value("q", 0, lock=False) for _ in specs]
    processes = [ctx.Process(target=target, args=(spec, ready, start, counter, results), daemon=True)
                 for spec, counter in zip(specs, counters)]
    for p in processes:
        p.start()
    out: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = len(processes)
        while waiting:
            try:
                ready.get(timeout=0.2)
                waiting -= 1
            except queue.Empty:
                early = _drain(results)
                failed = [r for r in early if "error" in r]
                if failed:
                    raise RuntimeError(failed[0]["error"])
                out += early
                if time.monotonic() > deadline or not all(p.is_alive() for p in processes):
                    raise RuntimeError("a load generator process did not start; see its output above")
        if on_start is not None:
            on_start()
        start.set()
        while len(out) < len(processes):
            try:
                out.append(results.get(timeout=0.1))
            except queue.Empty:
                if not any(p.is_alive() for p in processes) and results.empty():
                    raise RuntimeError("a load generator process died; see its output above") from None
            if on_progress is not None:
                on_progress(sum(c.value for c in counters))
        if on_progress is not None:
            on_progress(sum(c.value for c in counters))
        for p in processes:
            p.join(10)
        return out
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()


def interval_rates(trace: list[tuple[float, int]], interval_s: float = 1.0) -> list[tuple[float, float]]:
    """Per-interval rates from a progress trace of `(monotonic time, total
    so far)`: `(end of interval, seconds after the first point; records/s
    in it)`, one point per whole `interval_s` (a last partial interval is
    dropped: its rate would rest on a fraction of the time)."""
    if len(trace) < 2:
        return []
    t_start, n_start = trace[0]
    out, edge, last_n = [], t_start + interval_s, n_start
    for t, n in trace[1:]:
        while t >= edge:
            out.append((edge - t_start, (n - last_n) / interval_s))
            last_n, edge = n, edge + interval_s
    return out


def interval_percentiles(start: float, at: list[float], values: list[float], ps: tuple[float, ...] = (50.0, 99.0),
                         interval_s: float = 1.0) -> dict[float, list[tuple[float, float]]]:
    """Per-interval nearest-rank percentiles of samples that ended at `at`
    (monotonic times; `start` is the interval clock's zero): for each p,
    `(end of interval, value)` for every interval holding samples."""
    from bench.histogram import percentiles as exact

    bins: dict[int, list[float]] = {}
    for t, v in zip(at, values):
        if t >= start:
            bins.setdefault(int((t - start) // interval_s), []).append(v)
    out: dict[float, list[tuple[float, float]]] = {p: [] for p in ps}
    for i in sorted(bins):
        summary = exact(bins[i], ps)
        for p in ps:
            out[p].append(((i + 1) * interval_s, summary[f"p{p:g}".replace(".", "_")]))
    return out


def _drain(q: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the workers: records, failures, the wall-clock span, CPU."""
    start = min(r["start"] for r in results)
    end = max(r["end"] for r in results)
    return {
        "records": sum(r["records"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "errors": [e for r in results for e in r["errors"]][:5],
        "elapsed_s": max(end - start, 1e-9),
        "cpu_s": sum(r["cpu_s"] for r in results),
        "latencies_ms": [x for r in results for x in r["latencies_ms"]],
        "latency_at": [x for r in results for x in r.get("latency_at", ())],
        "commit_ms": [x for r in results for x in r.get("commit_ms", ())],
        "visible_ms": [x for r in results for x in r.get("visible_ms", ())],
    }
