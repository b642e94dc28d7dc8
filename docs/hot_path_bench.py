"""Micro-bench of the broker's hot path: raw Produce and Fetch requests.

Starts a `LocalCluster` (one controller, one broker, separate processes),
creates a topic of `--partitions`, measures the idle broker's CPU, then
runs these phases (`--phases`), each `--reps` times:

- **produce**: over one raw TCP connection (no Kafka client, so the load
  generator costs almost nothing), `--requests` Produce v9 requests
  (acks=1), each one partition (round robin) with one prebuilt v2 batch of
  about `--batch-bytes` bytes of 100-byte records, as librdkafka's batching
  makes, with up to `--in-flight` requests outstanding;
- **fetch**: Fetch v12 requests reading every partition from offset 0 to
  its end, one partition and one request at a time, `--fetch-bytes` each;
- **consumer**: `raftka bench consume`'s librdkafka consumer processes
  (`--consumers`) reading the whole topic, with the bench's
  `fetch.queue.backoff.ms=10`.

Each phase reports the broker's CPU (utime+stime from /proc, less its idle
CPU over the phase's wall time) per request and per GB (appended: the
growth of the segment files; served: the record bytes the fetches
returned, or the topic's segment bytes for the consumers); the median of
the reps is printed last. See docs/performance.md. Usage:

    .venv/bin/python docs/hot_path_bench.py --batch-bytes 16384 --requests 6000 --reps 3
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kafka_bench import create_topic  # noqa: E402
from bench.proc_stats import log_bytes, process_cpu_seconds  # noqa: E402
from raftka.varint import uvarint  # noqa: E402
from storage.batch import build_batch, iter_batch_headers  # noqa: E402

TOPIC = "hot-path"
GB = 1e9


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def compact_string(s: str) -> bytes:
    raw = s.encode()
    return uvarint(len(raw) + 1) + raw


def request_header(api_key: int, version: int, correlation_id: int) -> bytes:
    client_id = b"hot-path-bench"
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + b"\x00"


def produce_request(correlation_id: int, batch: bytes, partition: int = 0) -> bytes:
    body = (b"\x00" + struct.pack(">hi", 1, 30000) + uvarint(2) + compact_string(TOPIC) + uvarint(2)
            + struct.pack(">i", partition) + uvarint(len(batch) + 1) + batch + b"\x00" + b"\x00" + b"\x00")
    frame = request_header(0, 9, correlation_id) + body
    return struct.pack(">i", len(frame)) + frame


def fetch_request(correlation_id: int, partition: int, offset: int, partition_max_bytes: int) -> bytes:
    body = (struct.pack(">iiiibii", -1, 500, 1, 52428800, 0, 0, -1) + uvarint(2) + compact_string(TOPIC)
            + uvarint(2) + struct.pack(">iiqiqi", partition, -1, offset, -1, -1, partition_max_bytes) + b"\x00"
            + b"\x00" + uvarint(1) + uvarint(1) + b"\x00")
    frame = request_header(1, 12, correlation_id) + body
    return struct.pack(">i", len(frame)) + frame


class Frames:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def next(self) -> memoryview:
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack_from(">i", self.buf, 0)
                if len(self.buf) >= 4 + size:
                    frame = bytes(self.buf[4:4 + size])
                    del self.buf[:4 + size]
                    return memoryview(frame)
            data = self.sock.recv(4 << 20)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.buf += data


def produce_error(frame: memoryview) -> int:
    # correlation id, tags, topics(1), name, partitions(1), index, error
    pos = 5
    _, pos = read_uvarint(frame, pos)
    n, pos = read_uvarint(frame, pos)
    pos += n - 1
    _, pos = read_uvarint(frame, pos)
    (error,) = struct.unpack_from(">h", frame, pos + 4)
    return error


def fetch_records(frame: memoryview) -> memoryview:
    pos = 5 + 4 + 2 + 4
    _, pos = read_uvarint(frame, pos)
    n, pos = read_uvarint(frame, pos)
    pos += n - 1
    _, pos = read_uvarint(frame, pos)
    _index, error, _hw, _lso, _start = struct.unpack_from(">ihqqq", frame, pos)
    assert error == 0, f"fetch error {error}"
    pos += 4 + 2 + 24
    n, pos = read_uvarint(frame, pos)  # aborted transactions (null: 0)
    assert n == 0
    pos += 4  # preferred read replica
    n, pos = read_uvarint(frame, pos)
    return frame[pos:pos + max(n - 1, 0)]


def run_produce(sock: socket.socket, frames: Frames, batch: bytes, requests: int, in_flight: int,
                partitions: int) -> None:
    templates = [bytearray(produce_request(0, batch, p)) for p in range(partitions)]
    sent = answered = 0
    while answered < requests:
        burst = []
        while sent < requests and sent - answered < in_flight:
            request = templates[sent % partitions]
            struct.pack_into(">i", request, 8, sent)
            burst.append(bytes(request))
            sent += 1
        if burst:
            sock.sendall(b"".join(burst))
        frame = frames.next()
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        assert correlation_id == answered, (correlation_id, answered)
        if answered == 0 or answered == requests - 1:
            assert produce_error(frame) == 0, f"produce error {produce_error(frame)}"
        answered += 1


def run_fetch(sock: socket.socket, frames: Frames, partition: int, end_offset: int,
              partition_max_bytes: int) -> tuple[int, int]:
    offset = 0
    served = requests = 0
    while offset < end_offset:
        sock.sendall(fetch_request(requests, partition, offset, partition_max_bytes))
        records = fetch_records(frames.next())
        requests += 1
        served += records.nbytes
        for _pos, header in iter_batch_headers(records):
            offset = header.next_offset
    return served, requests


def run_consumers(bootstrap: str, partitions: int, per_partition: int, consumers: int, meter: "Meter") -> None:
    """`raftka bench consume`'s consumer processes, reading the topic from the start."""
    import uuid

    from bench.load_generator import aggregate, consume_worker, run_workers

    group = f"hot-path-{uuid.uuid4().hex[:8]}"
    specs = []
    for i in range(consumers):
        mine = list(range(i, partitions, consumers))
        specs.append({"bootstrap": bootstrap, "topic": TOPIC, "partitions": mine, "group_id": group,
                      "count": per_partition * len(mine), "timeout_s": 300,
                      "config": {"fetch.queue.backoff.ms": 10}})
    result = aggregate(run_workers(consume_worker, specs, on_start=meter.start))
    assert result["records"] == per_partition * partitions, result


