"""A parked acks=all Produce on a real broker, over a socket: it is answered
when its outcome is decided and not before (Kafka's DelayedProduce).

Broker 1 leads partition 0 of "t" (replicas 1 and 2, `min.insync.replicas`
2); follower 2 is registered but has no process: the test fetches as
broker 2 by hand, and changes the ISR and the leader through the metadata
log as the controller would.
"""

from __future__ import annotations

import datetime

import trio
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fr
from kio.schema.produce.v9 import request as pr

from broker_testing import batch, only_partition, produce_request, start_broker
from quorum.metadata.records import PartitionChangeRecord

TOPIC = "t"


def follower_fetch(offset: int, partition: int = 0):
    """Follower 2's Fetch of `partition` from `offset` (a full fetch, no session)."""
    return fr.FetchRequest(
        replica_id=2, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=50 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=(), rack_id="",
        topics=(fr.FetchTopic(topic=TOPIC, partitions=(fr.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20),)),))


def acks_all_request(*batches: tuple[int, int]):
    """An acks=all Produce to TOPIC of one batch per (partition, record count), in order."""
    return pr.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(pr.TopicProduceData(name=TOPIC, partition_data=tuple(
            pr.PartitionProduceData(index=partition, records=batch(count)) for partition, count in batches)),))


async def replicated_broker(nursery, tmp_path, partitions: int = 1):
    """Broker 1 leading `partitions` partitions of TOPIC (replicas 1 and 2, min.insync.replicas 2)."""
    rb = await start_broker(nursery, tmp_path)
    await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic(TOPIC, assignments=[(1, 2)] * partitions, configs={"min.insync.replicas": "2"})
    return rb


async def acknowledge(rb, follower, partition: int, log_end: int) -> None:
    """Follower 2 copies `partition` from offset 0, then fetches at
    `log_end`, which moves the leader's HW there."""
    await follower.request(follower_fetch(0, partition=partition))
    await follower.request(follower_fetch(log_end, partition=partition))
    await trio.sleep(0.2)
    assert rb.partition(TOPIC, partition).state.leader.high_watermark == log_end


class Parked:
    """An acks=all Produce (one record to partition 0 unless `request` is
    given) sent on its own connection; its answer once it comes."""

    def __init__(self) -> None:
        self.response = None
        self.answered = trio.Event()

    @classmethod
    async def send(cls, rb, nursery, timeout_ms: int = 30_000, request=None) -> Parked:
        parked = cls()
        conn = await rb.connect(nursery)
        if request is None:
            request = produce_request(TOPIC, 0, batch(1), acks=-1, timeout_ms=timeout_ms)

        async def run() -> None:
            parked.response = await conn.request(request)
            parked.answered.set()

        nursery.start_soon(run)
        return parked

    async def answer(self, within_s: float = 5) -> ErrorCode:
        """The error code of a one-partition request."""
        await self.whole_answer(within_s)
        return only_partition(self.response).error_code

    async def whole_answer(self, within_s: float = 5) -> list[tuple[int, ErrorCode, int]]:
        """(partition, error code, base offset) per partition answered, in order."""
        with trio.fail_after(within_s):
            await self.answered.wait()
        (topic,) = self.response.responses
        return [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses]


