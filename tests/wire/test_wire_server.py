"""The trio server over real loopback sockets: ordering, pipelining bounds,
handlers answering at once or later, refusing garbage per connection, idle
timeout."""

import logging
import socket
import struct

import pytest
import trio
from kio.schema.api_versions.v0 import ApiVersionsRequest as ApiVersionsRequestV0
from wire_testing import (
    closed_by_peer,
    correlation_id_of,
    epoch_of,
    leader_epoch_of,
    raft_apis,
    read_frames,
    vote_request,
    vote_response,
)

from common.wire import (
    api_codec,
    decode_response,
    encode_request,
    encode_response_header,
    frame_parts,
    open_connection,
)


async def echo_vote(ctx, request):
    return vote_response(epoch_of(request.body))


async def test_pipelined_responses_leave_in_request_order_when_handlers_finish_in_reverse(start_server):
    n = 20
    finished = {i: trio.Event() for i in range(n)}
    completion_order = []

    async def reverse_handler(ctx, request):
        epoch = epoch_of(request.body)
        if epoch < n - 1:
            await finished[epoch + 1].wait()
        completion_order.append(epoch)
        finished[epoch].set()
        return vote_response(epoch)

    server = await start_server(reverse_handler, raft_apis(), max_in_flight=n)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(n)))
    with trio.fail_after(10):
        frames = await read_frames(stream, n)
    assert completion_order == list(reversed(range(n)))
    assert [correlation_id_of(f) for f in frames] == list(range(n))
    codec = api_codec(52, 0)
    assert [leader_epoch_of(decode_response(memoryview(f), codec, i)) for i, f in enumerate(frames)] == list(range(n))


async def test_at_most_max_in_flight_requests_are_handled_at_once(start_server):
    running = 0
    most_running = 0
    release = trio.Event()

    async def blocking_handler(ctx, request):
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        await release.wait()
        running -= 1
        return vote_response(epoch_of(request.body))

    server = await start_server(blocking_handler, raft_apis(), max_in_flight=4)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(10)))
    with trio.fail_after(10):
        while running < 4:
            await trio.sleep(0.001)
    await trio.sleep(0.05)
    assert most_running == 4
    release.set()
    with trio.fail_after(10):
        frames = await read_frames(stream, 10)
    assert [correlation_id_of(f) for f in frames] == list(range(10))
    assert most_running == 4


async def test_in_order_blocks_run_in_request_order(start_server):
    n = 10
    entered = {i: trio.Event() for i in range(n)}
    ordered = []

    async def produce_like_handler(ctx, request):
        epoch = epoch_of(request.body)
        # Later requests try to take their turn first.
        if epoch < n - 1:
            await entered[epoch + 1].wait()
        entered[epoch].set()
        async with ctx.in_order(request):
            ordered.append(epoch)
            await trio.sleep(0)
        return vote_response(epoch)

    server = await start_server(produce_like_handler, raft_apis(), max_in_flight=n)
    async with open_connection("127.0.0.1", server.port) as conn:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(conn.request, vote_request(i))
                await trio.sleep(0.001)  # send them in order
    assert ordered == list(range(n))


async def test_handler_may_answer_with_no_response(start_server):
    async def silent_for_odd(ctx, request):
        epoch = epoch_of(request.body)
        return None if epoch % 2 else vote_response(epoch)

    server = await start_server(silent_for_odd, raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(6)))
    with trio.fail_after(10):
        frames = await read_frames(stream, 3)
    assert [correlation_id_of(f) for f in frames] == [0, 2, 4]


@pytest.mark.parametrize("size", [2**31 - 1, 104857601, -1])
async def test_oversized_frame_is_refused_without_reading_its_body(start_server, size, caplog):
    server = await start_server(echo_vote, raft_apis())
    attacker = await trio.open_tcp_stream("127.0.0.1", server.port)
    await attacker.send_all(struct.pack(">i", size))
    # The attacker sends nothing more: the server must not wait for the body.
    with trio.fail_after(10):
        assert await closed_by_peer(attacker)
    assert server.stats.bytes_received == 4
    assert server.stats.connections_closed_malformed == 1
    local_port = attacker.socket.getsockname()[1]
    assert any(
        f"127.0.0.1:{local_port}" in r.getMessage() and ("socket.request.max.bytes" in r.getMessage() or "negative" in r.getMessage())
        for r in caplog.records
    )
    # Everyone else is still served.
    async with open_connection("127.0.0.1", server.port) as conn:
        assert leader_epoch_of(await conn.request(vote_request(5))) == 5


