"""Byte-rate quotas enforced on a broker, as Kafka's ClientQuotaManager does.

Each (user, client id) that some quota covers has a rate sensor: its bytes
in `quota.window.num` (11) samples of `quota.window.size.seconds` (1 s).
The rate is the bytes in the live samples over the time they span, never
less than 10 samples' worth (so a new client is not throttled for its first
burst's short span). A request that brings the rate above the quota Q is
answered with throttle_time_ms = the time until the rate is back at Q if
the client sends nothing ((rate - Q) / Q * span once the span is 10 s),
capped at the whole window, and the broker reads nothing more from the connection for that
time. Clients that know KIP-219 also wait that long themselves.

A `QuotaEnforcer` exists only while the image has a quota for its key
(`producer_byte_rate`, `consumer_byte_rate`): without one a request costs
one attribute lookup.
"""

from __future__ import annotations

from quorum.metadata.client_quotas import CONNECTION_CREATION_RATE, ip_quota, resolve
from quorum.metadata.pmap import PMap

WINDOW_NUM = 11
WINDOW_SIZE_S = 1.0


class RateSensor:
    """Bytes over the last `WINDOW_NUM` samples of `WINDOW_SIZE_S` each (Kafka's SampledStat Rate)."""

    __slots__ = ("starts", "totals")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.totals: list[float] = []

    def _purge(self, now: float) -> None:
        # Samples that ended a whole window ago no longer count.
        expired = now - WINDOW_NUM * WINDOW_SIZE_S
        while self.starts and self.starts[0] <= expired:
            del self.starts[0], self.totals[0]

    def record(self, now: float, n: float) -> None:
        self._purge(now)
        if not self.starts or now >= self.starts[-1] + WINDOW_SIZE_S:
            self.starts.append(now)
            self.totals.append(0.0)
            if len(self.starts) > WINDOW_NUM:
                del self.starts[0], self.totals[0]
        self.totals[-1] += n

    def measure(self, now: float) -> tuple[float, float]:
        """(rate in bytes/s, the span in seconds it is measured over)."""
        self._purge(now)
        if not self.starts:
            return 0.0, (WINDOW_NUM - 1) * WINDOW_SIZE_S
        # At least 10 windows, as Kafka pads a young sensor's span; not
        # rounded up to whole windows as Kafka does, which lets a new client
        # send up to one window's quota more in its first 10 s.
        span = max(now - self.starts[0], (WINDOW_NUM - 1) * WINDOW_SIZE_S)
        return sum(self.totals) / span, span


class QuotaEnforcer:
    """The sensors of one quota key; built again when the image's quotas change."""

    def __init__(self, key: str, quotas: PMap, sensors: dict | None = None) -> None:
        self.key = key
        self.quotas = quotas
        #: (user, client id) -> (quota bytes/s or None, the entity that sets it)
        self._bounds: dict[tuple[str | None, str], tuple[float | None, tuple]] = {}
        #: (user, client id) as the quota's entity names them -> its sensor.
        self.sensors: dict[tuple[str, str], RateSensor] = sensors if sensors is not None else {}

    def record(self, principal: str, client_id: str | None, nbytes: int, now: float) -> int:
        """Record `nbytes` for the client; the throttle time in ms it earned (0: within its quota)."""
        user = principal[5:] if principal.startswith("User:") else principal
        who = (user, client_id or "")
        bound = self._bounds.get(who)
        if bound is None:
            bound = self._bounds[who] = resolve(self.quotas, user, client_id or "", self.key)
        quota, entity = bound
        if quota is None:
            return 0
        # Kafka's metric tags: the user and client id the entity names by
        # type, so a default entity still gives each user (client id) its own
        # rate, and the client ids of a user-only quota share one.
        types = [t for t, _ in entity]
        key = (user if "user" in types else "", client_id or "" if "client-id" in types else "")
        sensor = self.sensors.get(key)
        if sensor is None:
            sensor = self.sensors[key] = RateSensor()
        sensor.record(now, nbytes)
        rate, span = sensor.measure(now)
        if rate <= quota:
            return 0
        # Until the window's bytes over the time since its first sample are
        # back at the quota. Once the span is 10 s or more this is Kafka's
        # (rate - Q) / Q * span; in a young sensor's padded span Kafka's
        # figure does not count that waiting does not lengthen the span, and
        # lets a client that waits exactly that long creep above its quota.
        throttle_s = rate * span / quota - (now - sensor.starts[0])
        return int(min(throttle_s, WINDOW_NUM * WINDOW_SIZE_S) * 1000)


def enforcer_for(key: str, quotas: PMap, previous: QuotaEnforcer | None) -> QuotaEnforcer | None:
    """The enforcer of `key` for the image's `quotas`, None when no quota sets `key`.
    Sensors carry over, so changing a quota does not forget what a client sent."""
    if not any(key in values for values in quotas.values()):
        return None
    return QuotaEnforcer(key, quotas, previous.sensors if previous is not None else None)


class ConnectionRateQuota:
    """connection_creation_rate per IP address (KIP-612): new connections
    per second from one address, over `WINDOW_NUM` windows of a second and
    at least one window (so a burst is refused from its first second). A
    connection that would take the rate above the quota is refused and not
    counted: a client that keeps trying is let in at the quota's rate."""

    def __init__(self, quotas: PMap, sensors: dict | None = None) -> None:
        self.quotas = quotas
        #: address -> its sensor (addresses without a quota have none).
        self.sensors: dict[str, RateSensor] = sensors if sensors is not None else {}

    def admit(self, address: str, now: float) -> str | None:
        """None to let the connection in, else why it is refused."""
        quota = ip_quota(self.quotas, address)
        if quota is None:
            return None
        sensor = self.sensors.get(address)
        if sensor is None:
            sensor = self.sensors[address] = RateSensor()
        sensor._purge(now)
        span = max(now - sensor.starts[0], WINDOW_SIZE_S) if sensor.starts else WINDOW_SIZE_S
        if (sum(sensor.totals) + 1) / span > quota:
            return (f"{address} is over its {CONNECTION_CREATION_RATE} of {quota:g} new connections a second "
                    f"(an ip quota; lift or raise it with `raftka quotas alter --ip {address}`)")
        sensor.record(now, 1)
        return None


def connection_quota_for(quotas: PMap, previous: ConnectionRateQuota | None) -> ConnectionRateQuota | None:
    """The connection-rate enforcer for the image's quotas, None when no ip entity sets one."""
    if not any(CONNECTION_CREATION_RATE in values for values in quotas.values()):
        return None
    return ConnectionRateQuota(quotas, previous.sensors if previous is not None else None)
