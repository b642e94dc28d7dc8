"""What a controller decision returns: records to append and the response to send."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kio.static.primitive import i32Timedelta

from quorum.controller.errors import ControllerUsageError
from quorum.metadata.records import Record

ResponseT = TypeVar("ResponseT")

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))
"""`throttle_time` of every controller response: raftka does not throttle."""


@dataclass(frozen=True, slots=True)
class ControllerResult(Generic[ResponseT]):
    """Records to append to the metadata log, and the response they lead to.

    The driver appends `records` as one batch (contiguous offsets, all or
    nothing), applies them to its working image at those offsets, and sends
    `respond(base_offset)` once the log is committed through the batch -- or,
    when `records` is empty, through everything appended before it (a
    read-after-write, as Kafka's controller does).

    `respond(base_offset)` returns `response`, except when the response
    carries a value known only after the append: the broker epoch of a
    BrokerRegistration is the offset of its `RegisterBrokerRecord`, i.e.
    `base_offset + broker_epoch_record_index`.
    """

    records: tuple[Record, ...]
    response: ResponseT
    broker_epoch_record_index: int | None = None

    def __post_init__(self) -> None:
        if self.broker_epoch_record_index is not None:
            assert 0 <= self.broker_epoch_record_index < len(self.records)

    def respond(self, base_offset: int | None = None) -> ResponseT:
        """The response to send; `base_offset` is the offset `records[0]` was appended at."""
        if self.broker_epoch_record_index is None:
            return self.response
        if base_offset is None or base_offset < 0:
            raise ControllerUsageError(
                "ControllerResult.respond needs the offset records[0] was appended at: the broker epoch is "
                "the offset of the RegisterBroker record")
        epoch: Any = base_offset + self.broker_epoch_record_index
        return dataclasses.replace(self.response, broker_epoch=epoch)  # type: ignore[type-var]