async def test_request_max_bytes_is_configurable(start_server):
    server = await start_server(echo_vote, raft_apis(), request_max_bytes=50)
    big = encode_request(1, "c" * 100, vote_request(1))
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(big)
    with trio.fail_after(10):
        assert await closed_by_peer(stream)
    assert server.stats.connections_closed_malformed == 1


async def test_unserved_api_closes_the_connection_as_kafka_does(start_server):
    server = await start_server(echo_vote, raft_apis())
    for header in (struct.pack(">hhih", 3, 12, 1, -1) + b"\x00", struct.pack(">hhih", 52, 7, 1, -1)):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(struct.pack(">i", len(header)) + header)
        with trio.fail_after(10):
            assert await closed_by_peer(stream)
    assert server.stats.connections_closed_malformed == 2


async def test_a_garbage_frame_after_a_good_one_closes_only_that_connection(start_server):
    server = await start_server(echo_vote, raft_apis())
    bystander = await trio.open_tcp_stream("127.0.0.1", server.port)
    offender = await trio.open_tcp_stream("127.0.0.1", server.port)
    await offender.send_all(struct.pack(">i", 12) + b"\x00\x34\x00\x00" + b"\xff" * 8)
    with trio.fail_after(10):
        assert await closed_by_peer(offender)
    await bystander.send_all(encode_request(3, "c", vote_request(9)))
    with trio.fail_after(10):
        [frame] = await read_frames(bystander, 1)
    assert leader_epoch_of(decode_response(memoryview(frame), api_codec(52, 0), 3)) == 9


async def test_handler_exception_closes_its_connection_and_is_logged(start_server, caplog):
    async def fragile(ctx, request):
        if epoch_of(request.body) == 13:
            raise RuntimeError("unlucky epoch")
        return vote_response(epoch_of(request.body))

    server = await start_server(fragile, raft_apis())
    async with open_connection("127.0.0.1", server.port) as good:
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(encode_request(1, "c", vote_request(13)))
        with trio.fail_after(10):
            assert await closed_by_peer(stream)
        assert leader_epoch_of(await good.request(vote_request(12))) == 12
    assert server.stats.handler_failures == 1
    failure = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert failure and failure[0].exc_info and "unlucky epoch" in str(failure[0].exc_info[1])


async def test_a_handler_returning_a_mis_sized_frame_closes_the_connection(start_server):
    async def sloppy(ctx, request):
        return [struct.pack(">i", 100), b"only a few bytes"]

    server = await start_server(sloppy, raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)))
    with trio.fail_after(10):
        assert await closed_by_peer(stream)
    assert server.stats.handler_failures == 1


async def test_idle_connection_closes_after_connections_max_idle_ms(start_server, autojump_clock):
    server = await start_server(echo_vote, raft_apis())  # Kafka's default, 600000 ms
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", ApiVersionsRequestV0()))
    await read_frames(stream, 1)
    answered_at = trio.current_time()
    assert await closed_by_peer(stream)
    assert 600 <= trio.current_time() - answered_at < 601
    assert server.stats.connections_closed_idle == 1


async def test_a_long_poll_in_flight_keeps_the_connection_open(start_server, autojump_clock):
    async def long_poll(ctx, request):
        await trio.sleep(900)
        return vote_response(epoch_of(request.body))

    server = await start_server(long_poll, raft_apis(), connections_max_idle_ms=1000)
    async with open_connection("127.0.0.1", server.port) as conn:
        response = await conn.request(vote_request(4), timeout_ms=1_000_000)
        assert leader_epoch_of(response) == 4
        await trio.sleep(2)
        assert conn.closed
    assert server.stats.connections_closed_idle == 1


async def test_connections_are_forgotten_when_they_close(start_server):
    server = await start_server(echo_vote, raft_apis())
    async with open_connection("127.0.0.1", server.port) as conn:
        await conn.request(vote_request(1))
        assert len(server.connections) == 1
        [ctx] = server.connections.values()
        assert ctx.peer.startswith("127.0.0.1:")
    with trio.fail_after(10):
        while server.connections:
            await trio.sleep(0.001)


async def test_many_requests_in_one_read_are_all_answered(start_server):
    server = await start_server(echo_vote, raft_apis(), max_in_flight=8)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    n = 2000
    blob = b"".join(encode_request(i, "c", vote_request(i)) for i in range(n))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, blob)
        with trio.fail_after(30):
            frames = await read_frames(stream, n)
    assert [correlation_id_of(f) for f in frames] == list(range(n))


