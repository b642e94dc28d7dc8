"""Follower fetch sessions (KIP-227) on a real broker, over a socket: a
hand-made follower (broker 2, registered, no process) asks for a session
and fetches incrementally; the leader answers only what changed."""

import datetime

import trio
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fr

from broker_testing import batch, fetch_request, produce_request, start_broker
from storage.batch import iter_batch_headers

TOPIC = "s"


async def three_partitions_led_here(rb) -> None:
    await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic(TOPIC, assignments=[(1, 2)] * 3)


def incremental(session_id: int, epoch: int, positions=(), forgotten=(), max_wait_ms: int = 0,
                leader_epoch: int = -1):
    """An incremental Fetch of follower 2: `positions` [(partition, fetch offset)], `forgotten` [partition];
    `leader_epoch` is both the current leader epoch and the last fetched epoch of each position."""
    return fr.FetchRequest(
        replica_id=2, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=50 << 20,
        isolation_level=0, session_id=session_id, session_epoch=epoch,
        topics=(fr.FetchTopic(topic=TOPIC, partitions=tuple(fr.FetchPartition(
            partition=p, current_leader_epoch=leader_epoch, fetch_offset=offset, last_fetched_epoch=leader_epoch,
            log_start_offset=-1,
            partition_max_bytes=1 << 20) for p, offset in positions)),) if positions else (),
        forgotten_topics_data=(fr.ForgottenTopic(topic=TOPIC, partitions=tuple(forgotten)),) if forgotten else (),
        rack_id="")


def answered(response) -> dict[int, tuple[int, list[int]]]:
    """{partition: (high watermark, base offsets of its batches)} of a Fetch response."""
    out = {}
    for topic in response.responses:
        assert topic.topic == TOPIC
        for p in topic.partitions:
            assert p.error_code == ErrorCode.none, p
            out[p.partition_index] = (p.high_watermark,
                                      [h.base_offset for _, h in iter_batch_headers(bytes(p.records or b""))])
    return out


async def test_an_incremental_fetch_answers_only_partitions_with_something_new(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    for p in range(3):
        await producer.request(produce_request(TOPIC, p, batch(2), acks=1))

    full = await follower.request(fetch_request([(TOPIC, p, 0, 1 << 20, -1) for p in range(3)], replica_id=2,
                                                session_epoch=0))
    session = full.session_id
    assert full.error_code == ErrorCode.none and session != 0, "a follower asking for a session gets one"
    assert answered(full) == {0: (0, [0]), 1: (0, [0]), 2: (0, [0])}

    # The follower now holds 0..1 everywhere: the HWs move, and only that is new.
    caught_up = await follower.request(incremental(session, 1, [(0, 2), (1, 2), (2, 2)]))
    assert (caught_up.error_code, caught_up.session_id) == (ErrorCode.none, session)
    assert answered(caught_up) == {0: (2, []), 1: (2, []), 2: (2, [])}

    # Nothing new: a fetch naming nothing waits out its max wait and names nothing.
    start = trio.current_time()
    idle = await follower.request(incremental(session, 2, max_wait_ms=200))
    assert idle.error_code == ErrorCode.none and answered(idle) == {}
    assert trio.current_time() - start >= 0.15

    # A produce to partition 1 wakes a parked fetch that did not name it.
    answer = {}

    async def parked():
        answer["r"] = await follower.request(incremental(session, 3, max_wait_ms=10_000))

    nursery.start_soon(parked)
    await trio.sleep(0.1)
    assert "r" not in answer
    start = trio.current_time()
    await producer.request(produce_request(TOPIC, 1, batch(3), acks=1))
    with trio.fail_after(5):
        while "r" not in answer:
            await trio.sleep(0.005)
    assert trio.current_time() - start < 2
    assert answered(answer["r"]) == {1: (2, [2])}

    # Not acknowledged by a new position: the same records again.
    again = await follower.request(incremental(session, 4))
    assert answered(again) == {1: (2, [2])}
    confirmed = await follower.request(incremental(session, 5, [(1, 5)]))
    assert answered(confirmed) == {1: (5, [])}


async def test_forgotten_partitions_are_no_longer_answered(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    full = await follower.request(fetch_request([(TOPIC, p, 0, 1 << 20, -1) for p in range(3)], replica_id=2,
                                                session_epoch=0))
    session = full.session_id
    assert answered(full) == {0: (0, []), 1: (0, []), 2: (0, [])}
    forget = await follower.request(incremental(session, 1, forgotten=[0]))
    assert answered(forget) == {}
    await producer.request(produce_request(TOPIC, 0, batch(1), acks=1))
    await producer.request(produce_request(TOPIC, 2, batch(1), acks=1))
    after = await follower.request(incremental(session, 2, max_wait_ms=1000))
    assert answered(after) == {2: (0, [0])}
    # Named again, it is back in the session, answered from the position given.
    back = await follower.request(incremental(session, 3, [(0, 0), (2, 1)]))
    assert answered(back) == {0: (0, [0]), 2: (1, [])}


async def test_session_errors_tell_the_follower_to_start_over(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    follower = await rb.connect(nursery)
    full = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, -1)], replica_id=2, session_epoch=0))
    session = full.session_id
    assert session != 0
    wrong_epoch = await follower.request(incremental(session, 5))
    assert (wrong_epoch.error_code, wrong_epoch.responses) == (ErrorCode.invalid_fetch_session_epoch, ())
    unknown = await follower.request(incremental(session + 1, 1))
    assert (unknown.error_code, unknown.responses) == (ErrorCode.fetch_session_id_not_found, ())
    # The session is still usable at its next epoch ...
    assert (await follower.request(incremental(session, 1))).error_code == ErrorCode.none
    # ... until a new full fetch replaces it.
    renewed = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, -1)], replica_id=2,
                                                   session_id=session, session_epoch=0))
    assert renewed.error_code == ErrorCode.none and renewed.session_id not in (0, session)
    gone = await follower.request(incremental(session, 2))
    assert gone.error_code == ErrorCode.fetch_session_id_not_found


