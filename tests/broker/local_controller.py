"""An in-process controller: the real decisions, no quorum (test fixtures).

Theory of operation
-------------------
`LocalController` runs `quorum.controller.QuorumController` -- the same
pure decision functions the active controller runs -- against an image it
keeps itself, and publishes every new image to its subscribers (brokers'
`on_metadata_update`). It is a `broker.shell.controller_channel.ControllerChannel`:
`send(request)` decides, "appends" the records (applies them at the next
offsets; optionally persists them), publishes, and answers.

It stands in for the Raft quorum in broker tests: there is one metadata log
writer and no replication, so "committed" means "applied". With `records_path`, the
records are appended to a file (length-prefixed CBOR, fsynced before the
answer) and replayed on start, so metadata survives a broker restart; a torn
last record is cut off.

`publish_lag_s` delays publishing after answering (a broker in a real
cluster sees an image some time after the controller commits it), so tests
exercise the broker's wait for its own image.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.errors import ErrorCode

from quorum.controller import ControllerConfig, QuorumController
from quorum.metadata import LoggedRecord, MetadataImage, decode_record, encode_record
from quorum.metadata.records import Record
from common.errors import RaftkaError

_FRAME = struct.Struct(">I")
#: The Raft epoch every record gets: a single writer never changes epoch.
LOCAL_EPOCH = 1

_log = logging.getLogger("broker.local_controller")


class LocalControllerError(RaftkaError):
    """The in-process controller refused a broker's registration or heartbeat;
    the message has the error code. Check cluster ids and broker ids."""


class LocalController:
    def __init__(
        self,
        *,
        cluster_id: str,
        config: ControllerConfig | None = None,
        seed: int = 0,
        records_path: str | None = None,
        clock_ms: Callable[[], int] | None = None,
        publish_lag_s: float = 0.0,
        nursery: trio.Nursery | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self.records_path = records_path
        self.image = MetadataImage()
        if records_path is not None:
            self.image = self.image.apply(_read_records(records_path))
        self.config = config or ControllerConfig(cluster_id=cluster_id)
        # No broker heartbeated while this controller was down: start with
        # every replayed broker's session already expired, so a restarted
        # broker may register again at once (instead of waiting out
        # broker.session.timeout.ms for DUPLICATE_BROKER_REGISTRATION).
        sessions_start_ms = self.clock_ms() - self.config.broker_session_timeout_ms - 1
        self.controller = QuorumController(self.image, sessions_start_ms, self.config, rng=random.Random(seed))
        self.publish_lag_s = publish_lag_s
        self._nursery = nursery
        if publish_lag_s and nursery is None:
            raise LocalControllerError("publish_lag_s needs a nursery to publish from")
        self._subscribers: list[Callable[[MetadataImage], None]] = []
        #: Requests decided, by class name (tests check what was forwarded).
        self.requests_seen: list[str] = []

    def subscribe(self, on_image: Callable[[MetadataImage], None]) -> None:
        """Call `on_image(image)` with every new image (not the current one)."""
        self._subscribers.append(on_image)

    # --- ControllerChannel ----------------------------------------------

    async def send(self, request: Any) -> Any:
        self.requests_seen.append(type(request).__name__)
        result = self.controller.handle(request, self.image, self.clock_ms())
        base_offset = self.append(result.records)
        await trio.lowlevel.checkpoint()
        return result.respond(base_offset)

    def append(self, records: tuple[Record, ...] | list[Record]) -> int | None:
        """Apply `records` at the next offsets and publish; their base offset."""
        if not records:
            return None
        base_offset = self.image.offset + 1
        logged = [LoggedRecord(base_offset + i, LOCAL_EPOCH, r) for i, r in enumerate(records)]
        if self.records_path is not None:
            _append_records(self.records_path, records)
        self.image = self.image.apply(logged)
        if self.publish_lag_s:
            assert self._nursery is not None
            self._nursery.start_soon(self._publish_later, self.image)
        else:
            self._publish(self.image)
        return base_offset

    def tick(self) -> None:
        """Fence brokers whose session expired (the controller's timer)."""
        self.append(self.controller.tick(self.image, self.clock_ms()))

    def _publish(self, image: MetadataImage) -> None:
        for on_image in self._subscribers:
            on_image(image)

    async def _publish_later(self, image: MetadataImage) -> None:
        await trio.sleep(self.publish_lag_s)
        if image.offset == self.image.offset:
            self._publish(image)

    # --- broker lifecycle helpers ---------------------------------------

    async def register_broker(self, broker_id: int, host: str, port: int, *, listener_name: str = "PLAINTEXT",
                              rack: str | None = None) -> int:
        """Register a broker and unfence it, as its lifecycle manager would
        (BrokerRegistration, then a heartbeat once caught up); its epoch."""
        answer = await self.send(BrokerRegistrationRequest(
            broker_id=broker_id, cluster_id=self.cluster_id, incarnation_id=uuid.uuid4(),
            listeners=(Listener(name=listener_name, host=host, port=port, security_protocol=0),),
            features=(), rack=rack))
        if answer.error_code != ErrorCode.none:
            raise LocalControllerError(f"BrokerRegistration of {broker_id}: {ErrorCode(answer.error_code).name}")
        epoch = answer.broker_epoch
        heartbeat = await self.send(BrokerHeartbeatRequest(
            broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=self.image.offset,
            want_fence=False, want_shut_down=False))
        if heartbeat.error_code != ErrorCode.none or heartbeat.is_fenced:
            raise LocalControllerError(f"BrokerHeartbeat of {broker_id}: {ErrorCode(heartbeat.error_code).name}, "
                                       f"fenced={heartbeat.is_fenced}")
        _log.info("broker %d registered at epoch %d and unfenced", broker_id, epoch)
        return epoch

    async def controlled_shutdown(self, broker_id: int) -> None:
        """Move leadership off a broker and fence it, as its lifecycle
        manager does before a clean stop (KIP-631 controlled shutdown)."""
        for _ in range(10):
            registration = self.image.brokers.get(broker_id)
            if registration is None:
                return
            answer = await self.send(BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=registration.epoch, current_metadata_offset=self.image.offset,
                want_fence=False, want_shut_down=True))
            if answer.error_code != ErrorCode.none or answer.should_shut_down:
                return
        _log.warning("broker %d did not finish its controlled shutdown", broker_id)


def _append_records(path: str, records) -> None:
    data = bytearray()
    for record in records:
        raw = encode_record(record)
        data += _FRAME.pack(len(raw)) + raw
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_records(path: str) -> list[LoggedRecord]:
    """The records in `path`, at offsets 0, 1, ...; a torn tail is cut off."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    out: list[LoggedRecord] = []
    pos = 0
    while pos + _FRAME.size <= len(data):
        (size,) = _FRAME.unpack_from(data, pos)
        if pos + _FRAME.size + size > len(data):
            break
        out.append(LoggedRecord(len(out), LOCAL_EPOCH, decode_record(data[pos + 4 : pos + 4 + size])))
        pos += _FRAME.size + size
    if pos < len(data):
        _log.warning("%s: cutting a torn record at byte %d", path, pos)
        os.truncate(path, pos)
    return out
