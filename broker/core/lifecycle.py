"""The broker's side of its lifecycle with the active controller (KIP-631), as a pure state machine.

Theory of operation
-------------------
A broker registers once per process (BrokerRegistration with a fresh
incarnation id; the answer's broker epoch is the offset of its
RegisterBroker record) and then heartbeats for as long as it runs. Every
heartbeat carries the offset of the newest metadata record the broker has
applied; the controller unfences the broker once that offset has reached
its registration record (it has seen itself register, so its image is at
least that recent) and the broker no longer asks to stay fenced.

`BrokerLifecycle` decides *what to send and when*; the shell
(`broker.shell.quorum_link`) sends it and feeds the answer back. At most one
request is in flight. States, as Kafka's `BrokerState` names them:

    STARTING    => RECOVERY      registration accepted: the broker epoch is known
    RECOVERY    => RUNNING       a heartbeat answer says not fenced
    RECOVERY,   => PENDING_      `begin_controlled_shutdown`: heartbeats now say
    RUNNING        CONTROLLED_   want_shut_down, and the controller moves
                   SHUTDOWN      leadership away and shrinks ISRs (KIP-631)
    PENDING_    => SHUTTING_     a heartbeat answer says should_shut_down
    CONTROLLED_    DOWN
    SHUTDOWN
    STARTING    => SHUTTING_DOWN `begin_controlled_shutdown` before registering:
                                 the cluster never saw this process, nothing to hand over
    RECOVERY,   => STARTING      the controller no longer knows this registration
    RUNNING                      (BROKER_ID_NOT_REGISTERED, STALE_BROKER_EPOCH):
                                 register again

Timing. A RUNNING broker heartbeats every `broker.heartbeat.interval.ms`;
so that a session (`broker.session.timeout.ms`) never lapses between two
heartbeats of a live broker, the interval must be well below it. While it
waits for something (to be unfenced, to be let go) it heartbeats every
`fast_heartbeat_ms`, as Kafka's lifecycle manager heartbeats at once after
each answer in those states. A failed request (no controller answered) is
retried after `retry_backoff_ms`, doubling up to the heartbeat interval.

Offline log dirs. `offline_log_dirs` (the ids of the broker's failed log
dirs, set by the shell) goes in every heartbeat, as Kafka's broker lists
them (KIP-858): the controller then moves the leadership of the replicas
the broker assigns to them.

`ready_to_unfence` is the shell's: it is true once the broker has
published its first metadata image (opened its logs), and until then
heartbeats say want_fence, as Kafka's `setReadyToUnfence` does.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest, BrokerRegistrationResponse
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.errors import ErrorCode

FAST_HEARTBEAT_MS = 100
RETRY_BACKOFF_MS = 100
PLAINTEXT_SECURITY_PROTOCOL = 0


class BrokerState(enum.Enum):
    STARTING = "STARTING"
    RECOVERY = "RECOVERY"
    RUNNING = "RUNNING"
    PENDING_CONTROLLED_SHUTDOWN = "PENDING_CONTROLLED_SHUTDOWN"
    SHUTTING_DOWN = "SHUTTING_DOWN"


@dataclass(frozen=True)
class ListenerSpec:
    name: str
    host: str
    port: int
    #: Kafka's SecurityProtocol id (0 PLAINTEXT, 1 SSL, 2 SASL_PLAINTEXT, 3 SASL_SSL).
    security_protocol: int = PLAINTEXT_SECURITY_PROTOCOL


class BrokerLifecycle:
    """What the broker says to the controller next; see the module docstring."""

    def __init__(
        self,
        *,
        broker_id: int,
        cluster_id: str,
        incarnation_id: uuid.UUID,
        listeners: tuple[ListenerSpec, ...],
        rack: str | None,
        heartbeat_interval_ms: int,
        now_ms: int,
        fast_heartbeat_ms: int = FAST_HEARTBEAT_MS,
        retry_backoff_ms: int = RETRY_BACKOFF_MS,
    ) -> None:
        assert listeners, "a broker registers at least one listener"
        assert heartbeat_interval_ms > 0 and fast_heartbeat_ms > 0 and retry_backoff_ms > 0
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.incarnation_id = incarnation_id
        self.listeners = listeners
        self.rack = rack
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.fast_heartbeat_ms = min(fast_heartbeat_ms, heartbeat_interval_ms)
        self.retry_backoff_ms = retry_backoff_ms
        self.state = BrokerState.STARTING
        self.broker_epoch = -1
        #: The controller's last word: is this broker fenced / caught up?
        self.fenced = True
        self.caught_up = False
        #: The epoch of the previous registration of this process, if any
        #: (BrokerRegistration v3+ `previous_broker_epoch`).
        self._previous_epoch = -1
        self._next_send_ms = now_ms
        self._in_flight: Any = None
        self._failures = 0
        self.last_error: str | None = None
        #: The ids of this broker's offline log dirs (module doc).
        self.offline_log_dirs: tuple[uuid.UUID, ...] = ()

    # --- queries ------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The controlled shutdown is over (or was never needed)."""
        return self.state is BrokerState.SHUTTING_DOWN

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def wake_at_ms(self) -> int | None:
        """When `poll` next has something to send (None: only after an answer)."""
        if self._in_flight is not None or self.done:
            return None
        return self._next_send_ms

    # --- what to send -----------------------------------------------------------

    def poll(self, now_ms: int, metadata_offset: int, ready_to_unfence: bool) -> Any:
        """The request to send now, or None. A returned request is in flight
        until `on_response` or `on_failure`."""
        if self._in_flight is not None or self.done or now_ms < self._next_send_ms:
            return None
        if self.state is BrokerState.STARTING:
            request: Any = BrokerRegistrationRequest(
                broker_id=self.broker_id, cluster_id=self.cluster_id, incarnation_id=self.incarnation_id,
                listeners=tuple(Listener(name=l.name, host=l.host, port=l.port,
                                         security_protocol=l.security_protocol) for l in self.listeners),
                features=(), rack=self.rack, previous_broker_epoch=self._previous_epoch)
        else:
            shutting = self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN
            request = BrokerHeartbeatRequest(
                broker_id=self.broker_id, broker_epoch=self.broker_epoch, current_metadata_offset=metadata_offset,
                want_fence=not ready_to_unfence and not shutting, want_shut_down=shutting,
                offline_log_dirs=self.offline_log_dirs)
        self._in_flight = request
        return request

    def poll_now(self) -> None:
        """Send the next heartbeat as soon as nothing is in flight (the
        broker caught up, or became ready to unfence)."""
        self._next_send_ms = min(self._next_send_ms, 0)

    # --- answers ---------------------------------------------------------------

    def on_response(self, response: Any, now_ms: int) -> None:
        request, self._in_flight = self._in_flight, None
        assert request is not None, "an answer without a request in flight"
        error = ErrorCode(response.error_code)
        if isinstance(request, BrokerRegistrationRequest):
            assert isinstance(response, BrokerRegistrationResponse)
            self._on_registration(response, error, now_ms)
        else:
            assert isinstance(response, BrokerHeartbeatResponse)
            self._on_heartbeat(response, error, now_ms)

    def on_failure(self, reason: str, now_ms: int) -> None:
        """No controller answered the request in flight; retry with backoff."""
        assert self._in_flight is not None, "a failure without a request in flight"
        self._in_flight = None
        self._retry_later(reason, now_ms)

    def begin_controlled_shutdown(self, now_ms: int) -> None:
        if self.state is BrokerState.STARTING:
            self.state = BrokerState.SHUTTING_DOWN
        elif self.state in (BrokerState.RECOVERY, BrokerState.RUNNING):
            self.state = BrokerState.PENDING_CONTROLLED_SHUTDOWN
            self._next_send_ms = now_ms

    # --- internals ---------------------------------------------------------------

    def _on_registration(self, response: BrokerRegistrationResponse, error: ErrorCode, now_ms: int) -> None:
        if self.state is not BrokerState.STARTING:
            return  # a shutdown began while registering; that answer changes nothing
        if error is not ErrorCode.none:
            # DUPLICATE_BROKER_REGISTRATION: the previous process with this id
            # still has a session; it expires within broker.session.timeout.ms.
            self._retry_later(f"BrokerRegistration: {error.name.upper()}", now_ms)
            return
        self._failures = 0
        self.last_error = None
        self.broker_epoch = self._previous_epoch = response.broker_epoch
        self.state = BrokerState.RECOVERY
        self.fenced = True
        self._next_send_ms = now_ms

    def _on_heartbeat(self, response: BrokerHeartbeatResponse, error: ErrorCode, now_ms: int) -> None:
        if self.done:
            return
        if error in (ErrorCode.broker_id_not_registered, ErrorCode.stale_broker_epoch):
            if self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN:
                # The controller forgot us: nobody waits for a hand-over.
                self.state = BrokerState.SHUTTING_DOWN
                return
            self.state = BrokerState.STARTING
            self._retry_later(f"BrokerHeartbeat: {error.name.upper()}; registering again", now_ms)
            return
        if error is not ErrorCode.none:
            self._retry_later(f"BrokerHeartbeat: {error.name.upper()}", now_ms)
            return
        self._failures = 0
        self.last_error = None
        self.fenced = response.is_fenced
        self.caught_up = response.is_caught_up
        if self.state is BrokerState.PENDING_CONTROLLED_SHUTDOWN:
            if response.should_shut_down:
                self.state = BrokerState.SHUTTING_DOWN
                return
            self._next_send_ms = now_ms + self.fast_heartbeat_ms
            return
        if self.state is BrokerState.RECOVERY and not response.is_fenced:
            self.state = BrokerState.RUNNING
        interval = self.heartbeat_interval_ms if self.state is BrokerState.RUNNING else self.fast_heartbeat_ms
        self._next_send_ms = now_ms + interval

    def _retry_later(self, reason: str, now_ms: int) -> None:
        self.last_error = reason
        self._failures += 1
        backoff = min(self.retry_backoff_ms * 2 ** min(self._failures - 1, 10), self.heartbeat_interval_ms)
        self._next_send_ms = now_ms + backoff