async def test_a_full_cache_makes_no_session_and_full_fetches_still_work(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path, max_incremental_fetch_session_cache_slots=0)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    await producer.request(produce_request(TOPIC, 0, batch(2), acks=1))
    full = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, -1)], replica_id=2, session_epoch=0))
    assert (full.error_code, full.session_id) == (ErrorCode.none, 0)
    assert answered(full) == {0: (0, [0])}


async def test_a_follower_ahead_of_the_leaders_metadata_is_answered_once_the_leader_catches_up(nursery, tmp_path):
    """Not UNKNOWN_LEADER_EPOCH in a session: the leader holds the partition's
    answer until it has applied the election the follower saw; the first
    records after that go out at once."""
    from quorum.metadata import PartitionChangeRecord

    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    follower = await rb.connect(nursery)
    producer = await rb.connect(nursery)
    answer = {}

    async def parked():
        answer["r"] = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, 1)], replica_id=2,
                                                           session_epoch=0, max_wait_ms=10_000))

    nursery.start_soon(parked)
    await trio.sleep(0.2)
    assert "r" not in answer, "answered before the leader knew epoch 1"
    topic_id = rb.broker.image.topic(TOPIC).topic_id
    rb.controller.append([PartitionChangeRecord(topic_id=topic_id, partition=0, leader=1)])  # leader epoch 1
    await producer.request(produce_request(TOPIC, 0, batch(2), acks=1))
    start = trio.current_time()
    with trio.fail_after(5):
        while "r" not in answer:
            await trio.sleep(0.005)
    assert trio.current_time() - start < 2
    assert answer["r"].session_id != 0 and answered(answer["r"]) == {0: (0, [0])}


async def test_a_partition_waiting_for_the_leaders_election_is_not_read_again_until_it_applies(
        nursery, tmp_path, monkeypatch):
    """After a broker fails, a follower names thousands of partitions whose
    election the new leader has not applied yet. Each is read once, then
    left alone until the election's metadata comes -- not read again on
    every fetch of the session while the other partitions replicate --
    and answered as soon as it does."""
    import broker.api.fetch
    from quorum.metadata import PartitionChangeRecord

    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    reads = []
    read_partition = broker.api.fetch._read_partition

    def counted(hp, fp, *args, **kwargs):
        reads.append(fp.partition)
        return read_partition(hp, fp, *args, **kwargs)

    monkeypatch.setattr(broker.api.fetch, "_read_partition", counted)
    full = await follower.request(fetch_request([(TOPIC, p, 0, 1 << 20, 0) for p in range(3)], replica_id=2,
                                                session_epoch=0))
    session = full.session_id
    assert answered(full) == {0: (0, []), 1: (0, []), 2: (0, [])}
    # The follower has seen leader epoch 1 of partition 0; this broker has not.
    ahead = await follower.request(incremental(session, 1, [(0, 0)], leader_epoch=1))
    assert answered(ahead) == {}, "not answered before the leader knows epoch 1"
    assert reads.count(0) == 2, reads

    # Partition 1 replicates: five rounds of a produce and the follower catching up.
    for epoch in range(2, 7):
        await producer.request(produce_request(TOPIC, 1, batch(1), acks=1))
        offset = epoch - 2
        fetched = await follower.request(incremental(session, epoch, [(1, offset)], leader_epoch=0))
        assert answered(fetched)[1][1] == [offset]
    assert reads.count(0) == 2, "the partition waiting for its election was read again: " + repr(reads)

    topic_id = rb.broker.image.topic(TOPIC).topic_id
    rb.controller.append([PartitionChangeRecord(topic_id=topic_id, partition=0, leader=1)])  # leader epoch 1
    with trio.fail_after(5):
        while rb.broker.replicas.partitions[(TOPIC, 0)].state.leader_epoch != 1:
            await trio.sleep(0.005)
    await producer.request(produce_request(TOPIC, 0, batch(2), acks=1))
    after = await follower.request(incremental(session, 7, [(1, 5)], max_wait_ms=5000, leader_epoch=0))
    assert answered(after) == {0: (0, [0]), 1: (5, [])}, "partition 0 is fetched again under its new epoch"


