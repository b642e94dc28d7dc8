"""The pipelining client and the connection pool against our server over
loopback."""

import datetime
import functools
import random
import socket

import pytest
import trio
from kio.schema.produce.v3 import ProduceRequest
from kio.schema.produce.v3 import request as produce_req
from kio.static.primitive import i16, i32
from wire_testing import epoch_of, leader_epoch_of, raft_apis, vote_request, vote_response

from common.wire import (
    ConnectionFailedError,
    RequestTimeoutError,
    SupportedApis,
    UnsupportedVersionError,
    open_connection,
    open_connection_pool,
    serve,
)


async def echo_vote(ctx, request):
    return vote_response(epoch_of(request.body))


async def test_concurrent_requests_each_get_their_own_response(start_server):
    async def jittery(ctx, request):
        await trio.sleep(random.random() / 1000)
        return vote_response(epoch_of(request.body))

    server = await start_server(jittery, raft_apis())
    results = {}
    async with open_connection("127.0.0.1", server.port) as conn:

        async def ask(i):
            results[i] = leader_epoch_of(await conn.request(vote_request(i)))

        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(ask, i)
    assert results == {i: i for i in range(100)}
    assert server.stats.connections_accepted == 1


async def test_timeout_closes_the_connection_and_fails_the_others(start_server, autojump_clock):
    async def never_for_99(ctx, request):
        if epoch_of(request.body) == 99:
            await trio.sleep_forever()
        return vote_response(epoch_of(request.body))

    server = await start_server(never_for_99, raft_apis())
    async with open_connection("127.0.0.1", server.port) as conn:
        failures = []

        async def behind_it():
            try:
                await conn.request(vote_request(1), timeout_ms=60_000)
            except ConnectionFailedError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            with pytest.raises(RequestTimeoutError, match="within 500 ms"):
                nursery.start_soon(behind_it)
                await conn.request(vote_request(99), timeout_ms=500)
        assert conn.closed
        assert len(failures) == 1
        with pytest.raises(ConnectionFailedError, match="closed"):
            await conn.request(vote_request(2))


async def test_server_closing_fails_pending_requests(start_server):
    async def fail_on_5(ctx, request):
        if epoch_of(request.body) == 5:
            raise RuntimeError("boom")
        await trio.sleep_forever()

    server = await start_server(fail_on_5, raft_apis())
    async with open_connection("127.0.0.1", server.port) as conn:
        errors = []

        async def waiting():
            try:
                await conn.request(vote_request(1))
            except ConnectionFailedError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting)
            await trio.sleep(0.01)
            with pytest.raises(ConnectionFailedError, match="closed the connection|broke"):
                await conn.request(vote_request(5))
        assert len(errors) == 1


async def test_a_cancelled_caller_does_not_shift_later_responses(start_server):
    release = trio.Event()

    async def slow_first(ctx, request):
        if epoch_of(request.body) == 1:
            await release.wait()
        return vote_response(epoch_of(request.body))

    server = await start_server(slow_first, raft_apis())
    async with open_connection("127.0.0.1", server.port) as conn:
        with trio.move_on_after(0.05):
            await conn.request(vote_request(1))
        release.set()
        assert leader_epoch_of(await conn.request(vote_request(2))) == 2
        assert not conn.closed


async def test_acks_zero_produce_expects_no_response(start_server):
    produced = []

    async def handler(ctx, request):
        if request.header.api_key == 0:
            produced.append(request.body.acks)
            return None
        return vote_response(epoch_of(request.body))

    apis = raft_apis().declare(0, 3, 3)
    server = await start_server(handler, apis)
    request = ProduceRequest(
        transactional_id=None, acks=i16(0), timeout=datetime.timedelta(seconds=1),
        topic_data=(produce_req.TopicProduceData(
            name="t", partition_data=(produce_req.PartitionProduceData(index=i32(0), records=None),),
        ),),
    )
    async with open_connection("127.0.0.1", server.port) as conn:
        assert await conn.request(request) is None
        assert leader_epoch_of(await conn.request(vote_request(3))) == 3
    assert produced == [0]


