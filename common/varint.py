"""Kafka's unsigned varint writer, shared by the wire codecs and the record batch codec (pure, no imports).

Protobuf-style base-128: 7 bits a byte, least significant first, the high
bit set on every byte but the last. The wire's flexible versions (KIP-482)
write lengths and tags with it; a batch's records write zigzag-folded
signed values with it (`storage.batch_records`).
"""

from __future__ import annotations


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (7 bits a byte, least significant first)."""
    assert value >= 0
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