async def test_a_parked_acks_all_produce_answers_when_its_outcome_is_decided_and_not_before(nursery, tmp_path):
    rb = await replicated_broker(nursery, tmp_path)
    topic_id = rb.controller.image.topic(TOPIC).topic_id
    follower = await rb.connect(nursery)
    other = await rb.connect(nursery)

    # 1. Appends that leave the HW short of it (acks=1 records on another
    # connection, a follower fetch that copies but does not yet acknowledge)
    # do not answer it; the follower's next fetch, which moves the HW past
    # it, does.
    parked = await Parked.send(rb, nursery)
    await trio.sleep(0.1)
    for _ in range(3):
        assert only_partition(await other.request(produce_request(TOPIC, 0, batch(2), acks=1))).error_code \
            == ErrorCode.none
    copied = only_partition(await follower.request(follower_fetch(0)))
    assert copied.error_code == ErrorCode.none and copied.high_watermark == 0
    await trio.sleep(0.2)
    assert not parked.answered.is_set()
    log_end = rb.partition(TOPIC).log.log_end_offset
    assert log_end == 7
    await follower.request(follower_fetch(log_end))
    assert await parked.answer() == ErrorCode.none
    assert rb.partition(TOPIC).state.leader.high_watermark == log_end

    # 2. The ISR shrinking under min.insync.replicas while it waits fails it
    # after its append.
    parked = await Parked.send(rb, nursery)
    await trio.sleep(0.1)
    assert not parked.answered.is_set()
    rb.controller.append([PartitionChangeRecord(topic_id, 0, isr=(1,))])
    assert await parked.answer() == ErrorCode.not_enough_replicas_after_append

    # 3. Nobody acknowledging it: REQUEST_TIMED_OUT after the request's timeout.
    rb.controller.append([PartitionChangeRecord(topic_id, 0, isr=(1, 2))])
    start = trio.current_time()
    parked = await Parked.send(rb, nursery, timeout_ms=300)
    assert await parked.answer() == ErrorCode.request_timed_out
    assert trio.current_time() - start >= 0.3

    # 4. A leadership change while it waits: the new leader may truncate it.
    parked = await Parked.send(rb, nursery)
    await trio.sleep(0.1)
    assert not parked.answered.is_set()
    rb.controller.append([PartitionChangeRecord(topic_id, 0, leader=2)])
    assert await parked.answer() == ErrorCode.not_leader_or_follower


async def test_a_parked_produce_over_two_partitions_answers_once_both_are_acknowledged(nursery, tmp_path):
    # The request is answered only once each partition's HW passed its own
    # batch: partition 0's HW passing first does not answer it.
    rb = await replicated_broker(nursery, tmp_path, partitions=2)
    follower = await rb.connect(nursery)
    parked = await Parked.send(rb, nursery, request=acks_all_request((0, 2), (1, 3)))
    await trio.sleep(0.1)
    await acknowledge(rb, follower, 0, 2)
    assert not parked.answered.is_set(), "answered before partition 1's HW passed its batch"
    await acknowledge(rb, follower, 1, 3)
    assert await parked.whole_answer() == [(0, ErrorCode.none, 0), (1, ErrorCode.none, 0)]


async def test_a_parked_produce_answers_each_partition_with_its_own_outcome_and_leaves_nothing_parked(
        nursery, tmp_path):
    # Partition 0 is acknowledged first; partition 1's ISR then shrinks under
    # min.insync.replicas: one answer carries both outcomes. A partition
    # named twice waits for its later batch. Nothing stays registered.
    rb = await replicated_broker(nursery, tmp_path, partitions=2)
    topic_id = rb.controller.image.topic(TOPIC).topic_id
    follower = await rb.connect(nursery)
    parked = await Parked.send(rb, nursery, request=acks_all_request((0, 2), (1, 1), (0, 3)))
    await trio.sleep(0.1)
    assert rb.partition(TOPIC, 0).log.log_end_offset == 5
    await acknowledge(rb, follower, 0, 2)
    assert not parked.answered.is_set(), "answered before partition 0's second batch was acknowledged"
    await follower.request(follower_fetch(5, partition=0))
    await trio.sleep(0.2)
    assert rb.partition(TOPIC, 0).state.leader.high_watermark == 5
    assert not parked.answered.is_set(), "answered before partition 1's outcome was decided"
    rb.controller.append([PartitionChangeRecord(topic_id, 1, isr=(1,))])
    assert [(index, error) for index, error, _ in await parked.whole_answer()] == [
        (0, ErrorCode.none), (1, ErrorCode.not_enough_replicas_after_append), (0, ErrorCode.none)]
    assert not rb.partition(TOPIC, 0).acks_waiters and not rb.partition(TOPIC, 1).acks_waiters


async def test_a_timed_out_produce_leaves_nothing_parked(nursery, tmp_path):
    rb = await replicated_broker(nursery, tmp_path)
    parked = await Parked.send(rb, nursery, timeout_ms=200)
    await trio.sleep(0.1)
    assert len(rb.partition(TOPIC).acks_waiters) == 1
    assert await parked.answer() == ErrorCode.request_timed_out
    assert not rb.partition(TOPIC).acks_waiters
