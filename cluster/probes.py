"""Readiness probes of a running cluster, over the Kafka protocol (common.wire).

- `quorum_caught_up(controllers)`: the quorum has a leader, and every voter's
  log end offset has reached the leader's high watermark (DescribeQuorum).
- `live_broker_ids(host, port)`: the unfenced brokers one broker's Metadata
  answer lists (its own image's view of the cluster).

Each returns a value or raises `ProbeFailed` with what it saw, so a waiting
caller can retry and, at its deadline, say why.
"""

from __future__ import annotations

import trio
from kio.schema.metadata.v12.request import MetadataRequest

from common.errors import RaftkaError
from common.security.client import ClientSecurity
from common.wire import open_connection
from common.wire.errors import ConnectionFailedError

PROBE_TIMEOUT_MS = 2000


class ProbeFailed(RaftkaError):
    """A readiness probe saw the cluster not ready yet; the message says how."""


async def quorum_caught_up(controllers: list[tuple[str, int]], voter_ids: set[int],
                           security: ClientSecurity | None = None) -> int:
    """The quorum's high watermark, once every voter's log has reached it."""
    from quorum.node.describe_quorum import describe_quorum_request, parse_describe_quorum

    last = "no controller answered"
    for host, port in controllers:
        try:
            with trio.fail_after(PROBE_TIMEOUT_MS / 1000):
                async with open_connection(host, port, connect_timeout_ms=PROBE_TIMEOUT_MS, security=security) as conn:
                    response = await conn.request(describe_quorum_request(2), timeout_ms=PROBE_TIMEOUT_MS)
        except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
            last = f"{host}:{port}: {exc or type(exc).__name__}"
            continue
        d = parse_describe_quorum(response)
        if d.error_code != 0 or d.leader_id < 0:
            last = f"{host}:{port} knows no leader yet (error code {d.error_code})"
            continue
        offsets = {replica_id: leo for replica_id, leo, _fetch, _caught_up in d.voters}
        behind = {v: offsets.get(v, -1) for v in voter_ids if offsets.get(v, -1) < d.high_watermark}
        if d.high_watermark < 0 or behind:
            raise ProbeFailed(f"voters behind the high watermark {d.high_watermark}: {behind}")
        return d.high_watermark
    raise ProbeFailed(last)


async def live_broker_ids(host: str, port: int, security: ClientSecurity | None = None) -> set[int]:
    """The broker ids `host:port`'s Metadata answer lists (unfenced brokers)."""
    try:
        with trio.fail_after(PROBE_TIMEOUT_MS / 1000):
            async with open_connection(host, port, connect_timeout_ms=PROBE_TIMEOUT_MS, security=security) as conn:
                response = await conn.request(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                              include_topic_authorized_operations=False),
                                              timeout_ms=PROBE_TIMEOUT_MS)
    except (ConnectionFailedError, OSError, trio.TooSlowError) as exc:
        raise ProbeFailed(f"broker {host}:{port}: {exc or type(exc).__name__}") from None
    return {int(b.node_id) for b in response.brokers}
