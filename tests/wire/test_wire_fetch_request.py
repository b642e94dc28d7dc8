"""The hand encoder of a follower's Fetch v12 request writes exactly what
kio writes for the same request, and a broker reads it back as that request."""

import datetime
import io

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.fetch.v12 import request as fr
from kio.serial import entity_writer

from common.wire import SupportedApis, decode_request, encode_request
from common.wire.fetch_request import FETCH_KEY, VERSION, encode_fetch_v12

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
#: Names longer than 126 bytes need a two-byte length varint.
NAMES = st.text(max_size=12) | st.text(min_size=100, max_size=200)

POSITIONS = st.tuples(INT32, INT32, INT64, INT32, INT64, INT32)
TOPICS = st.lists(st.tuples(NAMES, st.lists(POSITIONS, max_size=4)), max_size=4)
FORGOTTEN = st.lists(st.tuples(NAMES, st.lists(INT32, max_size=4)), max_size=3)


def kio_request(head: dict, topics, forgotten, rack_id: str) -> fr.FetchRequest:
    return fr.FetchRequest(
        replica_id=head["replica_id"], max_wait=datetime.timedelta(milliseconds=head["max_wait_ms"]),
        min_bytes=head["min_bytes"], max_bytes=head["max_bytes"], isolation_level=head["isolation_level"],
        session_id=head["session_id"], session_epoch=head["session_epoch"],
        topics=tuple(fr.FetchTopic(topic=name, partitions=tuple(
            fr.FetchPartition(partition=p, current_leader_epoch=cle, fetch_offset=fo, last_fetched_epoch=lfe,
                              log_start_offset=lso, partition_max_bytes=pmb)
            for p, cle, fo, lfe, lso, pmb in positions)) for name, positions in topics),
        forgotten_topics_data=tuple(fr.ForgottenTopic(topic=name, partitions=tuple(ps)) for name, ps in forgotten),
        rack_id=rack_id)


HEADS = st.fixed_dictionaries({
    "replica_id": INT32, "max_wait_ms": st.integers(0, 2**31 - 1), "min_bytes": INT32, "max_bytes": INT32,
    "isolation_level": st.sampled_from([0, 1]), "session_id": INT32, "session_epoch": INT32,
})


@settings(max_examples=200)
@given(head=HEADS, topics=TOPICS, forgotten=FORGOTTEN, rack_id=NAMES)
def test_the_hand_encoded_body_is_kios_byte_for_byte(head, topics, forgotten, rack_id):
    ours = encode_fetch_v12(**head, topics=topics, forgotten=forgotten, rack_id=rack_id)
    assert (ours.__api_key__, ours.__version__) == (FETCH_KEY, VERSION)
    theirs = io.BytesIO()
    entity_writer(fr.FetchRequest)(theirs, kio_request(head, topics, forgotten, rack_id))
    assert ours.body == theirs.getvalue()


@settings(max_examples=50)
@given(head=HEADS, topics=TOPICS, forgotten=FORGOTTEN)
def test_a_framed_hand_encoded_request_decodes_as_the_same_request(head, topics, forgotten):
    frame = encode_request(7, "follower-2", encode_fetch_v12(**head, topics=topics, forgotten=forgotten))
    request = decode_request(memoryview(frame)[4:], SupportedApis().declare(FETCH_KEY, VERSION, VERSION).supports)
    assert (request.header.api_key, request.header.api_version, request.header.correlation_id) == (1, 12, 7)
    assert request.header.client_id == "follower-2"
    assert request.body == kio_request(head, topics, forgotten, "")
