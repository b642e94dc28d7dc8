"""Helpers shared by the storage log tests."""

import struct

from storage.batch import build_batch

BASE_TS = 1_700_000_000_000


def batch(n=1, *, value_size=10, ts=BASE_TS, base_offset=0, epoch=-1, key=b"k"):
    """A client batch of `n` records, timestamps ts, ts+1, ..."""
    return build_batch(
        [(key, bytes([65 + i % 26]) * value_size, (), ts + i) for i in range(n)],
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )


def as_stored(raw: bytes, base_offset: int, epoch: int | None = None) -> bytes:
    """`raw` with the base offset (and epoch) the log writes into it."""
    out = bytearray(raw)
    struct.pack_into(">q", out, 0, base_offset)
    if epoch is not None:
        struct.pack_into(">i", out, 12, epoch)
    return bytes(out)
