"""Storage errors: what was wrong with the bytes or the request, and what to do.

Each maps to one Kafka error code at the broker's edge (the broker turns
them into codes in responses; they never cross the network as exceptions):

| exception                    | Kafka error code            |
| ---------------------------- | --------------------------- |
| CorruptRecordError           | CORRUPT_MESSAGE (2)         |
| InvalidRecordError           | INVALID_RECORD (87)         |
| InvalidTimestampError        | INVALID_TIMESTAMP (32)      |
| RecordTooLargeError          | MESSAGE_TOO_LARGE (10)      |
| OffsetOutOfRangeError        | OFFSET_OUT_OF_RANGE (1)     |
| UnsupportedCompressionError  | UNSUPPORTED_COMPRESSION_TYPE (76) |

`InvalidRecordError` subclasses `CorruptRecordError` (and
`InvalidTimestampError` subclasses it), so code that only catches the
latter still catches them; check the subclass first when mapping to an
error code.
"""

from common.errors import RaftkaError


class StorageError(RaftkaError):
    """Root of errors raised by the storage engine."""


class CorruptRecordError(StorageError):
    """Bytes that are not a well-formed v2 record batch: bad CRC, bad magic,
    impossible length, truncated. `position` is the byte position of the
    batch in the buffer it was read from, when known."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class InvalidRecordError(CorruptRecordError):
    """A batch whose CRC holds that a client may not send: its record count
    disagrees with its offset range, it is empty, or its records do not
    parse or break a topic rule (LogValidator's checks on client batches,
    `storage.record_validation`). `record_errors` names the records at
    fault, `(index in the batch, message)`, as KIP-467's ProduceResponse
    carries them."""

    def __init__(self, message: str, position: int | None = None, record_errors=()) -> None:
        super().__init__(message, position)
        self.record_errors: tuple[tuple[int, str], ...] = tuple(record_errors)


class InvalidTimestampError(InvalidRecordError):
    """A CreateTime record whose timestamp is further from the broker's
    clock than the topic's `message.timestamp.before.max.ms` /
    `message.timestamp.after.max.ms` allow."""


class RecordTooLargeError(StorageError):
    """A batch larger than the topic's `max.message.bytes` (broker default
    `message.max.bytes`)."""

    def __init__(self, message: str, size_in_bytes: int, max_message_bytes: int) -> None:
        super().__init__(message)
        self.size_in_bytes = size_in_bytes
        self.max_message_bytes = max_message_bytes


class OffsetOutOfRangeError(StorageError):
    """A read asked for an offset outside [log_start_offset, log_end_offset]."""

    def __init__(
        self, message: str, log_start_offset: int | None = None, log_end_offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class UnsupportedCompressionError(StorageError):
    """A compression codec id raftka does not know (Kafka has 0..4)."""


# --- Log engine errors (storage/log.py and friends) ---


class CorruptIndexError(StorageError):
    """An `.index` or `.timeindex` file that cannot belong to its segment.
    The log never lets this escape: it rebuilds the index from the segment."""


class CorruptCheckpointError(StorageError):
    """A checkpoint file (`recovery-point-offset-checkpoint`,
    `leader-epoch-checkpoint`, ...) that is not in Kafka's text format: a
    version line `0`, a count line, then that many entries."""


class UnexpectedAppendOffsetError(StorageError):
    """A follower append whose first offset is below the log end offset:
    the replica must truncate (by leader epoch) before appending again."""

    def __init__(self, message: str, first_offset: int, log_end_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset
