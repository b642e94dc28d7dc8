"""Real Kafka clients negotiate ApiVersions with our server, including the
KIP-511 fallback when they ask with a version we do not serve."""

import trio
from confluent_kafka import Producer
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector

from common.wire import SupportedApis


class RecordingApis(SupportedApis):
    """Real SupportedApis that also remembers which ApiVersions it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: list[tuple[int, bool]] = []

    def api_versions_response(self, request):
        self.answered.append((request.header.api_version, request.body is not None))
        return super().api_versions_response(request)


async def no_handler(ctx, request):
    raise AssertionError(f"only ApiVersions expected, got {request.header}")


def kafka_python_api_versions(port: int) -> dict:
    """kafka-python's own connection start-up (ApiVersions), as a user's client does it."""
    net = NetworkSelector()
    manager = KafkaConnectionManager(net, bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=10000)
    node_id = manager.cluster.bootstrap_brokers()[0].node_id

    async def connect():
        conn = manager.get_connection(node_id, timeout_ms=10000)
        await conn
        return conn.broker_version_data.api_versions

    try:
        return net.run(connect)
    finally:
        manager.close()
        net.close()


async def test_kafka_python_reads_our_api_versions(start_server):
    apis = RecordingApis().declare(52, 0, 0).declare(63, 0, 0)
    server = await start_server(no_handler, apis)
    versions = await trio.to_thread.run_sync(kafka_python_api_versions, server.port)
    assert versions == {18: (0, 4), 52: (0, 0), 63: (0, 0)}
    assert apis.answered == [(4, True)]


async def test_kafka_python_falls_back_when_its_api_versions_is_too_new(start_server):
    apis = RecordingApis().declare(18, 0, 2).declare(52, 0, 0)
    server = await start_server(no_handler, apis)
    versions = await trio.to_thread.run_sync(kafka_python_api_versions, server.port)
    assert versions == {18: (0, 2), 52: (0, 0)}
    # v4 got the v0 UNSUPPORTED_VERSION answer listing 0..2; it retried with v2.
    assert apis.answered == [(4, False), (2, True)]
    assert server.stats.connections_accepted == 1


async def test_librdkafka_falls_back_when_its_api_versions_is_too_new(start_server):
    apis = RecordingApis().declare(18, 0, 2).declare(52, 0, 0)
    server = await start_server(no_handler, apis)
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{server.port}", "log_level": 0})
    try:
        with trio.fail_after(20):
            while len(apis.answered) < 2:
                await trio.sleep(0.01)
    finally:
        await trio.to_thread.run_sync(producer.flush, 1)
        del producer
    # librdkafka speaks ApiVersions v3 and v0: it retried on the same connection with v0.
    assert apis.answered[:2] == [(3, False), (0, True)]
    assert server.stats.connections_closed_malformed == 0
