"""Compression codecs: framings other clients send, corrupt payloads, bad ids."""

import struct

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from storage.batch import (
    CRC_START_OFFSET,
    HEADER_SIZE,
    build_batch,
    build_control_batch,
    iter_records,
    validate_batch,
)
from storage.compression import XERIAL_MAGIC, compress, decompress
from storage.errors import CorruptRecordError, InvalidRecordError, UnsupportedCompressionError

_TEXT = b"".join(b"line %d of a log that compresses well\n" % i for i in range(5000))


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_compress_round_trip_of_a_large_payload(codec):
    packed = compress(codec, _TEXT)
    if codec:
        assert len(packed) < len(_TEXT) // 3
    assert decompress(codec, packed) == _TEXT


def test_snappy_writes_xerial_blocks_of_32_kib():
    packed = compress(2, _TEXT)
    assert packed.startswith(XERIAL_MAGIC + struct.pack(">ii", 1, 1))
    pos, blocks = 16, []
    while pos < len(packed):
        (n,) = struct.unpack_from(">i", packed, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + n])))
        pos += 4 + n
    assert pos == len(packed)
    assert [len(b) for b in blocks[:-1]] == [32 * 1024] * (len(blocks) - 1)
    assert b"".join(blocks) == _TEXT


def test_snappy_reads_raw_blocks_as_librdkafka_sends():
    assert decompress(2, bytes(cramjam.snappy.compress_raw(_TEXT))) == _TEXT


def test_snappy_ignores_xerial_version_fields():
    # Some producers write the two version ints little-endian; only the magic matters.
    block = bytes(cramjam.snappy.compress_raw(b"hello"))
    stream = XERIAL_MAGIC + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decompress(2, stream) == b"hello"


@pytest.mark.parametrize("codec", [1, 3, 4])
def test_concatenated_frames_decode_as_one_stream(codec):
    assert decompress(codec, compress(codec, b"hello ") + compress(codec, b"world")) == (
        b"hello world"
    )


def _with_section(batch: bytes, section: bytes) -> bytes:
    """Replace the records section and fix length and CRC: a well-framed batch
    whose compressed payload is wrong."""
    buf = bytearray(batch[:HEADER_SIZE] + section)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[CRC_START_OFFSET:])))
    return bytes(buf)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_bad_compressed_section_is_corrupt(codec, damage):
    batch = build_batch([(b"k", _TEXT[:2000], (), 1)], compression=codec)
    section = batch[HEADER_SIZE:]
    section = {
        "garbage": b"\x07not compressed data at all" * 3,
        "truncated": section[: len(section) // 2],
        "empty": b"",
    }[damage]
    bad = _with_section(batch, section)
    validate_batch(bad)  # the frame and CRC are fine; only decoding finds it
    with pytest.raises(CorruptRecordError):
        list(iter_records(bad))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_ids(codec):
    with pytest.raises(UnsupportedCompressionError, match=f"codec id {codec}"):
        compress(codec, b"x")
    with pytest.raises(UnsupportedCompressionError):
        decompress(codec, b"x")
    buf = bytearray(build_batch([(b"k", b"v", (), 1)]))
    struct.pack_into(">h", buf, 21, codec)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[CRC_START_OFFSET:])))
    with pytest.raises(UnsupportedCompressionError, match=f"codec {codec}"):
        validate_batch(buf)


def test_client_may_not_send_control_batches():
    batch = build_control_batch(2, b"\x00\x00")
    assert validate_batch(batch).is_control
    with pytest.raises(InvalidRecordError, match="control"):
        validate_batch(batch, from_client=True)


def test_idempotent_client_batch_needs_a_sequence():
    ok = build_batch([(b"k", b"v", (), 1)], producer_id=5, producer_epoch=0, base_sequence=0)
    assert validate_batch(ok, from_client=True).producer_id == 5
    bad = build_batch([(b"k", b"v", (), 1)], producer_id=5, producer_epoch=0)
    with pytest.raises(InvalidRecordError, match="base_sequence -1"):
        validate_batch(bad, from_client=True)


@given(data=st.binary(max_size=70_000), codec=st.sampled_from([0, 1, 2, 3, 4]))
def test_random_payloads_round_trip(data, codec):
    assert decompress(codec, compress(codec, data)) == data


@given(data=st.binary(max_size=300), codec=st.sampled_from([1, 2, 3, 4]))
def test_random_bytes_never_escape_as_other_errors(data, codec):
    for payload in (data, XERIAL_MAGIC + data):
        try:
            decompress(codec, payload)
        except CorruptRecordError:
            pass


_blobs = st.none() | st.binary(max_size=30)
_record = st.tuples(
    _blobs,
    _blobs,
    st.lists(st.tuples(st.text(max_size=4), _blobs), max_size=2),
    st.integers(-1, 2**40),
)


@given(
    records=st.lists(_record, min_size=1, max_size=5),
    codec=st.sampled_from([0, 1, 2, 3, 4]),
    data=st.data(),
)
def test_damaged_records_section_with_a_good_crc_fails_cleanly(records, codec, data):
    """A writer bug (right CRC, wrong contents) must surface as CorruptRecordError,
    never as IndexError or UnicodeDecodeError from deep in the decoder."""
    batch = build_batch(records, compression=codec)
    section = bytearray(decompress(codec, batch[HEADER_SIZE:]))
    i = data.draw(st.integers(0, len(section) - 1))
    section[i] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(section)))
    bad = _with_section(batch, compress(codec, bytes(section[:cut])))
    try:
        list(iter_records(bad))
    except CorruptRecordError:
        pass
