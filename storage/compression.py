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
