"""Helpers shared by the compaction tests."""

from storage.batch import iter_batch_headers, iter_records

BASE_TS = 1_700_000_000_000


def log_records(log):
    """Every record a consumer reading from the log start gets:
    `(offset, key, value, timestamp, headers)`."""
    out = []
    if log.log_end_offset == log.log_start_offset:
        return out
    data = log.read_bytes(log.log_start_offset, 1 << 30)
    for position, _header in iter_batch_headers(data):
        for r in iter_records(data, position):
            out.append((r.offset, r.key, r.value, r.timestamp, r.headers))
    return out


def log_batches(log):
    """`(header, batch bytes)` of every batch from the log start."""
    if log.log_end_offset == log.log_start_offset:
        return []
    data = log.read_bytes(log.log_start_offset, 1 << 30)
    return [(h, data[p : p + h.size_in_bytes]) for p, h in iter_batch_headers(data)]


def replay(records):
    """What a consumer that applies every record in order ends up with:
    key -> value, a tombstone deleting its key."""
    table = {}
    for _offset, key, value, *_rest in records:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table
