"""Whatever bytes a peer sends, the server keeps serving other clients and
forgets the offending connection once it is gone."""

import functools
import struct

import trio
from hypothesis import given
from hypothesis import strategies as st
from wire_testing import epoch_of, leader_epoch_of, raft_apis, vote_request, vote_response

from common.wire import encode_request, open_connection, serve


async def echo_vote(ctx, request):
    return vote_response(epoch_of(request.body))


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


good_vote = encode_request(1, "c", vote_request(1))[4:]

garbage = st.one_of(
    st.binary(max_size=200),
    # Well framed, so the bytes reach the header and body decoders.
    st.lists(st.binary(max_size=60), min_size=1, max_size=4).map(lambda bs: b"".join(map(framed, bs))),
    # A real Vote header with its body mangled.
    st.binary(max_size=40).map(lambda tail: framed(good_vote[:14] + tail)),
    # Valid requests followed by junk.
    st.binary(max_size=40).map(lambda tail: framed(good_vote) * 2 + tail),
)


async def garbage_then_good_client(data: bytes) -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            functools.partial(serve, echo_vote, "127.0.0.1", 0, apis=raft_apis())
        )
        offender = await trio.open_tcp_stream("127.0.0.1", server.port)
        await offender.send_all(data)
        async with open_connection("127.0.0.1", server.port) as conn:
            with trio.fail_after(10):
                assert leader_epoch_of(await conn.request(vote_request(7))) == 7
        await offender.aclose()
        with trio.fail_after(10):
            while server.connections:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()


@given(garbage)
def test_garbage_never_stops_the_server(data):
    trio.run(garbage_then_good_client, data)
