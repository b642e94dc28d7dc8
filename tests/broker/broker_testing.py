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

from broker import Broker, BrokerConfig
from local_controller import LocalController

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

    async def create_topic(self, name: str, partitions: int = 1, configs: dict | None = None,
                           assignments: list[tuple[int, ...]] | None = None) -> None:
        """Create a topic through the controller (like another broker's client would)."""
        replica_assignments = tuple(ct_req.CreatableReplicaAssignment(partition_index=i, broker_ids=brokers)
                                    for i, brokers in enumerate(assignments or ()))
        response = await self.controller.send(ct_req.CreateTopicsRequest(
            topics=(ct_req.CreatableTopic(
                name=name, num_partitions=-1 if assignments else partitions,
                replication_factor=-1 if assignments else 1, assignments=replica_assignments,
                configs=tuple(ct_req.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items())),),
            timeout=datetime.timedelta(seconds=5), validate_only=False))
        (result,) = response.topics
        assert result.error_code == ErrorCode.none, result

    async def connect(self, nursery: trio.Nursery):
        """A raw Kafka-protocol connection to the broker (common.wire client)."""
        from common.wire import connect
        return await connect(nursery, "127.0.0.1", self.port)

    def partition(self, topic: str, partition: int = 0):
        return self.broker.replicas.partitions[(topic, partition)]

    def stop(self) -> None:
        self.cancel_scope.cancel()


async def start_broker(nursery: trio.Nursery, data_dir, *, node_id: int = 1, publish_lag_s: float = 0.0,
                       controller_config=None, **config) -> RunningBroker:
    """A broker on loopback with a `LocalController` (`controller_config`:
    its settings, a `quorum.controller.ControllerConfig`)."""
    controller = LocalController(cluster_id=CLUSTER_ID, publish_lag_s=publish_lag_s, config=controller_config,
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
    await controller.register_broker(node_id, "127.0.0.1", server.port, rack=broker_config.rack)
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


# --- raw protocol requests (kio entities) ----------------------------------

def produce_request(topic: str, partition: int, records, *, acks: int = 1, timeout_ms: int = 5000):
    from kio.schema.produce.v9 import request as pr
    return pr.ProduceRequest(transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
                             topic_data=(pr.TopicProduceData(name=topic, partition_data=(
                                 pr.PartitionProduceData(index=partition, records=records),)),))


def fetch_request(partitions, *, max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 50 << 20,
                  replica_id: int = -1, isolation_level: int = 0, session_id: int = 0, session_epoch: int = -1):
    """`partitions`: [(topic, partition, fetch_offset, partition_max_bytes, current_leader_epoch)]."""
    from kio.schema.fetch.v12 import request as fr
    topics: dict[str, list] = {}
    for topic, partition, offset, partition_max_bytes, epoch in partitions:
        topics.setdefault(topic, []).append(fr.FetchPartition(
            partition=partition, current_leader_epoch=epoch, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=partition_max_bytes))
    return fr.FetchRequest(replica_id=replica_id, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                           min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=isolation_level,
                           session_id=session_id, session_epoch=session_epoch,
                           topics=tuple(fr.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
                           forgotten_topics_data=(), rack_id="")


def list_offsets_request(topic: str, partition: int, timestamp: int, *, current_leader_epoch: int = -1,
                         isolation_level: int = 0):
    from kio.schema.list_offsets.v7 import request as lr
    return lr.ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=(lr.ListOffsetsTopic(
        name=topic, partitions=(lr.ListOffsetsPartition(partition_index=partition,
                                                        current_leader_epoch=current_leader_epoch,
                                                        timestamp=timestamp),)),))


def batch(n: int = 1, *, base_timestamp: int = BASE_TIMESTAMP_MS, value_bytes: int = 10) -> bytes:
    from storage.batch import build_batch
    return build_batch([(b"k%d" % i, b"v" * value_bytes, (), base_timestamp + i) for i in range(n)])


def only_partition(response):
    """The single partition result of a Produce/Fetch/ListOffsets response."""
    (topic,) = response.responses if hasattr(response, "responses") else response.topics
    parts = getattr(topic, "partition_responses", None) or topic.partitions
    (partition,) = parts
    return partition


# --- a broker on its own trio thread, for synchronous tests ----------------

class BrokerThread:
    """A broker (with LocalController) served by `trio.run` in a thread.
    Use as a context manager; `topics` are created before it is ready."""

    def __init__(self, data_dir, topics: dict[str, int] | None = None, **config) -> None:
        self.data_dir = data_dir
        self.topics = topics or {}
        self.config = config
        self.running: RunningBroker | None = None
        self._ready = None
        self._token = None
        self._thread = None
        self._error: BaseException | None = None

    def __enter__(self) -> "BrokerThread":
        import threading
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "broker thread did not start"
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # surfaced by __enter__/__exit__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.running = await start_broker(nursery, self.data_dir, **self.config)
            for name, partitions in self.topics.items():
                await self.running.create_topic(name, partitions)
            self.cancel_scope = nursery.cancel_scope
            self._ready.set()

    def call(self, fn, *args):
        """Run `fn(*args)` on the broker's trio thread (sync function)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def bootstrap(self) -> str:
        return self.running.bootstrap

    def __exit__(self, *exc) -> None:
        self.call(self.cancel_scope.cancel)
        self._thread.join(30)
        if self._error is not None:
            raise self._error
