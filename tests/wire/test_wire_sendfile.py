"""Responses that slice files: the sendfile path and the pread path put the
same bytes on the wire, and a file shorter than promised closes the
connection instead of corrupting the stream."""

import os

import pytest
import trio
from wire_testing import closed_by_peer, raft_apis, read_frames, vote_request

from common.wire import FileSlice, encode_request, encode_response_header, frame_parts
from common.wire.transmit import SMALL_SLICE_BYTES

FILE_BYTES = 12 * 1024 * 1024  # more than loopback socket buffers: sendfile must wait


@pytest.fixture
def segment(tmp_path):
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(os.urandom(FILE_BYTES))
    with open(path, "rb") as file:
        yield file


def sliced_handler(segment, offset, count):
    async def handler(ctx, request):
        header = encode_response_header(request.header)
        return frame_parts(header, b"<head>", FileSlice(segment, offset, count), b"<tail>")

    return handler


@pytest.mark.parametrize("file_transfer", ["sendfile", "pread", "auto"])
async def test_file_slices_arrive_byte_for_byte(start_server, segment, file_transfer):
    offset, count = 1000, FILE_BYTES - 5000
    server = await start_server(
        sliced_handler(segment, offset, count), raft_apis(), file_transfer=file_transfer
    )
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)) + encode_request(2, "c", vote_request(2)))
    await trio.sleep(0.2)  # let the server fill the socket buffers before we read
    with trio.fail_after(30):
        frames = await read_frames(stream, 2)
    expected_slice = os.pread(segment.fileno(), count, offset)
    for correlation_id, frame in zip((1, 2), frames):
        assert frame == correlation_id.to_bytes(4, "big") + b"\x00<head>" + expected_slice + b"<tail>"
    with trio.fail_after(10):  # the writer counts once its send returns
        while server.stats.sendfile_bytes + server.stats.pread_bytes < 2 * count:
            await trio.sleep(0.001)
    stats = server.stats
    assert stats.sendfile_bytes + stats.pread_bytes == 2 * count
    if file_transfer == "auto":
        # The slice is large, so it goes by sendfile; only what is left of
        # it after a send the socket cut short, once that is at most
        # SMALL_SLICE_BYTES, may be read into the sendmsg of the tail.
        assert stats.pread_bytes <= 2 * SMALL_SLICE_BYTES
    else:
        assert getattr(stats, f"{file_transfer}_bytes") == 2 * count


@pytest.mark.parametrize("file_transfer", ["sendfile", "pread", "auto"])  # auto: a small slice is read
async def test_a_short_file_closes_the_connection(start_server, segment, file_transfer, caplog):
    server = await start_server(
        sliced_handler(segment, FILE_BYTES - 10, 100), raft_apis(), file_transfer=file_transfer
    )
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)))
    with trio.fail_after(10):
        assert await closed_by_peer(stream)
    assert any("shorter than the response promised" in r.getMessage() for r in caplog.records)


SMALL_SLICES = 3000  # like a Fetch answer to a follower that keeps up: a little of each of many partitions


def many_slices_handler(segment, slices):
    async def handler(ctx, request):
        header = encode_response_header(request.header)
        parts = []
        for i, (offset, count) in enumerate(slices):
            parts += [f"<p{i}>".encode(), FileSlice(segment, offset, count)]
        return frame_parts(header, *parts, b"<tail>")

    return handler


async def test_many_small_slices_and_a_large_one_arrive_byte_for_byte(start_server, segment):
    # Small slices (read and sent with the buffers around them) with a large
    # one among them (sendfile), more than the socket buffers hold: the
    # sends stop part-way many times.
    sizes = [1 + (i * 7919) % 3000 for i in range(SMALL_SLICES)]
    sizes[SMALL_SLICES // 2] = 4 * 1024 * 1024
    offsets = [(i * 104729) % (FILE_BYTES - size) for i, size in enumerate(sizes)]
    slices = list(zip(offsets, sizes))
    server = await start_server(many_slices_handler(segment, slices), raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)))
    await trio.sleep(0.2)  # let the server fill the socket buffers before we read
    with trio.fail_after(30):
        [frame] = await read_frames(stream, 1)
    expected = b"".join(f"<p{i}>".encode() + os.pread(segment.fileno(), count, offset)
                        for i, (offset, count) in enumerate(slices))
    assert frame == (1).to_bytes(4, "big") + b"\x00" + expected + b"<tail>"
    with trio.fail_after(10):
        while server.stats.sendfile_bytes + server.stats.pread_bytes < sum(sizes):
            await trio.sleep(0.001)
    assert server.stats.sendfile_bytes == 4 * 1024 * 1024, "the large slice goes by sendfile"
    assert server.stats.pread_bytes == sum(sizes) - 4 * 1024 * 1024, "each small slice is read once"


async def test_a_closed_file_closes_the_connection(start_server, tmp_path):
    path = tmp_path / "gone.log"
    path.write_bytes(b"x" * 100)
    file = open(path, "rb")
    file.close()
    server = await start_server(sliced_handler(file, 0, 10), raft_apis())
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(encode_request(1, "c", vote_request(1)))
    with trio.fail_after(10):
        assert await closed_by_peer(stream)
