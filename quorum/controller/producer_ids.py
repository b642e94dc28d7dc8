"""AllocateProducerIds: hand brokers blocks of producer ids (KIP-730).

Theory of operation
-------------------
Producer ids must be unique across the cluster for idempotence and
transactions. The controller owns the watermark `next_producer_id` in the
image; a broker asks for a block, gets `[next, next + block_size)`, and a
`ProducerIdsRecord` moves the watermark past it. Because the watermark only
moves through the log, a block is never handed out twice, even across
controller failover. Only a registered broker at its current epoch may ask.
"""

from __future__ import annotations

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest, AllocateProducerIdsResponse
from kio.schema.errors import ErrorCode

from quorum.controller.config import ControllerConfig
from quorum.controller.result import NO_THROTTLE, ControllerResult
from quorum.metadata.image import MetadataImage
from quorum.metadata.records import ProducerIdsRecord

MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdControlManager:
    def __init__(self, config: ControllerConfig) -> None:
        self._block_size = config.producer_id_block_size

    def allocate_producer_ids(self, request: AllocateProducerIdsRequest, image: MetadataImage,
                              now_ms: int) -> ControllerResult[AllocateProducerIdsResponse]:
        def refuse(error: ErrorCode) -> ControllerResult[AllocateProducerIdsResponse]:
            return ControllerResult((), AllocateProducerIdsResponse(
                throttle_time=NO_THROTTLE, error_code=error, producer_id_start=-1, producer_id_len=0))

        reg = image.brokers.get(request.broker_id)
        if reg is None:
            return refuse(ErrorCode.broker_id_not_registered)
        if reg.epoch != request.broker_epoch:
            return refuse(ErrorCode.stale_broker_epoch)
        start = image.next_producer_id
        if start + self._block_size > MAX_PRODUCER_ID:
            return refuse(ErrorCode.unknown_server_error)  # the 63-bit id space is exhausted
        record = ProducerIdsRecord(broker_id=reg.broker_id, broker_epoch=reg.epoch,
                                   next_producer_id=start + self._block_size)
        return ControllerResult((record,), AllocateProducerIdsResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.none, producer_id_start=start,
            producer_id_len=self._block_size))
