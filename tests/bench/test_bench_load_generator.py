"""The consume bench's load generator serves nothing outside the measured phase."""

import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "broker"))

from broker_testing import BrokerThread  # noqa: E402

from bench.load_generator import consume_worker  # noqa: E402

RECORDS = 2000


def test_a_consumer_fetches_nothing_before_it_is_released(tmp_path):
    from confluent_kafka import Producer

    with BrokerThread(tmp_path, topics={"t": 2}) as bt:
        producer = Producer({"bootstrap.servers": bt.bootstrap, "linger.ms": 5})
        for i in range(RECORDS):
            producer.produce("t", b"x" * 100, partition=i % 2)
        assert producer.flush(30) == 0
        del producer  # its threads would keep reconnecting after the broker stops
        stats = bt.running.broker.server.stats

        def served() -> int:
            return stats.sendfile_bytes + stats.pread_bytes

        ctx = multiprocessing.get_context("spawn")
        ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
        spec = {"bootstrap": bt.bootstrap, "topic": "t", "partitions": [0, 1], "group_id": "g", "count": RECORDS,
                "timeout_s": 60, "config": {"fetch.queue.backoff.ms": 10}}
        worker = ctx.Process(target=consume_worker, args=(spec, ready, start, ctx.Value("q", 0, lock=False), results),
                             daemon=True)
        worker.start()
        try:
            ready.get(timeout=60)
            # Ready means connected: librdkafka would prefetch now if the
            # partitions were assigned, outside the bench's measured phase.
            time.sleep(1.0)
            assert served() == 0
            start.set()
            result = results.get(timeout=60)
            assert result["records"] == RECORDS and not result["errors"]
            assert served() >= RECORDS * 100
        finally:
            worker.kill()
            worker.join()
