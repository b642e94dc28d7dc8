"""The records section of a v2 batch: zigzag varints and the record layout.

Theory of operation
-------------------
Inside a v2 batch (after decompression) each record is

    length varint            bytes of the rest of this record
    attributes int8          unused, 0
    timestamp_delta varlong  from the batch's base_timestamp
    offset_delta varint      from the batch's base_offset
    key_length varint, key   -1 for a null key
    value_length varint, value
    header_count varint
    headers                  [key_length varint, key UTF-8,
                              value_length varint, value (-1: null)]

Varints are protobuf-style base-128 with zigzag sign folding
(`(n << 1) ^ (n >> 63)`), as Kafka's ByteUtils writes them. Decoding checks
every length against the bytes left and raises CorruptRecordError, never
IndexError. This is per-record Python work: keep it off the produce path.
"""

from typing import NamedTuple

from common.frozen import new_tuple
from common.varint import uvarint
from storage.errors import CorruptRecordError

# A varlong takes at most 10 bytes, a varint 5 (Kafka rejects longer ones).
_MAX_VARLONG_BYTES = 10
_MAX_VARINT_BYTES = 5
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class Record(NamedTuple):
    """One decoded record. `headers` is a tuple of (str, bytes | None)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _zigzag_bytes(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63))


# Lengths and deltas are mostly small: precompute their encodings.
_SMALL = {n: _zigzag_bytes(n) for n in range(-1, 8192)}


def write_varint(out: bytearray, n: int) -> None:
    """Append the zigzag varint encoding of `n` (a signed 64-bit int)."""
    small = _SMALL.get(n)
    if small is not None:
        out += small
        return
    assert -(1 << 63) <= n < (1 << 63), f"{n} does not fit a varlong"
    out += _zigzag_bytes(n)


def _read_varint(data, pos: int, max_bytes: int = _MAX_VARLONG_BYTES) -> tuple[int, int]:
    """Decode a zigzag varint at `pos`; return `(value, next_pos)`.

    Raises IndexError past the end of `data`; `decode_records` turns that
    into CorruptRecordError once for the whole section."""
    b = data[pos]
    if b < 0x80:  # the common case: lengths and deltas under 64
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    start = pos
    pos += 1
    while True:
        if pos - start >= max_bytes:
            raise CorruptRecordError(f"varint at byte {start} is longer than {max_bytes} bytes")
        b = data[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += _SMALL[-1]
    else:
        write_varint(out, len(data))
        out += data


def encode_record(
    out: bytearray,
    timestamp_delta: int,
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers,
) -> None:
    """Append one record (with its length prefix) to `out`."""
    body = bytearray(b"\x00")  # attributes
    write_varint(body, timestamp_delta)
    write_varint(body, offset_delta)
    _write_bytes(body, key)
    _write_bytes(body, value)
    headers = headers or ()
    write_varint(body, len(headers))
    for header_key, header_value in headers:
        if isinstance(header_key, str):
            header_key = header_key.encode()
        _write_bytes(body, header_key)
        _write_bytes(body, header_value)
    write_varint(out, len(body))
    out += body


def _read_bytes(data, pos: int, what: str) -> tuple[bytes | None, int]:
    length, pos = _read_varint(data, pos, _MAX_VARINT_BYTES)
    if length < 0:
        if length != -1:
            raise CorruptRecordError(f"{what} length {length} at byte {pos} is negative")
        return None, pos
    end = pos + length
    if end > len(data):
        raise CorruptRecordError(
            f"{what} of {length} bytes at byte {pos} runs past the records section "
            f"({len(data)} bytes)"
        )
    return bytes(data[pos:end]), end


def _read_headers(data, pos: int, header_count: int) -> tuple[tuple, int]:
    if header_count < 0:
        raise CorruptRecordError(f"header count {header_count} at byte {pos} is negative")
    headers = []
    for _ in range(header_count):
        header_key, pos = _read_bytes(data, pos, "header key")
        if header_key is None:
            raise CorruptRecordError(f"null header key before byte {pos}")
        header_value, pos = _read_bytes(data, pos, "header value")
        try:
            headers.append((header_key.decode(), header_value))
        except UnicodeDecodeError:
            raise CorruptRecordError(f"header key before byte {pos} is not UTF-8") from None
    return tuple(headers), pos


def decode_records(
    data,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> list[Record]:
    """Decode exactly `count` records filling all of `data`.

    `log_append_time`, when not None, replaces every record's timestamp
    (a LogAppendTime batch carries the broker's time in max_timestamp).
    """
    records = []
    pos = 0
    end = len(data)
    read_varint = _read_varint
    read_bytes = _read_bytes
    new_record = new_tuple
    # A varint under 0x80 is one byte: read inline, without a call. Most
    # fields of most records are (deltas and lengths under 64, the null
    # key, no headers); the Raft observer decodes every metadata record
    # this way, 10,000 of them per survivor in a 10,000-partition fence
    # (as in `raftka bench failover --led-partitions 10000`).
    try:
        for _ in range(count):
            length, pos = read_varint(data, pos, _MAX_VARINT_BYTES)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise CorruptRecordError(
                    f"record of {length} bytes at byte {pos} does not fit the records "
                    f"section ({end} bytes)"
                )
            pos += 1  # attributes: unused by every record format so far
            b = data[pos]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                timestamp_delta, pos = read_varint(data, pos)
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = read_varint(data, pos, _MAX_VARINT_BYTES)
            if data[pos] == 1:  # the null key: length -1
                key = None
                pos += 1
            else:
                key, pos = read_bytes(data, pos, "key")
            value, pos = read_bytes(data, pos, "value")
            if data[pos] == 0:  # no headers
                headers = ()
                pos += 1
            else:
                header_count, pos = read_varint(data, pos, _MAX_VARINT_BYTES)
                headers = ()
                if header_count:
                    headers, pos = _read_headers(data, pos, header_count)
            if pos != record_end:
                raise CorruptRecordError(
                    f"record ending at byte {pos} declared length {length} "
                    f"(ends at {record_end})"
                )
            timestamp = (
                base_timestamp + timestamp_delta if log_append_time is None else log_append_time
            )
            records.append(new_record(Record, (base_offset + offset_delta, timestamp, key, value, headers)))
    except IndexError:
        raise CorruptRecordError(
            f"records section ({end} bytes) ends inside record {len(records)}"
        ) from None
    if pos != end:
        raise CorruptRecordError(
            f"records section has {end - pos} bytes left after its {count} records"
        )
    return records