class Meter:
    """Broker CPU over a phase, less what it burns idle in that time."""

    def __init__(self, pid: int, idle_cores: float = 0.0) -> None:
        self.pid, self.idle_cores = pid, idle_cores

    def start(self) -> None:
        self.cpu0, self.t0 = process_cpu_seconds(self.pid), time.monotonic()

    def stop(self) -> None:
        self.wall_s = time.monotonic() - self.t0
        self.cpu_s = process_cpu_seconds(self.pid) - self.cpu0 - self.idle_cores * self.wall_s

    def __enter__(self) -> "Meter":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def report(name: str, rep: int, meter: Meter, requests: int, nbytes: int, rows: list) -> None:
    per_request = meter.cpu_s / requests * 1e6 if requests else float("nan")
    rows.append((per_request, meter.cpu_s / (nbytes / GB), nbytes / meter.wall_s / 1e6))
    print(f"{name} rep {rep}: {per_request:.0f} µs/request, {rows[-1][1]:.2f} CPU-s/GB, {rows[-1][2]:.0f} MB/s "
          f"({requests or '?'} requests, {nbytes / 1e6:.0f} MB)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-bytes", type=int, default=16384)
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--in-flight", type=int, default=5, help="librdkafka's max.in.flight is 5 (idempotent)")
    p.add_argument("--fetch-bytes", type=int, default=1048576)
    p.add_argument("--fetch-passes", type=int, default=2, help="reads of every partition per fetch rep")
    p.add_argument("--consumers", type=int, default=2, help="consumer processes of the consumer phase")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--phases", default="produce,fetch,consumer")
    p.add_argument("--idle-s", type=float, default=2.0, help="seconds to measure the idle broker's CPU")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    from raftka.cluster import LocalCluster
    from raftka.cluster_cli import parse_overrides

    phases = args.phases.split(",")
    args.requests += -args.requests % args.partitions  # every partition gets as many
    records = [(None, bytes(100), (), 1_700_000_000_000)] * max(1, args.batch_bytes // 110)
    batch = build_batch(records)
    rows: dict[str, list] = {phase: [] for phase in phases}
    with tempfile.TemporaryDirectory(prefix="raftka-hot-path-") as tmp:
        cluster = LocalCluster(tmp, controllers=1, brokers=1, overrides=parse_overrides(args.set))
        with cluster:
            cluster.start_all()
            cluster.wait_ready(120)
            create_topic(cluster.bootstrap, TOPIC, args.partitions, 1)
            broker = cluster.brokers[0]
            host, port = broker.address.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            frames = Frames(sock)
            run_produce(sock, frames, batch, 10 * args.partitions, args.in_flight, args.partitions)  # warm up
            print("idle phase", flush=True)
            with Meter(broker.pid) as idle:
                time.sleep(args.idle_s)
            idle_cores = idle.cpu_s / idle.wall_s
            print(f"broker idle: {idle_cores * 1000:.1f} ms CPU per s", flush=True)
            produced = 10 * args.partitions
            fill = "produce" not in phases
            if "produce" in phases or fill:
                print("produce phase", flush=True)
            for rep in range(1 if fill else args.reps):
                log0 = log_bytes(str(broker.log_dir), TOPIC)
                with Meter(broker.pid, idle_cores) as m:
                    run_produce(sock, frames, batch, args.requests, args.in_flight, args.partitions)
                produced += args.requests
                if not fill:
                    report("produce", rep, m, args.requests, log_bytes(str(broker.log_dir), TOPIC) - log0,
                           rows["produce"])
            per_partition = produced // args.partitions * len(records)
            if "fetch" in phases:
                print("fetch phase", flush=True)
                for rep in range(args.reps):
                    served = requests = 0
                    with Meter(broker.pid, idle_cores) as m:
                        for _ in range(args.fetch_passes):
                            for partition in range(args.partitions):
                                n, k = run_fetch(sock, frames, partition, per_partition, args.fetch_bytes)
                                served, requests = served + n, requests + k
                    report("fetch", rep, m, requests, served, rows["fetch"])
            if "consumer" in phases:
                print("consumer phase", flush=True)
                topic_bytes = log_bytes(str(broker.log_dir), TOPIC)
                for rep in range(args.reps):
                    m = Meter(broker.pid, idle_cores)
                    run_consumers(cluster.bootstrap, args.partitions, per_partition, args.consumers, m)
                    m.stop()
                    report("consumer", rep, m, 0, topic_bytes, rows["consumer"])
            sock.close()
    for name, phase_rows in rows.items():
        if phase_rows:
            us, per_gb, mb_s = (statistics.median(r[i] for r in phase_rows) for i in range(3))
            print(f"median {name}: {us:.0f} µs/request, {per_gb:.2f} CPU-s/GB, {mb_s:.0f} MB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