async def test_a_parked_session_partition_is_checked_again_after_a_new_leader_epoch(nursery, tmp_path):
    """A session partition the follower does not name is read again
    without the replication core while the same leadership holds its
    position; a new leader epoch ends that, and the follower's stale epoch
    is answered FENCED_LEADER_EPOCH at once."""
    from quorum.metadata import PartitionChangeRecord

    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)

    await producer.request(produce_request(TOPIC, 0, batch(2), acks=1))
    full = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, 0)], replica_id=2, session_epoch=0))
    session = full.session_id
    assert answered(full) == {0: (0, [0])}
    assert answered(await follower.request(incremental(session, 1, [(0, 2)], leader_epoch=0))) == {0: (2, [])}

    # Same leadership: an append wakes the parked fetch, which reads from the recorded position.
    await producer.request(produce_request(TOPIC, 0, batch(1), acks=1))
    assert answered(await follower.request(incremental(session, 2, max_wait_ms=5000, leader_epoch=0))) == {0: (2, [2])}
    assert answered(await follower.request(incremental(session, 3, [(0, 3)], leader_epoch=0))) == {0: (3, [])}

    # A new leader epoch (the same leader): the position is checked again, against the new epoch.
    answer = {}

    async def parked():
        answer["r"] = await follower.request(incremental(session, 4, max_wait_ms=10_000))

    nursery.start_soon(parked)
    await trio.sleep(0.1)
    assert "r" not in answer, "answered with nothing new"
    topic_id = rb.broker.image.topic(TOPIC).topic_id
    rb.controller.append([PartitionChangeRecord(topic_id=topic_id, partition=0, leader=1)])
    with trio.fail_after(5):
        while "r" not in answer:
            await trio.sleep(0.005)
    [topic] = answer["r"].responses
    [p] = topic.partitions
    assert (p.partition_index, p.error_code) == (0, ErrorCode.fenced_leader_epoch)


async def test_a_caught_up_follower_outside_the_isr_joins_it_once_eligible_without_moving(nursery, tmp_path):
    """KIP-841 in a session: follower 2 caught up while fenced, so it may not
    join the ISR, and its position no longer changes, so it names the
    partition no more. Its later fetches must still run the leader's ISR
    check (reads that skip the replication core are for ISR members only):
    once 2 is unfenced, the ISR expands."""
    from quorum.metadata.records import BrokerRegistrationChangeRecord, PartitionChangeRecord

    rb = await start_broker(nursery, tmp_path)
    epoch_2 = await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic(TOPIC, assignments=[(1, 2)])
    topic_id = rb.broker.image.topic(TOPIC).topic_id
    rb.controller.append([PartitionChangeRecord(topic_id, 0, isr=(1,)),
                          BrokerRegistrationChangeRecord(2, epoch_2, fenced=True)])
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    await producer.request(produce_request(TOPIC, 0, batch(2), acks=1))
    full = await follower.request(fetch_request([(TOPIC, 0, 0, 1 << 20, -1)], replica_id=2, session_epoch=0))
    session = full.session_id
    assert answered(full)[0][1] == [0]
    await follower.request(incremental(session, 1, [(0, 2)]))  # at the leader's log end
    await trio.sleep(0.2)
    assert rb.controller.image.partition(topic_id, 0).isr == (1,), "a fenced broker joined the ISR"

    rb.controller.append([BrokerRegistrationChangeRecord(2, epoch_2, fenced=False)])
    epoch = 2
    with trio.fail_after(10):
        while rb.controller.image.partition(topic_id, 0).isr != (1, 2):
            answer = await follower.request(incremental(session, epoch, max_wait_ms=50))
            assert answer.error_code == ErrorCode.none
            epoch += 1


async def test_a_follower_fetching_below_v12_is_served_without_a_session(nursery, tmp_path):
    """Fetch v7-v11 carry no last fetched epoch, which a session keeps: such
    a follower is answered in full, with session id 0 (KIP-227: none made)."""
    from kio.schema.fetch.v11 import request as v11

    rb = await start_broker(nursery, tmp_path)
    await three_partitions_led_here(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    await producer.request(produce_request(TOPIC, 1, batch(2), acks=1))
    request = v11.FetchRequest(
        replica_id=2, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=50 << 20, isolation_level=0,
        session_id=0, session_epoch=0,
        topics=(v11.FetchTopic(topic=TOPIC, partitions=tuple(v11.FetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
            partition_max_bytes=1 << 20) for p in range(3))),),
        forgotten_topics_data=(), rack_id="")
    for _ in range(2):
        response = await follower.request(request)
        assert (response.error_code, response.session_id) == (ErrorCode.none, 0)
        assert answered(response) == {0: (0, []), 1: (0, [0]), 2: (0, [])}