async def test_api_versions_negotiation_falls_back_and_picks_versions(start_server):
    apis = SupportedApis().declare(18, 0, 2).declare(52, 0, 0).declare(1, 4, 12)
    server = await start_server(echo_vote, apis)
    async with open_connection("127.0.0.1", server.port) as conn:
        assert await conn.api_versions() == {1: (4, 12), 18: (0, 2), 52: (0, 0)}
        assert conn.pick_version(1, 0, 16) == 12
        assert conn.pick_version(52, 0, 1) == 0
        with pytest.raises(UnsupportedVersionError, match="we speak 13..16"):
            conn.pick_version(1, 13, 16)
        with pytest.raises(UnsupportedVersionError, match="none"):
            conn.pick_version(63, 0, 0)


async def test_connect_to_nothing_is_a_connection_failure():
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with pytest.raises(ConnectionFailedError, match=f"cannot connect to 127.0.0.1:{port}") as failed:
        async with open_connection("127.0.0.1", port):
            pass
    # Refused at once: the message names the refusal, not the connect timeout.
    assert "refused" in str(failed.value) and " ms" not in str(failed.value), failed.value


async def test_pool_connects_lazily_once_and_reuses(start_server):
    server = await start_server(echo_vote, raft_apis())
    async with open_connection_pool({2: ("127.0.0.1", server.port)}) as pool:
        assert server.stats.connections_accepted == 0
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(pool.request, 2, vote_request(i))
        first = await pool.connection(2)
        assert first.api_versions_supported == {18: (0, 4), 52: (0, 0)}
        assert leader_epoch_of(await pool.request(2, vote_request(8))) == 8
        assert await pool.connection(2) is first
    assert server.stats.connections_accepted == 1


async def test_pool_backs_off_then_reconnects_to_a_restarted_node(nursery, autojump_clock):
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    async with open_connection_pool(
        {3: ("127.0.0.1", port)}, reconnect_backoff_ms=100, reconnect_backoff_max_ms=400,
        rng=random.Random(7),
    ) as pool:
        with pytest.raises(ConnectionFailedError, match="cannot connect"):
            await pool.request(3, vote_request(1))
        with pytest.raises(ConnectionFailedError, match="reconnect backoff"):
            await pool.request(3, vote_request(1))
        assert 80 <= pool.backoff_remaining_ms(3) <= 120
        await trio.sleep(0.2)
        with pytest.raises(ConnectionFailedError, match="cannot connect"):
            await pool.request(3, vote_request(1))
        assert 160 <= pool.backoff_remaining_ms(3) <= 240  # doubled

        server_scope = trio.CancelScope()

        async def run_node(task_status):
            with server_scope:
                await serve(echo_vote, "127.0.0.1", port, apis=raft_apis(), task_status=task_status)
        await nursery.start(run_node)
        await trio.sleep(0.3)
        assert leader_epoch_of(await pool.request(3, vote_request(2))) == 2
        assert pool.backoff_remaining_ms(3) == 0

        server_scope.cancel()  # the node goes down
        await trio.sleep(0.01)
        with pytest.raises(ConnectionFailedError):
            await pool.request(3, vote_request(3))
        await nursery.start(functools.partial(serve, echo_vote, "127.0.0.1", port, apis=raft_apis()))
        await trio.sleep(0.5)
        assert leader_epoch_of(await pool.request(3, vote_request(4))) == 4


async def test_pool_moves_a_node_to_its_new_address(start_server):
    old = await start_server(echo_vote, raft_apis())
    new = await start_server(echo_vote, raft_apis())
    async with open_connection_pool({1: ("127.0.0.1", old.port)}) as pool:
        first = await pool.connection(1)
        pool.set_address(1, "127.0.0.1", new.port)
        assert leader_epoch_of(await pool.request(1, vote_request(6))) == 6
        await trio.sleep(0.01)
        assert first.closed
        assert new.stats.connections_accepted == 1
        with pytest.raises(ConnectionFailedError, match="no address known for node 9"):
            await pool.request(9, vote_request(1))
