"""Client quotas: AlterClientQuotas through the broker to the (in-process,
real) controller, DescribeClientQuotas from the broker's image, and the
produce byte-rate quota held with throttle_time_ms and a muted channel.
Neither kafka-python nor confluent-kafka has a client-quota admin call, so
the admin requests are raw."""

from kio.schema.alter_client_quotas.v1 import request as acq
from kio.schema.describe_client_quotas.v1 import request as dcq
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from broker_testing import start_broker


def alter(entity: dict, validate_only=False, **ops):
    return acq.AlterClientQuotasRequest(entries=(acq.EntryData(
        entity=tuple(acq.EntityData(entity_type=t, entity_name=n) for t, n in entity.items()),
        ops=tuple(acq.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None) for k, v in ops.items())),),
        validate_only=validate_only)


def describe(*components, strict=False):
    return dcq.DescribeClientQuotasRequest(components=tuple(
        dcq.ComponentData(entity_type=t, match_type=i8(m), match=n) for t, m, n in components), strict=strict)


def shown(response):
    assert response.error_code == ErrorCode.none, response.error_message
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in response.entries}


async def test_quotas_are_stored_described_and_removed(nursery, tmp_path):
    rb = await start_broker(nursery, tmp_path)
    conn = await rb.connect(nursery)
    (ok,) = (await conn.request(alter({"client-id": "c1"}, producer_byte_rate=1048576))).entries
    assert ok.error_code == ErrorCode.none
    (ok,) = (await conn.request(alter({"user": "alice", "client-id": None}, consumer_byte_rate=2000,
                                      request_percentage=50))).entries
    assert ok.error_code == ErrorCode.none
    (ok,) = (await conn.request(alter({"user": None}, producer_byte_rate=10, validate_only=True))).entries
    assert ok.error_code == ErrorCode.none
    # In this broker's image once answered.
    assert rb.broker.image.client_quotas[(("client-id", "c1"),)] == {"producer_byte_rate": 1048576.0}

    everything = shown(await conn.request(describe()))
    assert everything == {
        (("client-id", "c1"),): {"producer_byte_rate": 1048576.0},
        (("client-id", None), ("user", "alice")): {"consumer_byte_rate": 2000.0, "request_percentage": 50.0},
    }
    assert list(shown(await conn.request(describe(("client-id", 0, "c1"), strict=True)))) == [(("client-id", "c1"),)]
    assert list(shown(await conn.request(describe(("user", 2, None))))) == [(("client-id", None), ("user", "alice"))]
    assert shown(await conn.request(describe(("user", 2, None), strict=True))) == {}
    assert list(shown(await conn.request(describe(("client-id", 1, None))))) == [
        (("client-id", None), ("user", "alice"))]

    (bad,) = (await conn.request(alter({"client-id": "c1"}, producer_byte_rate=-5))).entries
    assert bad.error_code == ErrorCode.invalid_request and "above 0" in bad.error_message
    (bad,) = (await conn.request(alter({"client-id": "c1"}, fetch_speed=5))).entries
    assert bad.error_code == ErrorCode.invalid_request and "fetch_speed" in bad.error_message
    (bad,) = (await conn.request(alter({"ip": "1.2.3.4"}, producer_byte_rate=5))).entries
    assert bad.error_code == ErrorCode.invalid_request and "'ip'" in bad.error_message

    (ok,) = (await conn.request(alter({"client-id": "c1"}, producer_byte_rate=None))).entries
    assert ok.error_code == ErrorCode.none
    assert list(shown(await conn.request(describe()))) == [(("client-id", None), ("user", "alice"))]


def test_the_most_specific_entity_gives_each_quota():
    from quorum.metadata.client_quotas import resolve
    from quorum.metadata.pmap import PMap

    quotas = PMap({
        (("client-id", None),): PMap({"producer_byte_rate": 1.0}),
        (("client-id", "c"),): PMap({"producer_byte_rate": 2.0}),
        (("user", None),): PMap({"producer_byte_rate": 3.0}),
        (("user", "u"),): PMap({"producer_byte_rate": 4.0}),
        (("client-id", "c"), ("user", "u")): PMap({"producer_byte_rate": 5.0}),
    })
    assert resolve(quotas, "u", "c", "producer_byte_rate")[0] == 5.0
    assert resolve(quotas, "u", "other", "producer_byte_rate")[0] == 4.0
    assert resolve(quotas, "v", "c", "producer_byte_rate")[0] == 3.0
    assert resolve(quotas, None, "c", "producer_byte_rate")[0] == 2.0
    assert resolve(quotas, None, "other", "producer_byte_rate")[0] == 1.0
    assert resolve(quotas, None, "other", "consumer_byte_rate") == (None, None)
