"""Compression codecs of Kafka record batches, by Kafka's ids, via cramjam.

Theory of operation
-------------------
A v2 batch compresses its whole records section with the codec named by
`attributes & 0x07` (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd; zstd is
KIP-110). Clients differ in the framing they send, so decoding is lenient:

- gzip: standard gzip members (RFC 1952).
- snappy: Java clients write xerial's framing (`\\x82SNAPPY\\x00`, two int32
  version fields, then blocks of [int32 length][raw snappy block]);
  librdkafka may write one raw snappy block. Both are read; we write the
  xerial framing, which every client reads.
- lz4: the LZ4 frame format (Kafka >= 0.10 writes frames with a correct
  header checksum, KIP-57).
- zstd: standard zstd frames.

`decompress_bounded` is the produce path's (and recovery's) decoder: it
never holds more than a limit of output, so a small batch that claims to
expand to gigabytes (a decompression bomb) costs at most that limit. gzip,
lz4 and zstd decode into a buffer that starts at a guess and grows fourfold
up to the limit; snappy's blocks declare their length, which is checked
before decoding.

Pure: bytes in, bytes out.
"""

import struct
from collections.abc import Iterator

import cramjam

from storage.errors import CorruptRecordError, UnsupportedCompressionError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024
_INT32 = struct.Struct(">i")


def _unsupported(codec_id: int) -> UnsupportedCompressionError:
    return UnsupportedCompressionError(
        f"compression codec id {codec_id} is not one Kafka defines "
        "(0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd): the batch's attributes are wrong "
        "or the client is newer than raftka"
    )


def compress(codec_id: int, data) -> bytes:
    """Compress `data` with Kafka codec `codec_id`."""
    if codec_id == NONE:
        return bytes(data)
    if codec_id == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec_id == SNAPPY:
        return _xerial_snappy_compress(data)
    if codec_id == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec_id == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise _unsupported(codec_id)


def decompress(codec_id: int, data) -> bytes:
    """Decompress `data` written with Kafka codec `codec_id`.

    Raises CorruptRecordError if the bytes are not valid for the codec.
    """
    try:
        if codec_id == NONE:
            return bytes(data)
        if codec_id == GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec_id == SNAPPY:
            if bytes(data[: len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
                return _xerial_snappy_decompress(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec_id == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec_id == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(
            f"{CODEC_NAMES[codec_id]} records section does not decompress: {e}"
        ) from None
    raise _unsupported(codec_id)


def _xerial_snappy_compress(data) -> bytes:
    view = memoryview(data)
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(view), _XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_BYTES]))
        out += _INT32.pack(len(block))
        out += block
    return bytes(out)


def _xerial_blocks(view: memoryview) -> Iterator[memoryview]:
    """The snappy blocks of a xerial-framed stream (Kafka's Java clients'
    format: a 16-byte header, then length-prefixed blocks)."""
    pos = len(_XERIAL_HEADER)
    if len(view) < pos:
        raise CorruptRecordError("xerial snappy stream shorter than its 16-byte header")
    while pos < len(view):
        if len(view) - pos < 4:
            raise CorruptRecordError(f"xerial snappy block length truncated at byte {pos}")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or len(view) - pos < length:
            raise CorruptRecordError(
                f"xerial snappy block at byte {pos - 4} claims {length} bytes, "
                f"{len(view) - pos} remain"
            )
        yield view[pos : pos + length]
        pos += length


def _xerial_snappy_decompress(data) -> bytes:
    out = bytearray()
    for block in _xerial_blocks(memoryview(data)):
        out += cramjam.snappy.decompress_raw(block)
    return bytes(out)


# The most a byte of each codec's stream can expand to: deflate's longest
# match (258 bytes) in about two bits, an lz4 match length byte (255). A
# stream that short decompresses within the limit whatever it holds, so it
# is decoded in one call; zstd's RLE blocks reach 32768x, so a zstd stream
# of more than 2 KB, and longer gzip and lz4 streams, take the bounded path.
_MAX_RATIO = {GZIP: 1032, LZ4: 255, ZSTD: 32768}
_PLAIN = {GZIP: cramjam.gzip.decompress, LZ4: cramjam.lz4.decompress, ZSTD: cramjam.zstd.decompress}
# The bounded path's buffer: the stream's own size hint (`_size_hint`) or a
# guess, grown fourfold while it is too small, up to the limit.
_FIRST_GUESS_RATIO = 16
_MIN_GUESS_BYTES = 64 * 1024
_GROWTH = 4
# cramjam's message when the output buffer of `decompress_into` is full.
_BUFFER_FULL = "failed to write whole buffer"


