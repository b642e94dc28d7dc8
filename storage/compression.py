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


def _xerial_snappy_decompress(data) -> bytes:
    view = memoryview(data)
    pos = len(_XERIAL_HEADER)
    if len(view) < pos:
        raise CorruptRecordError("xerial snappy stream shorter than its 16-byte header")
    out = bytearray()
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
        out += cramjam.snappy.decompress_raw(view[pos : pos + length])
        pos += length
    return bytes(out)


# The most a byte of each codec's stream can expand to: deflate's longest
# match (258 bytes) in about two bits, an lz4 match length byte (255). A
# stream that short decompresses within the limit whatever it holds, so it
# is decoded in one call; zstd's RLE blocks reach 32768x, so a zstd stream
# of more than 2 KB, and longer gzip and lz4 streams, take the bounded path.
_MAX_RATIO = {GZIP: 1032, LZ4: 255, ZSTD: 32768}
_PLAIN = {GZIP: cramjam.gzip.decompress, LZ4: cramjam.lz4.decompress, ZSTD: cramjam.zstd.decompress}
# The bounded path's first guess at the decompressed size, then fourfold.
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
        size = min(max_bytes, max(_MIN_GUESS_BYTES, _FIRST_GUESS_RATIO * len(data)))
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
                size = min(max_bytes, size * _GROWTH)
                continue
            return memoryview(out)[:n]
    except cramjam.DecompressionError as e:
        raise CorruptRecordError(
            f"{CODEC_NAMES[codec_id]} records section does not decompress: {e}"
        ) from None


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
        block = view[pos : pos + length]
        total += cramjam.snappy.decompress_raw_len(block)
        _check_snappy_length(total, max_bytes)
        blocks.append(block)
        pos += length
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