def test_bad_max_in_flight_is_refused():
    from common.wire import LocalProtocolError, serve

    async def main():
        with pytest.raises(LocalProtocolError, match="max_in_flight"):
            await serve(echo_vote, "127.0.0.1", 0, apis=raft_apis(), max_in_flight=0)

    trio.run(main)


logging.getLogger("raftka.wire").setLevel(logging.INFO)


async def test_handlers_answering_at_once_and_later_keep_request_order(start_server):
    later = trio.Event()

    def mixed(ctx, request):
        epoch = epoch_of(request.body)
        if epoch % 3:
            return vote_response(epoch)  # answered at once, in the reader

        async def slow():
            await later.wait()
            return vote_response(epoch)
        return slow()

    server = await start_server(mixed, raft_apis(), max_in_flight=32)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(12)))
    with trio.fail_after(10):
        while server.stats.requests < 12:
            await trio.sleep(0.001)
    later.set()
    with trio.fail_after(10):
        frames = await read_frames(stream, 12)
    assert [correlation_id_of(f) for f in frames] == list(range(12))
    assert server.stats.requests_answered_at_once == 8


async def test_in_turn_lets_a_request_act_at_once_only_after_every_earlier_one(start_server):
    first_may_finish = trio.Event()
    appended = []

    def produce_like(ctx, request):
        epoch = epoch_of(request.body)
        if epoch == 0:
            async def slow_first():
                async with ctx.in_order(request):
                    await first_may_finish.wait()
                    appended.append(0)
                return vote_response(0)
            return slow_first()
        if ctx.in_turn(request):
            appended.append(epoch)
            ctx.end_turn(request)
            return vote_response(epoch)

        async def wait_turn():
            async with ctx.in_order(request):
                appended.append(epoch)
            return vote_response(epoch)
        return wait_turn()

    server = await start_server(produce_like, raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(4)))
    with trio.fail_after(10):
        while server.stats.requests < 4:
            await trio.sleep(0.001)
    assert appended == []  # all wait behind the first
    first_may_finish.set()
    with trio.fail_after(10):
        frames = await read_frames(stream, 4)
    assert appended == [0, 1, 2, 3]
    assert [correlation_id_of(f) for f in frames] == [0, 1, 2, 3]
    # Once nothing is pending, a request acts at once.
    await stream.send_all(encode_request(9, "c", vote_request(9)))
    with trio.fail_after(10):
        await read_frames(stream, 1)
    assert appended[-1] == 9 and server.stats.requests_answered_at_once == 1


async def test_a_handler_closing_the_connection_stops_the_requests_behind_it(start_server):
    handled = []

    def closing(ctx, request):
        epoch = epoch_of(request.body)
        handled.append(epoch)
        if epoch == 1:
            ctx.close()  # like a failed acks=0 produce
            return None
        return vote_response(epoch)

    server = await start_server(closing, raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode_request(i, "c", vote_request(i)) for i in range(5)))
    with trio.fail_after(10):
        assert await closed_by_peer(stream)
    assert handled == [0, 1]


async def test_a_response_of_many_parts_reaches_a_slow_reader_whole(start_server):
    pieces = [bytes([i % 251]) * (i % 7 + 1) for i in range(3000)] + [b"z" * 3_000_000]

    async def many_parts(ctx, request):
        return frame_parts(encode_response_header(request.header), *pieces)

    server = await start_server(many_parts, raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)))
    received = bytearray()
    expected = 4 + 4 + 1 + sum(len(p) for p in pieces)
    with trio.fail_after(30):
        while len(received) < expected:
            received += await stream.receive_some(7000)  # small reads: the server's sends stay partial
            await trio.sleep(0)
    assert bytes(received[9:]) == b"".join(pieces)


async def test_a_server_started_not_listening_holds_its_port_and_refuses_until_opened(start_server):
    server = await start_server(echo_vote, raft_apis(), listen=False)
    with pytest.raises(OSError):  # refused: a client retries, rather than being answered too early
        await trio.open_tcp_stream("127.0.0.1", server.port)
    # Held against another server's SO_REUSEADDR bind (as `free_ports` checks a port),
    # which Linux would allow while both flag it and neither listens.
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", server.port))
    server.open()
    async with open_connection("127.0.0.1", server.port) as conn:
        assert leader_epoch_of(await conn.request(vote_request(7))) == 7