def decompress_bounded(codec_id: int, data, max_bytes: int):
    """Decompress `data` (codec 1..4) into at most `max_bytes` bytes; return
    a bytes-like of the output.

    Raises CorruptRecordError if the bytes are not valid for the codec or
    would decompress to more than `max_bytes`.
    """
    try:
        if codec_id == SNAPPY:
            return _snappy_bounded(data, max_bytes)
        into = _INTO.get(codec_id)
        if into is None:
            raise _unsupported(codec_id)
        if len(data) * _MAX_RATIO[codec_id] <= max_bytes:
            return _PLAIN[codec_id](data)
        hint = _size_hint(codec_id, data)
        if hint is None:
            hint = max(_MIN_GUESS_BYTES, _FIRST_GUESS_RATIO * len(data))
        size = max(1, min(max_bytes, hint))
        while True:
            out = bytearray(size)
            try:
                n = into(data, out)
            except cramjam.DecompressionError as e:
                # A full buffer: grow it (a highly compressible batch), up to
                # the limit. Anything else is a stream that does not decode.
                if _BUFFER_FULL not in str(e):
                    raise
                if size >= max_bytes:
                    raise CorruptRecordError(
                        f"{CODEC_NAMES[codec_id]} records section decompresses to more than "
                        f"{max_bytes} bytes: refused as a decompression bomb"
                    ) from None
                size = min(max_bytes, max(size * _GROWTH, _MIN_GUESS_BYTES))
                continue
            return memoryview(out)[:n]
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(
            f"{CODEC_NAMES[codec_id]} records section does not decompress: {e}"
        ) from None


def _size_hint(codec_id: int, data) -> int | None:
    """What the stream says it decompresses to, at most: only a buffer's
    size (a stream that lies fills it and is refused or grown like any
    other). None when it says nothing."""
    view = memoryview(data)
    try:
        if codec_id == ZSTD:
            return _zstd_size_bound(view)
        if codec_id == LZ4:
            return _lz4_size_bound(view)
        if codec_id == GZIP and len(view) >= 18:
            # ISIZE, the last four bytes of a gzip member (RFC 1952): every
            # client writes one member.
            return int.from_bytes(view[-4:], "little")
    except IndexError:
        return None
    return None


_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_BLOCK_MAX = 128 * 1024


def _zstd_size_bound(view) -> int | None:
    """The zstd frames' (RFC 8878) block headers: a raw or RLE block makes
    its Block_Size, a compressed one at most 128 KiB. Kafka's clients write
    no content size, and one frame of a few blocks per batch."""
    n = len(view)
    pos = total = 0
    while pos < n:
        magic = int.from_bytes(view[pos : pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame
            pos += 8 + int.from_bytes(view[pos + 4 : pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            return None
        descriptor = view[pos + 4]
        single_segment = descriptor >> 5 & 1
        pos += (5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
                + (single_segment, 2, 4, 8)[descriptor >> 6])
        while True:
            header = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16
            block_type, block_size = header >> 1 & 3, header >> 3
            pos += 3
            if block_type == 0:  # raw
                total += block_size
                pos += block_size
            elif block_type == 1:  # RLE: one byte, repeated
                total += block_size
                pos += 1
            elif block_type == 2:
                total += _ZSTD_BLOCK_MAX
                pos += block_size
            else:
                return None
            if header & 1:  # the last block
                break
        if descriptor >> 2 & 1:  # a content checksum
            pos += 4
    return total


_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_size_bound(view) -> int | None:
    """The LZ4 frames' block sizes: a stored block makes its size, a
    compressed one at most the frame's block maximum (64 KiB as Kafka's
    clients write them); or the frame's content size, when it has one."""
    n = len(view)
    pos = total = 0
    while pos < n:
        if int.from_bytes(view[pos : pos + 4], "little") != _LZ4_MAGIC:
            return None
        flags, block_descriptor = view[pos + 4], view[pos + 5]
        block_max = _LZ4_BLOCK_MAX.get(block_descriptor >> 4 & 7)
        if block_max is None:
            return None
        pos += 6
        if flags & 0x08:  # the content size: exact
            total += int.from_bytes(view[pos : pos + 8], "little")
            pos += 8
            block_max = 0
        pos += (4 if flags & 0x01 else 0) + 1  # dictionary id, header checksum
        while True:
            size = int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
            if size == 0:  # the end mark
                break
            stored = size & 0x80000000
            size &= 0x7FFFFFFF
            total += size if stored and block_max else block_max
            pos += size + (4 if flags & 0x10 else 0)  # block checksums
        if flags & 0x04:  # a content checksum
            pos += 4
    return total


_INTO = {
    GZIP: cramjam.gzip.decompress_into,
    LZ4: cramjam.lz4.decompress_into,
    ZSTD: cramjam.zstd.decompress_into,
}


def _snappy_bounded(data, max_bytes: int):
    view = memoryview(data)
    if bytes(view[: len(XERIAL_MAGIC)]) != XERIAL_MAGIC:
        _check_snappy_length(cramjam.snappy.decompress_raw_len(view), max_bytes)
        return cramjam.snappy.decompress_raw(view)
    blocks = []
    total = 0
    for block in _xerial_blocks(view):
        total += cramjam.snappy.decompress_raw_len(block)
        _check_snappy_length(total, max_bytes)
        blocks.append(block)
    out = bytearray(total)
    at = 0
    for block in blocks:
        at += cramjam.snappy.decompress_raw_into(block, memoryview(out)[at:])
    if at != total:
        raise CorruptRecordError(f"snappy blocks declare {total} bytes but decompress to {at}")
    return out


def _check_snappy_length(length: int, max_bytes: int) -> None:
    if length > max_bytes:
        raise CorruptRecordError(
            f"snappy records section declares {length} decompressed bytes, more than "
            f"{max_bytes}: refused as a decompression bomb"
        )
