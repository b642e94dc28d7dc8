"""The length walk in front of kio (`common.wire.length_check`): it must
pass every whole body a peer can send, and refuse every body cut short,
whatever the schema's shape -- flexible or not, arrays of fixed-size
entries (skipped in one step) or of structs with lengths inside."""

import io

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kio.schema.create_topics.v7 import request as create_topics_v7
from kio.schema.join_group.v5 import request as join_group_v5
from kio.schema.list_offsets.v1 import request as list_offsets_v1
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.offset_for_leader_epoch.v4 import response as offset_for_leader_epoch_v4
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from common.wire import RemoteProtocolError
from common.wire.length_check import check_lengths

SCHEMAS = [
    metadata_v12.MetadataResponse,  # flexible; arrays of int32 ids
    create_topics_v7.CreateTopicsRequest,  # flexible; nested structs with strings
    list_offsets_v1.ListOffsetsRequest,  # not flexible; an array of fixed-size structs
    join_group_v5.JoinGroupRequest,  # not flexible; bytes and strings
    offset_for_leader_epoch_v4.OffsetForLeaderEpochResponse,  # flexible; fixed-size fields in a run
]


def _encoded(entity) -> memoryview:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return memoryview(buf.getvalue())


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: f"{s.__module__.split('.')[-3]}.{s.__name__}")
# No shrinking: a failure shows the unshrunk example at once (shrinking these nested
# entities can take minutes).
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_every_whole_body_passes_and_every_cut_one_is_refused(schema, data):
    body = _encoded(data.draw(st.from_type(schema)))
    check_lengths(schema, body, 0)
    cut = data.draw(st.integers(min_value=0, max_value=body.nbytes - 1))
    with pytest.raises(Exception):  # noqa: B017 -- the decoders turn any exception into a protocol error
        check_lengths(schema, body[:cut], 0)


def test_an_id_array_claiming_more_entries_than_the_frame_holds_is_refused_naming_it():
    partition = metadata_v12.MetadataResponsePartition(
        error_code=ErrorCode.none, partition_index=0, leader_id=1, leader_epoch=0,
        replica_nodes=(1, 2, 3), isr_nodes=(1, 2, 3), offline_replicas=())
    body = bytes(_encoded(partition))
    # replica_nodes starts after 14 bytes of fixed fields: compact count 4 (3 entries) -> 10 entries,
    # fewer than the bytes left (so each could take one) but more than they hold at 4 bytes each
    assert body[14] == 4 and len(body) - 15 < 40
    claimed = memoryview(body[:14] + bytes([11]) + body[15:])
    with pytest.raises(RemoteProtocolError, match=r"replica_nodes: 10 entries of 4 bytes run past the end of the frame"):
        check_lengths(metadata_v12.MetadataResponsePartition, claimed, 0)
