"""A broker on 127.0.0.1 with the in-process controller, for tests.

`start_broker(nursery, data_dir)` serves a real `Broker` on a free port,
registers it through `LocalController` (the real controller decisions),
and returns a `RunningBroker`. Blocking Kafka clients run in threads
(`trio.to_thread.run_sync`) so the broker keeps serving.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools

import trio
from kio.schema.create_topics.v7 import request as ct_req
from kio.schema.errors import ErrorCode

from broker import Broker, BrokerConfig, LocalController

CLUSTER_ID = "raftka-test-cluster-0001"


@dataclasses.dataclass
class RunningBroker:
    broker: Broker
    controller: LocalController
    port: int
    cancel_scope: trio.CancelScope

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def create_topic(self, name: str, partitions: int = 1, configs: dict | None = None) -> None:
        response = await self.controller.send(ct_req.CreateTopicsRequest(
            topics=(ct_req.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=1, assignments=(),
                configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items())),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        (result,) = response.topics
        assert result.error_code == ErrorCode.none, result

    def stop(self) -> None:
        self.cancel_scope.cancel()


async def start_broker(nursery: trio.Nursery, data_dir, *, node_id: int = 1, publish_lag_s: float = 0.0,
                       **config) -> RunningBroker:
    controller = LocalController(cluster_id=CLUSTER_ID, publish_lag_s=publish_lag_s,
                                 nursery=nursery if publish_lag_s else None)
    broker_config = BrokerConfig(node_id=node_id, log_dirs=(str(data_dir),), cluster_id=CLUSTER_ID, port=0,
                                 **config)
    broker = Broker(broker_config, controller)
    controller.subscribe(broker.on_metadata_update)
    scope = trio.CancelScope()

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await broker.run(task_status=task_status)

    server = await nursery.start(run)
    broker.on_metadata_update(controller.image)
    await controller.register_broker(node_id, "127.0.0.1", server.port)
    if publish_lag_s:
        await broker.wait_for_image(lambda image: image.is_usable(node_id), trio.current_time() + 5)
    return RunningBroker(broker, controller, server.port, scope)


def in_thread(fn, *args, **kwargs):
    """Run a blocking client call in a worker thread."""
    return trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


# --- workload shared by the client tests ----------------------------------

N_RECORDS = 10_000
BASE_TIMESTAMP_MS = 1_700_000_000_000


@dataclasses.dataclass(frozen=True)
class Produced:
    seq: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


@dataclasses.dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


def workload(n: int = N_RECORDS, value_bytes: int = 20) -> list[Produced]:
    """Keyed records with headers and distinct, increasing timestamps."""
    out = []
    for i in range(n):
        value = (b"value-%06d-" % i).ljust(value_bytes, b"x")
        headers = (("seq", str(i).encode()), ("origin", b"raftka-test"))
        out.append(Produced(i, b"key-%d" % (i % 101), value, headers, BASE_TIMESTAMP_MS + i))
    return out


def check_round_trip(produced: list[Produced], consumed: list[Consumed], partitions: int) -> dict[int, list[Consumed]]:
    """Every produced record came back once, intact; offsets per partition
    are contiguous from 0 and follow produce order. Returns records by partition."""
    by_partition: dict[int, list[Consumed]] = {p: [] for p in range(partitions)}
    for c in consumed:
        by_partition[c.partition].append(c)
    seen = set()
    for partition, records in by_partition.items():
        records.sort(key=lambda c: c.offset)
        assert [c.offset for c in records] == list(range(len(records))), f"partition {partition} offsets"
        seqs = [int(dict(c.headers)["seq"]) for c in records]
        assert seqs == sorted(seqs), f"partition {partition}: records out of produce order"
        for c, seq in zip(records, seqs):
            p = produced[seq]
            assert (c.key, c.value, c.headers, c.timestamp_ms) == (p.key, p.value, p.headers, p.timestamp_ms)
            seen.add(seq)
    assert len(consumed) == len(produced) and seen == set(range(len(produced)))
    return by_partition


def expected_offset_for_time(records: list[Consumed], timestamp_ms: int) -> int | None:
    """The offset ListOffsets(timestamp) must answer for one partition's records."""
    for c in records:
        if c.timestamp_ms >= timestamp_ms:
            return c.offset
    return None
