"""Produce and Fetch over real sockets with raw requests: error codes,
acks, the HW bound, long polls, response size limits, fetch sessions, and
the purgatory woken by a follower's fetch."""

import pytest
import trio
from kio.schema.errors import ErrorCode

from broker.config import BrokerConfig
from quorum.metadata import ConfigRecord, ConfigResourceType, PartitionChangeRecord

from broker_testing import batch, fetch_request, only_partition, produce_request, start_broker
from common.errors import ConfigError
from storage.batch import iter_batch_headers


async def two_replica_topic(rb, name="r2"):
    """A partition led here with ISR [1, 2]; broker 2 is registered but no
    process runs it, so only our hand-made follower fetches move the HW."""
    await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic(name, assignments=[(1, 2)])
    assert rb.partition(name).state.isr == (1, 2)
    return name


def records_of(partition_result) -> list:
    data = bytes(partition_result.records or b"")
    return [h for _, h in iter_batch_headers(data)]


async def test_produce_errors(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.controller.register_broker(2, "127.0.0.1", 1)
    await rb.create_topic("mine", configs={"max.message.bytes": "2000"})
    await rb.create_topic("theirs", assignments=[(2,)])
    conn = await rb.connect(nursery)

    async def error_of(topic, records, **kw):
        return only_partition(await conn.request(produce_request(topic, 0, records, **kw))).error_code

    assert await error_of("nope", batch()) == ErrorCode.unknown_topic_or_partition
    assert await error_of("theirs", batch()) == ErrorCode.not_leader_or_follower
    corrupt = bytearray(batch(3))
    corrupt[-1] ^= 0xFF
    assert await error_of("mine", bytes(corrupt)) == ErrorCode.corrupt_message
    assert await error_of("mine", batch(1, value_bytes=5000)) == ErrorCode.message_too_large
    assert await error_of("mine", batch(2) + batch(2)) == ErrorCode.invalid_record
    assert await error_of("mine", None) == ErrorCode.invalid_record
    assert await error_of("mine", batch(), acks=2) == ErrorCode.invalid_required_acks
    # Nothing refused reached the log; a good batch still appends at 0.
    assert rb.partition("mine").log.log_end_offset == 0
    ok = only_partition(await conn.request(produce_request("mine", 0, batch(4))))
    assert (ok.error_code, ok.base_offset) == (ErrorCode.none, 0)


async def test_acks_zero_answers_nothing_and_closes_on_error(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    conn = await rb.connect(nursery)
    assert await conn.request(produce_request("t", 0, batch(2), acks=0)) is None
    fetched = only_partition(await conn.request(fetch_request([("t", 0, 0, 1 << 20, -1)])))
    assert len(records_of(fetched)) == 1 and fetched.high_watermark == 2
    await conn.request(produce_request("missing", 0, batch(), acks=0))
    with trio.fail_after(5):
        while not conn.closed:
            await trio.sleep(0.01)


async def test_consumers_see_only_below_the_high_watermark(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    topic = await two_replica_topic(rb)
    conn = await rb.connect(nursery)
    produced = only_partition(await conn.request(produce_request(topic, 0, batch(5))))
    assert produced.error_code == ErrorCode.none
    consumer_view = only_partition(await conn.request(fetch_request([(topic, 0, 0, 1 << 20, -1)])))
    assert (consumer_view.high_watermark, records_of(consumer_view)) == (0, [])
    # The follower fetches from offset 5: it holds 0..4, the HW moves to 5.
    follower = only_partition(await conn.request(fetch_request([(topic, 0, 5, 1 << 20, -1)], replica_id=2)))
    assert follower.error_code == ErrorCode.none
    consumer_view = only_partition(await conn.request(fetch_request([(topic, 0, 0, 1 << 20, -1)])))
    assert consumer_view.high_watermark == 5 and [h.base_offset for h in records_of(consumer_view)] == [0]


async def test_acks_all_waits_for_the_high_watermark(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    topic = await two_replica_topic(rb)
    producer = await rb.connect(nursery)
    follower = await rb.connect(nursery)
    # No follower fetch: the request times out with REQUEST_TIMED_OUT.
    start = trio.current_time()
    timed_out = only_partition(await producer.request(produce_request(topic, 0, batch(2), acks=-1, timeout_ms=300)))
    assert timed_out.error_code == ErrorCode.request_timed_out
    assert 0.25 < trio.current_time() - start < 3
    # Parked again; the follower catching up to 4 completes it.
    answer = {}

    async def produce():
        answer["result"] = only_partition(await producer.request(
            produce_request(topic, 0, batch(2), acks=-1, timeout_ms=10_000)))

    nursery.start_soon(produce)
    with trio.fail_after(5):
        while rb.partition(topic).log.log_end_offset < 4:
            await trio.sleep(0.01)
    await trio.sleep(0.05)
    assert "result" not in answer
    await follower.request(fetch_request([(topic, 0, 4, 1 << 20, -1)], replica_id=2))
    with trio.fail_after(5):
        while "result" not in answer:
            await trio.sleep(0.01)
    assert (answer["result"].error_code, answer["result"].base_offset) == (ErrorCode.none, 2)


async def test_long_poll_wakes_on_append_and_times_out(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    consumer = await rb.connect(nursery)
    producer = await rb.connect(nursery)
    start = trio.current_time()
    empty = only_partition(await consumer.request(fetch_request([("t", 0, 0, 1 << 20, -1)], max_wait_ms=300)))
    assert records_of(empty) == [] and 0.25 < trio.current_time() - start < 3
    got = {}

    async def poll():
        got["result"] = only_partition(await consumer.request(
            fetch_request([("t", 0, 0, 1 << 20, -1)], max_wait_ms=10_000)))

    nursery.start_soon(poll)
    await trio.sleep(0.1)
    assert "result" not in got
    start = trio.current_time()
    await producer.request(produce_request("t", 0, batch(3)))
    with trio.fail_after(5):
        while "result" not in got:
            await trio.sleep(0.005)
    assert trio.current_time() - start < 1
    assert [h.base_offset for h in records_of(got["result"])] == [0]


async def test_fetch_errors_and_leader_epochs(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    conn = await rb.connect(nursery)
    await conn.request(produce_request("t", 0, batch(3)))
    # A metadata change naming the same leader bumps the leader epoch.
    topic_id = rb.broker.image.topic("t").topic_id
    rb.controller.append([PartitionChangeRecord(topic_id=topic_id, partition=0, leader=1)])
    epoch = rb.partition("t").state.leader_epoch
    assert epoch == 1

    async def fetch(offset, current_epoch=-1, topic="t"):
        return only_partition(await conn.request(fetch_request([(topic, 0, offset, 1 << 20, current_epoch)])))

    assert (await fetch(4)).error_code == ErrorCode.offset_out_of_range
    assert (await fetch(3)).error_code == ErrorCode.none
    assert (await fetch(0, epoch)).error_code == ErrorCode.none
    assert (await fetch(0, epoch - 1)).error_code == ErrorCode.fenced_leader_epoch
    assert (await fetch(0, epoch + 1)).error_code == ErrorCode.unknown_leader_epoch
    assert (await fetch(0, topic="nope")).error_code == ErrorCode.unknown_topic_or_partition
    ok = await fetch(0)
    assert (ok.high_watermark, ok.last_stable_offset, ok.log_start_offset) == (3, 3, 0)


async def test_response_size_limits_follow_kip_74(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t", 2)
    conn = await rb.connect(nursery)
    big = batch(1, value_bytes=3000)
    for partition in (0, 1):
        for _ in range(3):
            await conn.request(produce_request("t", partition, big))
    size = len(big)
    response = await conn.request(fetch_request([("t", 0, 0, 1 << 20, -1), ("t", 1, 0, 1 << 20, -1)],
                                                max_bytes=100))
    first, second = response.responses[0].partitions
    # The first batch goes out although it is larger than max_bytes; nothing else fits.
    assert [h.base_offset for h in records_of(first)] == [0] and records_of(second) == []
    response = await conn.request(fetch_request([("t", 0, 0, 2 * size, -1), ("t", 1, 0, 2 * size, -1)],
                                                max_bytes=3 * size))
    first, second = response.responses[0].partitions
    assert [h.base_offset for h in records_of(first)] == [0, 1]
    assert [h.base_offset for h in records_of(second)] == [0]


async def test_sessionless_fetch_sessions(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("t")
    conn = await rb.connect(nursery)
    await conn.request(produce_request("t", 0, batch(1)))
    # A client asking for a new session (epoch 0) gets session id 0: none was created.
    response = await conn.request(fetch_request([("t", 0, 0, 1 << 20, -1)], session_epoch=0))
    assert (response.error_code, response.session_id) == (ErrorCode.none, 0)
    assert records_of(only_partition(response))
    unknown = await conn.request(fetch_request([("t", 0, 0, 1 << 20, -1)], session_id=7, session_epoch=1))
    assert unknown.error_code == ErrorCode.fetch_session_id_not_found and unknown.responses == ()


async def test_fetch_copy_path_serves_the_same_bytes(nursery, tmp_path):
    sendfile = await start_broker(nursery, tmp_path / "a")
    copying = await start_broker(nursery, tmp_path / "b", node_id=1, fetch_file_transfer="pread")
    answers = []
    for rb in (sendfile, copying):
        await rb.create_topic("t")
        conn = await rb.connect(nursery)
        for i in range(5):
            await conn.request(produce_request("t", 0, batch(10, base_timestamp=1000 * i, value_bytes=500)))
        answers.append(bytes(only_partition(await conn.request(fetch_request([("t", 0, 0, 1 << 20, -1)]))).records))
    assert answers[0] == answers[1] and len(records_of_bytes(answers[0])) == 5


def records_of_bytes(data: bytes) -> list:
    return [h for _, h in iter_batch_headers(data)]


async def test_socket_buffer_sizes_are_broker_configs_and_small_ones_still_serve_big_requests(nursery, tmp_path):
    props = {"node.id": "1", "log.dirs": str(tmp_path), "socket.send.buffer.bytes": "8192",
             "socket.receive.buffer.bytes": "16384"}
    config = BrokerConfig.from_properties(props, cluster_id="c")
    assert (config.socket_send_buffer_bytes, config.socket_receive_buffer_bytes) == (8192, 16384)
    with pytest.raises(ConfigError, match="socket.send.buffer.bytes"):
        BrokerConfig.from_properties({**props, "socket.send.buffer.bytes": "-2"}, cluster_id="c")
    small = await start_broker(nursery, tmp_path / "small", socket_send_buffer_bytes=8192,
                               socket_receive_buffer_bytes=8192)
    default = await start_broker(nursery, tmp_path / "default")
    answers = []
    for rb in (small, default):
        await rb.create_topic("t")
        conn = await rb.connect(nursery)
        for i in range(8):
            answer = await conn.request(produce_request("t", 0, batch(200, base_timestamp=1000 * i, value_bytes=1000)))
            assert only_partition(answer).error_code == ErrorCode.none
        answers.append(bytes(only_partition(await conn.request(fetch_request([("t", 0, 0, 4 << 20, -1)]))).records))
    assert answers[0] == answers[1] and len(records_of_bytes(answers[0])) == 8 and len(answers[0]) > 1_000_000


async def test_idle_connections_close_but_long_polls_do_not(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path, connections_max_idle_ms=300)
    await rb.create_topic("t")
    idle = await trio.open_tcp_stream("127.0.0.1", rb.port)
    polling = await rb.connect(nursery)
    start = trio.current_time()
    # A fetch parked for longer than connections.max.idle.ms keeps its connection.
    response = await polling.request(fetch_request([("t", 0, 0, 1 << 20, -1)], max_wait_ms=700))
    assert trio.current_time() - start > 0.6 and response.error_code == ErrorCode.none
    with trio.fail_after(5):
        assert await idle.receive_some(10) == b""


async def test_topic_configs_apply_to_hosted_partitions(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("stamped", configs={"message.timestamp.type": "LogAppendTime"})
    await rb.create_topic("strict")
    conn = await rb.connect(nursery)
    before_ms = rb.broker.clock_ms()
    stamped = only_partition(await conn.request(produce_request("stamped", 0, batch(3, base_timestamp=1000))))
    assert stamped.error_code == ErrorCode.none
    append_ms = int(stamped.log_append_time.timestamp() * 1000)
    assert append_ms >= before_ms
    (header,) = records_of(only_partition(await conn.request(fetch_request([("stamped", 0, 0, 1 << 20, -1)]))))
    assert (header.timestamp_type, header.max_timestamp) == (1, append_ms)
    corrupt = bytearray(batch(2))
    corrupt[-1] ^= 1
    refused = only_partition(await conn.request(produce_request("stamped", 0, bytes(corrupt))))
    assert refused.error_code == ErrorCode.corrupt_message

    # min.insync.replicas changed on a live topic takes effect at once.
    rb.controller.append([ConfigRecord(ConfigResourceType.TOPIC, "strict", "min.insync.replicas", "2")])
    refused = only_partition(await conn.request(produce_request("strict", 0, batch(1), acks=-1)))
    assert refused.error_code == ErrorCode.not_enough_replicas
    accepted = only_partition(await conn.request(produce_request("strict", 0, batch(1), acks=1)))
    assert accepted.error_code == ErrorCode.none


async def test_a_long_poll_over_many_partitions_answers_each_with_what_it_has_after_several_wakes(nursery, tmp_path):
    # A parked fetch reads again only the partitions that changed: the
    # answer must still carry every partition, in request order, each
    # with its own records, once min_bytes is reached over several appends.
    rb = await start_broker(nursery, tmp_path)
    await rb.create_topic("a", partitions=3)
    await rb.create_topic("b", partitions=2)
    consumer = await rb.connect(nursery)
    producer = await rb.connect(nursery)
    await producer.request(produce_request("a", 2, batch(1)))  # data before the poll: offset 0 of a-2
    wanted = [("a", 0, 0, 1 << 20, -1), ("a", 1, 0, 1 << 20, -1), ("a", 2, 1, 1 << 20, -1),
              ("b", 0, 0, 1 << 20, -1), ("b", 1, 0, 1 << 20, -1)]
    one_batch = len(batch(2))
    got = {}

    async def poll():
        got["response"] = await consumer.request(
            fetch_request(wanted, max_wait_ms=10_000, min_bytes=2 * one_batch))

    nursery.start_soon(poll)
    await trio.sleep(0.1)
    await producer.request(produce_request("b", 1, batch(2)))  # one wake: below min_bytes
    await trio.sleep(0.1)
    assert "response" not in got
    await producer.request(produce_request("a", 1, batch(2)))  # the second reaches it
    with trio.fail_after(5):
        while "response" not in got:
            await trio.sleep(0.005)
    answered = {(t.topic, p.partition_index): p for t in got["response"].responses for p in t.partitions}
    assert [(t.topic, [p.partition_index for p in t.partitions]) for t in got["response"].responses] == \
        [("a", [0, 1, 2]), ("b", [0, 1])]
    assert [h.base_offset for h in records_of(answered[("a", 1)])] == [0]
    assert [h.base_offset for h in records_of(answered[("b", 1)])] == [0]
    for quiet in (("a", 0), ("a", 2), ("b", 0)):
        assert records_of(answered[quiet]) == [] and answered[quiet].error_code == 0
    assert answered[("a", 2)].high_watermark == 1
    assert answered[("a", 1)].high_watermark == 2 and answered[("b", 1)].high_watermark == 2
